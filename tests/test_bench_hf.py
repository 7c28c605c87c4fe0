"""harness/bench/hf.py, the HuggingFace study: its whole path on CPU at the smoke size (export of a fairseq
data-bin, every run, records, report, figure, CPU estimate), a failing run, and the batching and schedules
it shares with fairseq."""

import gzip
import json

import pytest

pytest.importorskip("transformers")

from harness import docs  # noqa: E402
from harness.bench import hf  # noqa: E402


def _lines(shared, name: str, n: int) -> list:
    with gzip.open(shared / "multi30k" / name, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


@pytest.fixture(scope="module")
def exported(shared_data, tmp_path_factory):
    """A fairseq data-bin of the first lines of the real Multi30k (lowercased words, no BPE), written with
    fairseq's own Dictionary and binarizer, then exported by ``export``."""
    from fairseq.data import Dictionary, indexed_dataset

    root = tmp_path_factory.mktemp("hf")
    data_bin = root / "bin"
    data_bin.mkdir()
    splits = {"train": ("train", 80), "valid": ("val", 20), "test": ("test_2016_flickr", 6)}
    text = {(s, lang): [line.lower() for line in _lines(shared_data, f"{name}.{lang}.gz", n)]
            for s, (name, n) in splits.items() for lang in ("de", "en")}
    for lang in ("de", "en"):
        d = Dictionary()
        for line in text["train", lang]:
            d.encode_line(line, add_if_not_exist=True)
        d.finalize(padding_factor=8)
        d.save(str(data_bin / f"dict.{lang}.txt"))
        for s in splits:
            prefix = data_bin / f"{s}.de-en.{lang}"
            builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(d))
            for line in text[s, lang]:
                builder.add_item(d.encode_line(line, add_if_not_exist=False))
            builder.finalize(f"{prefix}.idx")
    raw = _lines(shared_data, "test_2016_flickr.en.gz", 6)
    (data_bin / "test.raw.en").write_text("".join(line + "\n" for line in raw), encoding="utf-8")
    out = hf.export(data_bin, root / "hf-data")
    return out, text


