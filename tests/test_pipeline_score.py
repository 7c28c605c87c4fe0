"""BLEU scoring and report rendering (pure functions, real sacrebleu/sacremoses)."""

import math

import pytest

from fairseq_tfixup.pipeline import config, report, score

GEN = """S-1\tein test .
T-1\tit &apos;s a well @-@ known test .
H-1\t-0.5\tit &apos;s a well @-@ known test .
D-1\t-0.5\tit &apos;s a well @-@ known test .
S-0\thallo welt
T-0\thello world
H-0\t-0.2\thello there world
"""


def test_read_generate_output_orders_by_sentence_id():
    hyps, refs, ids = score.read_generate_output(GEN)
    assert ids == [0, 1] and hyps[0] == "hello there world" and refs[1].startswith("it &apos;s")


def test_compound_split_matches_fairseqs_perl_rule():
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert score.compound_split("a-b-c x--y e-mail-") == "a ##AT##-##AT## b-c x ##AT##-##AT## -y e ##AT##-##AT## mail-"
    assert score.compound_split("well @-@ known") == "well @ ##AT##-##AT## @ known"


def test_scores_with_raw_references_and_signature():
    raw = ["Hello world", "It's a well-known test."]
    res = score.score_generate_output(GEN, "en", split_compounds=True, lowercase=False, raw_refs=raw)
    assert res["sentences"] == 2 and res["detok_reference"] == "raw test set text"
    # sentence 1 is exact after detokenization (@-@ and &apos; undone), sentence 0 is not
    assert 0 < res["bleu_detok"] < 100 and 0 < res["bleu_tok"] < 100
    assert res["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert score.detokenize(["it &apos;s a well @-@ known test ."], "en") == ["it's a well-known test."]
    perfect = score.score_generate_output(GEN.replace("hello there world", "hello world"), "en",
                                          split_compounds=False, lowercase=True, raw_refs=raw)
    assert perfect["bleu_tok"] == pytest.approx(100) and perfect["bleu_detok"] == pytest.approx(100)


def test_generate_output_without_hypotheses_is_an_error():
    with pytest.raises(ValueError):
        score.read_generate_output("S-0\tx\nT-0\ty\n")


def test_config_parser_reads_bash_values(tmp_path):
    text = 'A=1\nB="two words"\n# comment\nC=\nD="(0.9,0.98)"  # trailing\n'
    assert config.parse_config(text) == {"A": "1", "B": "two words", "C": "", "D": "(0.9,0.98)"}
    with pytest.raises(ValueError):
        config.parse_config("A=$HOME\n")
    cfg = config.load_config("iwslt14_de_en_tfixup", environ={"BEAM": "7"})
    assert cfg["BEAM"] == "7" and cfg["LENPEN"] == "0.3" and cfg["PAPER_BLEU"] == "35.5"


def test_report_row_for_missing_and_present_results(tmp_path):
    missing = report.report_row("wmt17_en_de_base_tfixup", None)
    assert missing["ours"] is None and missing["paper_bleu"] == 29.1
    res = {"experiment": "wmt17_en_de_base_tfixup", "paper_metric": "tok", "bleu_tok": 28.64, "bleu_detok": 27.9,
           "num_updates": 500000, "device_hours": 123.4, "device": "V100", "sacrebleu_signature": "sig", "sentences": 3003}
    path = tmp_path / "r.json"
    report.write_json_atomic(res, str(path))
    md = report.build_report(["wmt17_en_de_base_tfixup", "wmt17_en_de_big_tfixup"], [str(path)], "T")
    lines = md.splitlines()
    assert "| 29.1 | 28.64 | -0.46 |" in lines[4] and "123.400 (V100)" in lines[4]
    assert "not run" in lines[5]
    assert not math.isnan(report.paper_comparable_bleu(res))


def test_partial_test_set_is_refused():
    """A generate output that lost sentences (e.g. to fairseq's batching) must not give a BLEU."""
    with pytest.raises(ValueError, match="2 of the 3 test sentences"):
        score.score_generate_output(GEN, "en", split_compounds=False, lowercase=False, raw_refs=["a", "b", "c"])
