"""BLEU scoring and report rendering (pure functions, real sacrebleu/sacremoses)."""


import pytest

from tfixup import atomic
from harness import report, score

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


def test_report_row_for_missing_and_present_results(tmp_path):
    missing = report.report_row("wmt17_en_de_base_tfixup", None)
    assert missing["ours"] is None and missing["paper_bleu"] == 29.1
    from harness import config

    # the row's paper side comes from the config the run recorded in results.json
    cfg = config.resolve("wmt17_en_de_base_tfixup", {"ROW": "as it ran"}, environ={}).values
    res = {"experiment": "wmt17_en_de_base_tfixup", "paper_metric": "tok", "bleu_tok": 28.64, "bleu_detok": 27.9,
           "num_updates": 500000, "device_hours": 123.4, "device": "V100", "sacrebleu_signature": "sig",
           "sentences": 3003, "config": cfg}
    path = tmp_path / "r.json"
    atomic.write_json(path, res)
    md = report.build_report(["wmt17_en_de_base_tfixup", "wmt17_en_de_big_tfixup"], [str(path)], "T")
    lines = md.splitlines()
    assert "| Table 1/2: as it ran | 29.1 | 28.64 | -0.46 |" in lines[4] and "123.400 (V100)" in lines[4]
    assert "not run" in lines[5]
    # the metric the paper used picks which of our two scores is compared
    assert report.paper_comparable_bleu(res) == 28.64
    assert report.paper_comparable_bleu({**res, "paper_metric": "detok"}) == 27.9


def test_report_names_and_skips_a_bad_results_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    md = report.build_report(["wmt17_en_de_base_tfixup"], [str(bad)], "T")
    assert "not run" in md.splitlines()[4]
    assert f"skipping {bad}" in capsys.readouterr().err


def test_one_bad_field_skips_its_file_and_the_table_is_still_written(tmp_path, capsys):
    """One results.json with a field of the wrong kind stopped the whole report."""
    from harness import config

    cfg = config.resolve("wmt17_en_de_base_tfixup", environ={}).values
    good = {"experiment": "wmt17_en_de_base_tfixup", "paper_metric": "tok", "bleu_tok": 28.6, "bleu_detok": 27.9,
            "num_updates": 10, "device_hours": 1.5, "device": "cpu", "sacrebleu_signature": "s", "config": cfg}
    atomic.write_json(tmp_path / "good.json", good)
    for field, value in (("device_hours", "1.5h"), ("bleu_tok", "x"), ("config", {**cfg, "PAPER_BLEU": "n/a"})):
        atomic.write_json(tmp_path / "bad.json", {**good, "experiment": "wmt17_en_de_big_tfixup", field: value})
        md = report.build_report(["wmt17_en_de_base_tfixup", "wmt17_en_de_big_tfixup"],
                                 [str(tmp_path / "good.json"), str(tmp_path / "bad.json")], "T")
        lines = md.splitlines()
        assert "| 28.60 |" in lines[4] and "not run" in lines[5]
        err = capsys.readouterr().err
        assert f"skipping {tmp_path / 'bad.json'}" in err and f"field {field}" in err, err


def test_partial_test_set_is_refused():
    """A generate output that lost sentences (e.g. to fairseq's batching) must not give a BLEU."""
    with pytest.raises(ValueError, match="2 of the 3 test sentences"):
        score.score_generate_output(GEN, "en", split_compounds=False, lowercase=False, raw_refs=["a", "b", "c"])