def test_export_keeps_fairseqs_ids_and_text(exported):
    data, text = exported
    meta = json.loads((data / "meta.json").read_text())
    assert meta["sentences"] == {"train": 80, "valid": 20, "test": 6}
    vocab = hf.read_vocab(data, "en")
    sents = hf.read_split(data, "train", "en")
    assert len(sents) == 80 and all(s[-1] == hf.EOS for s in sents)
    assert hf.to_text(sents[0], vocab) == " ".join(text["train", "en"][0].split())
    assert vocab[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert not list(data.parent.glob("hf-data.tmp.*"))  # moved into place, nothing left half-written


def test_smoke_study_records_every_run_and_writes_the_report(exported, tmp_path, monkeypatch, capsys):
    data, _ = exported
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    # README's "beyond" block before any run: each family says it has none
    assert docs.block_beyond(tmp_path, tmp_path).count("no run recorded yet") == len(hf.FAMILIES)
    out = tmp_path / "bench"  # the layout of results/bench, for the block below
    assert hf.main(["--smoke", "--out", str(out), "--data", str(data), "--in-process"]) == 0
    runs = {p.stem: json.loads(p.read_text()) for p in (out / "hf" / "runs").glob("*.json")}
    assert sorted(runs) == sorted(hf.run_id(s) for s in hf.make_specs(hf.make_config("smoke")))
    for rid, rec in runs.items():
        assert rec["status"] == "ok", (rid, rec.get("error_tail"))
        assert rec["command"].startswith("python -m harness.bench.") and rec["config"]["family"] == rec["family"]
        assert "-m harness.bench.hf one --spec" in rec["run_command"]
        assert rec["machine"]["device"] == "cpu" and rec["machine"]["date_utc"] and "Multi30k" in rec["data"]
        assert rec["valid_curve"] and rec["updates"] == (3 if rec["family"] == "marian" else 4)
        if rec["arm"] in ("tfixup_mlpnorm", "tfixup_headnorm"):  # the controls: the norms they keep, no other
            kept = rec["config"]["layers"] if rec["arm"] == "tfixup_mlpnorm" else 1
            assert rec["norm_modules"] == kept and rec["tfixup_scaled"]
        elif rec["arm"].startswith("tfixup"):  # every normalisation module gone, the weights T-Fixup scales reported
            assert rec["norm_modules"] == 0 and rec["tfixup_scaled"]
        else:
            assert rec["norm_modules"] == rec["norm_modules_stock"] > 0 and "tfixup_scaled" not in rec
    assert runs["marian-L1-tfixup_fsqk-s1"]["qk_redrawn"] == 3  # encoder self, decoder self and cross attention
    assert runs["llama-L2-tfixup_nogate-s1"]["ungated"] == 2 and "ungated" not in runs["llama-L2-tfixup-s1"]
    marian = runs["marian-L1-tfixup-s1"]["test"]
    assert len(marian["hypotheses"]) == marian["sentences"] == 4 and marian["bleu_tok"] >= 0
    assert marian["sacrebleu_signature"].startswith("nrefs:1|case:lc")
    res = json.loads((out / "hf.json").read_text())
    assert res["complete"] and res["runs_recorded"] == len(runs) and not res["failed"]
    assert all(r["largest_rise"] >= 0 and r["best_ppl"] > 1 for r in res["rows"])
    md = (out / "hf.md").read_text()
    assert "## Translation: Marian" in md and "## Masked language model: BERT" in md and "PARTIAL" not in md
    assert (out / "hf.png").stat().st_size > 0
    # README's "beyond" block: one measured line per family, from the report
    block = docs.block_beyond(tmp_path, tmp_path).splitlines()
    assert [line.split("**")[1] for line in block] == list(hf.FAMILIES.values())
    assert all("T-Fixup, no warmup: " in line and "stock + matched warmup: " in line for line in block), block
    assert "BLEU" in block[0] and "fairseq plugin" not in block[0]  # smoke mode: no fairseq reference
    assert "PARTIAL" not in "".join(block) and "no run recorded" not in "".join(block)
    # a second start runs nothing; --only names the study's runs
    before = {rid: (out / "hf" / "runs" / f"{rid}.json").stat().st_mtime_ns for rid in runs}
    capsys.readouterr()
    assert hf.main(["--smoke", "--out", str(out), "--data", str(data), "--in-process"]) == 0
    assert before == {rid: (out / "hf" / "runs" / f"{rid}.json").stat().st_mtime_ns for rid in runs}
    with pytest.raises(SystemExit, match="no run nope"):
        hf.main(["--smoke", "--out", str(out), "--data", str(data), "--only", "nope"])


def test_smoke_estimate_prints_cpu_time(exported, capsys):
    data, _ = exported
    assert hf.main(["--smoke", "--estimate", "--data", str(data)]) == 0
    text = capsys.readouterr().out
    assert "marian-L1-tfixup-s1" in text and "CPU hours" in text


def test_a_failing_run_leaves_its_error_not_a_record(exported, tmp_path):
    data, _ = exported
    spec = {**hf.make_specs(hf.make_config("smoke"))[0], "family": "nope"}
    run = hf.runlib.Run("nope-run", {"family": "nope"}, [json.dumps(spec)], str(data))
    failed = tmp_path / "failed"
    failed.mkdir()
    rec = hf.execute(run, tmp_path / "work", failed, "cpu", 1)  # in its own process, as the study runs it
    assert rec["status"] == "error" and rec["returncode"] != 0
    assert "unknown model family 'nope'" in " ".join(rec["error_tail"])
    assert json.loads((failed / "nope-run.json").read_text())["status"] == "error"


def test_batches_are_fairseqs_and_schedules_the_projects(exported):
    """fairseq's batching (at most max_tokens = longest side x sentences, every sentence once) and the two
    curves of tfixup/schedules.py: matched = the no-warmup curve from update W on."""
    data, _ = exported
    src, tgt = hf.read_split(data, "train", "de"), hf.read_split(data, "train", "en")
    batches = hf.translation_batches(src, tgt, 200, 1, 1)
    assert sorted(i for b in batches for i in b) == list(range(80))
    assert all(max(max(len(src[i]), len(tgt[i])) for i in b) * len(b) <= 200 for b in batches)
    tr = hf.Trainer.__new__(hf.Trainer)
    tr.spec = {"arm": "stock_matched", "lr": 1e-3, "warmup": 100}
    assert tr.lr_at(0) == pytest.approx(1e-7) and tr.lr_at(50) < tr.lr_at(100)
    tr_t = hf.Trainer.__new__(hf.Trainer)
    tr_t.spec = {"arm": "tfixup", "lr": 1e-3, "warmup": 100}
    assert tr_t.lr_at(0) == 1e-3 and tr.lr_at(100) == tr_t.lr_at(100) == pytest.approx(1e-3 * (4000 / 4100) ** 0.5)


def test_default_plan_is_the_studys_35_runs():
    """Marian's three arms (the fairseq-q/k control on Marian only), GPT-2 and Llama at 24 layers (two seeds)
    and 6 (the first seed of each with the input-multiplier control, T-Fixup without it; every Llama seed with
    its two gated-MLP controls), BERT at 6 (with its head's-norm control): the longest first. Every T-Fixup run of a family without an embedding
    multiplier says whether apply_tfixup gave it one."""
    specs = hf.make_specs(hf.make_config("default"))
    ids = [hf.run_id(s) for s in specs]
    assert len(ids) == len(set(ids)) == 35
    assert [i for i in ids if "mlpnorm" in i or "nogate" in i] == [
        "llama-L24-tfixup_mlpnorm-s1", "llama-L24-tfixup_nogate-s1", "llama-L24-tfixup_mlpnorm-s2",
        "llama-L24-tfixup_nogate-s2", "llama-L6-tfixup_mlpnorm-s1", "llama-L6-tfixup_nogate-s1"]
    assert ids[:3] == ["marian-L6-tfixup-s1", "marian-L6-stock_matched-s1", "marian-L6-tfixup_fsqk-s1"]
    assert [i for i in ids if "fsqk" in i] == ["marian-L6-tfixup_fsqk-s1"]
    assert [i for i in ids if "noscale" in i] == ["gpt2-L24-tfixup_noscale-s1", "llama-L24-tfixup_noscale-s1",
                                                  "gpt2-L6-tfixup_noscale-s1", "llama-L6-tfixup_noscale-s1"]
    assert sum("-L24-" in i for i in ids) == 18 and ids[-2:] == ["bert-L6-stock-s1", "bert-L6-tfixup_headnorm-s1"]
    for s in specs:
        assert ("input_scale" in s) == (s["family"] != "marian" and s["arm"].startswith("tfixup"))
        assert s.get("input_scale", True) == (s["arm"] != "tfixup_noscale")


def test_trace_records_each_blocks_stream_and_branches_per_update(exported, tmp_path):
    """harness/hf_trace.py: the study's runs (here its smoke Llama), every block's stream and branch RMS on each
    update's batch; the report and figure written; an arm the study lacks named with the runs it has."""
    from harness import hf_trace

    data, _ = exported
    res = hf_trace.main(["--smoke", "--out", str(tmp_path), "--data", str(data), "--layers", "2", "--updates", "3",
                         "--arms", "tfixup,tfixup_nogate,tfixup_mlpnorm"])
    assert [r["id"] for r in res["arms"]] == ["llama-L2-tfixup-s1", "llama-L2-tfixup_nogate-s1",
                                              "llama-L2-tfixup_mlpnorm-s1"]
    assert [r["norm_modules"] for r in res["arms"]] == [0, 0, 2]
    for r in res["arms"]:
        assert r["status"] == "ok" and [s["update"] for s in r["steps"]] == [1, 2, 3]
        assert all(len(s[k]) == 2 and all(v > 0 for v in s[k]) for s in r["steps"] for k in ("stream", "attention", "mlp"))
    md = (tmp_path / "hf_trace.md").read_text()
    assert "`python -m harness.hf_trace --smoke" in md and md.count("| 3 |") == 3 and "hf_trace.png" in md
    assert (tmp_path / "hf_trace.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no run llama-L2-stock-s1; its causal LM runs: gpt2-L2-tfixup-s1"):
        hf_trace.main(["--smoke", "--out", str(tmp_path), "--data", str(data), "--layers", "2", "--arms", "stock"])
