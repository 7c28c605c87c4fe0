"""harness/bench/hf.py, the HuggingFace study: its whole path on CPU at the smoke size (export of a fairseq
data-bin, every run, records, report, figure, CPU estimate), a failing run, and the batching and schedules
it shares with fairseq."""

import gzip
import json

import pytest

pytest.importorskip("transformers")

from harness import docs  # noqa: E402
from harness.bench import hf, hf_train  # noqa: E402


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
    vocab = hf_train.read_vocab(data, "en")
    sents = hf_train.read_split(data, "train", "en")
    assert len(sents) == 80 and all(s[-1] == hf_train.EOS for s in sents)
    assert hf_train.to_text(sents[0], vocab) == " ".join(text["train", "en"][0].split())
    assert vocab[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert not list(data.parent.glob("hf-data.tmp.*"))  # moved into place, nothing left half-written


def _first_arms_only(monkeypatch):
    """The smoke study with the arms it had before the lr axis (the later arms: test_each_new_arm_builds_and_steps),
    so that the whole-study test stays fast."""
    monkeypatch.setitem(hf.MODES["smoke"]["marian"], "arms", ["tfixup", hf.BASELINE, "tfixup_fsqk"])
    for key in ("new_arms", "lr_grid", "deeper"):
        monkeypatch.delitem(hf.MODES["smoke"]["lm"], key)


def test_smoke_study_records_every_run_and_writes_the_report(exported, tmp_path, monkeypatch, capsys):
    data, _ = exported
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    _first_arms_only(monkeypatch)
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
    rec = hf_train.execute(run, tmp_path / "work", failed, "cpu", 1)  # in its own process, as the study runs it
    assert rec["status"] == "error" and rec["returncode"] != 0
    assert "unknown model family 'nope'" in " ".join(rec["error_tail"])
    assert json.loads((failed / "nope-run.json").read_text())["status"] == "error"


def test_batches_are_fairseqs_and_schedules_the_projects(exported):
    """fairseq's batching (at most max_tokens = longest side x sentences, every sentence once) and the two
    curves of tfixup/schedules.py: matched = the no-warmup curve from update W on."""
    data, _ = exported
    src, tgt = hf_train.read_split(data, "train", "de"), hf_train.read_split(data, "train", "en")
    batches = hf_train.translation_batches(src, tgt, 200, 1, 1)
    assert sorted(i for b in batches for i in b) == list(range(80))
    assert all(max(max(len(src[i]), len(tgt[i])) for i in b) * len(b) <= 200 for b in batches)
    spec = {"lr": 1e-3, "warmup": 100}

    def matched(t):
        return hf_train.lr_at(spec, hf.ARMS["stock_matched"].schedule, t)

    def tfixup(t):
        return hf_train.lr_at(spec, hf.ARMS["tfixup"].schedule, t)

    assert matched(0) == pytest.approx(1e-7) and matched(50) < matched(100)
    assert tfixup(0) == 1e-3 and matched(100) == tfixup(100) == pytest.approx(1e-3 * (4000 / 4100) ** 0.5)


FIRST_35 = {  # the study's runs before the lr axis: their ids (and specs, tests/test_bench_plans.py) unchanged
    "marian-L6-tfixup-s1", "marian-L6-stock_matched-s1", "marian-L6-tfixup_fsqk-s1", "bert-L6-tfixup-s1",
    "bert-L6-stock_matched-s1", "bert-L6-stock-s1", "bert-L6-tfixup_headnorm-s1",
    *(f"{f}-L{d}-{a}-s1" for f in ("gpt2", "llama") for d in (6, 24)
      for a in ("tfixup", "stock_matched", "stock", "tfixup_noscale")),
    *(f"{f}-L24-{a}-s2" for f in ("gpt2", "llama") for a in ("tfixup", "stock_matched", "stock")),
    *(f"llama-L{d}-{a}-s{s}" for d, seeds in ((6, (1,)), (24, (1, 2))) for s in seeds
      for a in ("tfixup_mlpnorm", "tfixup_nogate"))}


def test_default_plan_keeps_the_first_35_runs_and_adds_the_llama_question():
    """The first 35 runs as they were (Marian's three arms, GPT-2 and Llama at 24 layers with two seeds and at 6,
    their controls, BERT); then Marian with fairseq's initialisation; Llama's new arms (DyT, Derf, GI-Adam, the
    norm-free candidates) at 6 and 24 layers; at 24 each method's lr grid from 5e-4, 1e-3, 2e-3 (ids name the lr
    off 1e-3); the candidates, plain T-Fixup, keep_mlp_norm and the warmup baseline at 48 layers, two seeds; the
    24-layer Llama without the input multiplier at its second seed. Every T-Fixup run of a family without an embedding multiplier says whether apply_tfixup gave it one."""
    specs = hf.make_specs(hf.make_config("default"))
    ids = [hf.run_id(s) for s in specs]
    assert len(ids) == len(set(ids)) == 35 + 1 + 2 * 6 + 16 + 12 + 1
    assert FIRST_35 <= set(ids) and {"marian-L6-stock_fsinit-s1", "llama-L24-tfixup_noscale-s2"} <= set(ids)
    new = ("dyt", "derf", "giadam", "tfixup_sigmoid", "tfixup_gatescale", "tfixup_giadam")
    assert {f"llama-L{d}-{a}-s1" for d in (6, 24) for a in new} <= set(ids)
    grid = [i for i in ids if "-lr" in i]
    assert grid == [f"llama-L24-{a}-lr{lr}-s1" for a in hf.LR_ARMS for lr in ("0.0005", "0.002")]
    assert {f"llama-L48-{a}-s{s}" for a in (*hf.NORM_FREE, "tfixup", "tfixup_mlpnorm", "stock_matched")
            for s in (1, 2)} <= set(ids)
    assert ids[0] == "marian-L6-tfixup-s1" and ids[4].startswith("llama-L48-") and ids[-1].startswith("llama-L24-")
    for s in specs:
        assert ("input_scale" in s) == (s["family"] != "marian" and s["arm"].startswith("tfixup"))
        assert s.get("input_scale", True) == (s["arm"] != "tfixup_noscale")
        assert s.get("lr_in_id", False) == (s["lr"] != 1e-3 and s["family"] != "marian" and s["family"] != "bert")
    by_id = dict(zip(ids, specs))
    assert by_id["llama-L24-dyt-s1"]["alpha0"] == {"attention": 0.8, "mlp": 0.2, "final": 0.2}
    assert by_id["llama-L24-derf-lr0.002-s1"]["alpha0"] == {"attention": 0.5, "mlp": 0.5, "final": 0.5}
    assert by_id["llama-L24-tfixup_sigmoid-s1"]["gated_mlp"] == "sigmoid"
    assert by_id["llama-L24-tfixup_giadam-s1"]["optimizer"] == by_id["llama-L24-giadam-s1"]["optimizer"] == "giadam"
    assert "optimizer" not in by_id["llama-L24-stock_matched-s1"] and "gated_mlp" not in by_id["llama-L24-tfixup-s1"]


def _record(bits, status="ok"):
    return {"status": status, "valid_curve": [[25, bits + 1], [50, bits]] if status == "ok" else []}


def test_the_lr_grid_grows_from_the_records_and_seeds_the_best_lr():
    """An arm's grid doubles while its best lr is the largest, halves while it is the smallest (or nothing
    trained), and once closed its second seed runs at the best lr; the runs at 1e-3 are the study's own."""
    cfg = hf.make_config("default")

    def plan(records):
        return [hf.run_id(s) for s in hf.make_specs(cfg, records) if s["arm"] == "dyt" and s["layers"] == 24]

    assert plan({}) == ["llama-L24-dyt-s1", "llama-L24-dyt-lr0.0005-s1", "llama-L24-dyt-lr0.002-s1"]
    recs = {"llama-L24-dyt-lr0.0005-s1": _record(6.0), "llama-L24-dyt-s1": _record(5.5),
            "llama-L24-dyt-lr0.002-s1": _record(5.2)}  # best at the top: 4e-3 next, no second seed yet
    assert plan(recs)[-1] == "llama-L24-dyt-lr0.004-s1" and not any(i.endswith("-s2") for i in plan(recs))
    recs["llama-L24-dyt-lr0.004-s1"] = _record(0, "nan")  # closed: the best is 2e-3, its second seed
    assert plan(recs)[-1] == "llama-L24-dyt-lr0.002-s2"
    nothing = {i: _record(0, "nan") for i in plan({})}  # nothing trained: the grid goes down
    assert "llama-L24-dyt-lr0.00025-s1" in plan(nothing)
    # a run that stays at the unigram level (best valid loss not below stuck_bits) has not trained either
    stuck = {i: _record(b) for i, b in zip(plan({}), (8.1, 8.2, 8.0))}  # 1e-3, 5e-4, 2e-3
    assert "llama-L24-dyt-lr0.00025-s1" in [hf.run_id(s) for s in hf.make_specs(cfg, stuck, stuck_bits=7.1)]
    assert "llama-L24-dyt-lr0.00025-s1" not in plan(stuck)  # without a level: the largest lr, 4e-3, next
    recs = {"llama-L24-stock_matched-lr0.0005-s1": _record(6.0), "llama-L24-stock_matched-s1": _record(5.0),
            "llama-L24-stock_matched-lr0.002-s1": _record(5.5)}
    base = [hf.run_id(s) for s in hf.make_specs(cfg, recs) if s["arm"] == "stock_matched" and s["layers"] == 24]
    assert base.count("llama-L24-stock_matched-s2") == 1  # the study's own second seed, at 1e-3, planned once


def test_each_new_arm_builds_and_steps(exported, tmp_path):
    """DyT, Derf, GI-Adam, the norm-free candidates and Marian with fairseq's initialisation, at the smoke size:
    each builds, trains its updates and says what was done to it."""
    import torch

    data, _ = exported
    specs = {hf.run_id(s): s for s in hf.make_specs(hf.make_config("smoke"))}
    for rid in ("llama-L2-dyt-s1", "llama-L2-derf-s1", "llama-L2-giadam-s1", "llama-L2-tfixup_sigmoid-s1",
                "llama-L2-tfixup_gatescale-s1", "llama-L2-tfixup_giadam-s1", "marian-L1-stock_fsinit-s1"):
        spec = specs[rid]
        model, made = hf_train.make_model(spec, data)
        if spec["arm"] in ("dyt", "derf"):
            assert made["pointwise_norms"] == made["norm_modules_stock"] == 5 and made["norm_modules"] == 0
            norm = model.model.layers[0].input_layernorm
            assert norm.alpha.item() == pytest.approx(spec["alpha0"]["attention"])
            assert model.model.norm.alpha.item() == pytest.approx(spec["alpha0"]["final"])
            assert (norm.shift is not None) == (spec["arm"] == "derf")
            assert model.model.embed_tokens.learned_scale.item() == pytest.approx(16 ** 0.5)
        if spec["arm"] == "tfixup_sigmoid":
            assert isinstance(model.model.layers[1].mlp.act_fn, torch.nn.Sigmoid)
            assert model.config.hidden_act == "sigmoid" and made["norm_modules"] == 0
        if spec["arm"] == "tfixup_gatescale":
            assert model.model.layers[0].mlp.tfixup_output_scale == 0.5  # 1/N, N = 2
        if spec["arm"] == "stock_fsinit":
            emb = model.model.encoder.embed_tokens.weight
            assert made["fairseq_init_attentions"] == 3 and emb[hf_train.PAD].abs().sum() == 0
            assert emb.std().item() == pytest.approx(16 ** -0.5, rel=0.1)
            assert model.model.encoder.layers[0].self_attn.out_proj.bias.abs().sum() == 0
        rec = hf.run_one(spec, data, "cpu", 1)
        assert rec["status"] == "ok" and rec["updates"] == (3 if spec["family"] == "marian" else 4), rid


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
    with pytest.raises(SystemExit, match="no run llama-L2-stock-s1; its causal LM runs: .*gpt2-L2-tfixup-s1"):
        hf_trace.main(["--smoke", "--out", str(tmp_path), "--data", str(data), "--layers", "2", "--arms", "stock"])


def test_trace_checks_out_first_and_has_each_familys_arms(exported, tmp_path, monkeypatch, capsys):
    """--out that is a file is refused in one line before anything trains; each family's default arms are runs
    of the study; Ctrl-C ends with one line, nothing written."""
    from harness import hf_trace

    data, _ = exported
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(hf_trace, "trace", lambda *a: pytest.fail("trained before checking --out"))
    with pytest.raises(SystemExit):
        hf_trace.main(["--smoke", "--out", str(tmp_path / "file"), "--data", str(data), "--layers", "2"])
    assert "--out" in capsys.readouterr().err
    for family, arms in hf_trace.ARMS.items():
        for arm in arms:  # the plan has each (spec_of exits where it does not)
            assert hf_trace.spec_of("default", family, 24, arm, 1, 5)["updates"] == 5

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_trace, "trace", interrupted)
    with pytest.raises(SystemExit) as e:
        hf_trace.main(["--smoke", "--out", str(tmp_path / "t"), "--data", str(data), "--layers", "2", "--arms", "tfixup"])
    assert e.value.code == 130 and "interrupted: nothing written" in capsys.readouterr().err
    assert not list((tmp_path / "t").iterdir())


def test_the_llama_question_table_comes_from_the_records(tmp_path):
    """Each method's best lr (its first seed's lowest best valid loss), both seeds there, updates to the warmup
    baseline's best at the baseline's own best lr, norms left and extra parameters: in hf.json, the report and
    README's generated block."""
    cfg = hf.make_config("default")
    bits = {"stock_matched": {5e-4: 5.6, 1e-3: 5.3, 2e-3: 5.4}, "tfixup_sigmoid": {5e-4: 5.2, 1e-3: 5.0, 2e-3: None}}
    records = {}

    def add(arm, lr, seed, best):
        spec = next(s for s in hf.make_specs(cfg, records) if s["arm"] == arm and s["layers"] == 24
                    and s["lr"] == lr and s["seed"] == seed)
        rid = hf.run_id(spec)
        curve = [[u, best + (1000 - u) / 1000] for u in range(25, 1001, 25)] if best else []
        records[rid] = {"id": rid, "family": "llama", "arm": arm, "layers": 24, "seed": seed, "config": spec,
                        "status": "ok" if best else "nan", "updates": 1000 if best else 40, "valid_curve": curve,
                        "parameters": 1000 - (3200 if arm.startswith("tfixup") else 0),
                        "norm_modules": 0 if arm.startswith("tfixup") else 49}

    for arm, by_lr in bits.items():
        for lr, b in by_lr.items():
            add(arm, lr, 1, b)
    add("stock_matched", 1e-3, 2, 5.25)
    add("tfixup_sigmoid", 1e-3, 2, 5.1)
    add("tfixup_giadam", 1e-3, 1, None)  # diverged: no best lr yet, and the table says where it diverged
    res = hf.summarise(cfg, records, None, len(records), {})
    q = res["llama_question"]
    assert q["stock_matched"]["best_lr"] == 1e-3 and q["stock_matched"]["closed"]
    assert q["tfixup_sigmoid"]["best_lr"] == 1e-3 and [c["status"] for c in q["tfixup_sigmoid"]["grid"]] == [
        "ok", "ok", "nan"]
    s1, s2 = q["tfixup_sigmoid"]["seeds"]
    assert (s1["best_ppl"], s2["best_ppl"]) == (32.0, round(2 ** 5.1, 2))
    assert s1["to_baseline_best"] == 700 and s1["ratio"] == 0.7  # 5.0 + 0.3 <= 5.3 first at update 700
    assert q["tfixup_sigmoid"]["extra_parameters"] == -3200 and q["tfixup_sigmoid"]["norm_modules"] == 0
    assert q["dyt"]["seeds"] == [] and q["dyt"]["best_lr"] is None
    rows = {r[0]: r for r in hf.llama_table(q)}
    assert rows["T-Fixup, no warmup, the gate bounded (sigmoid)"][1:4] == ["0.001", "32.0 / 34.3", "700 (0.70x) / 850 (0.85x)"]
    assert rows["T-Fixup, GI-Adam, no warmup"][1:3] == ["none so far: diverged at 0.001 (grid open)", "-"]
    closed = {**q["tfixup_giadam"], "closed": True,  # every lr of the grid diverged, down to its bound
              "grid": [{"lr": lr, "id": "x", "status": "nan", "best_ppl": None} for lr in (2.5e-4, 5e-4)]}
    assert hf.llama_table({"tfixup_giadam": closed})[0][1] == "none: diverged at 0.00025, 0.0005"
    # with the data's unigram level: the baseline's 5e-4 run (5.6 bits) is stuck, its grid and best unchanged
    q_level = hf.llama_question({**res, "stuck_bits": 5.5})
    assert [c["status"] for c in q_level["stock_matched"]["grid"]] == ["stuck", "ok", "ok"]
    assert q_level["stock_matched"]["best_lr"] == 1e-3 and "| 48.5 (stuck) |" in hf.llama_report(
        {**res, "llama_question": q_level})
    assert "waits for the rest" in hf.llama_verdict(q)
    # a second seed at the best lr within a bit of the unigram level is said to be stuck
    q_stuck = hf.llama_question({**res, "stuck_bits": 5.05})
    stuck_rows = {r[0]: r for r in hf.llama_table(q_stuck)}
    assert stuck_rows["T-Fixup, no warmup, the gate bounded (sigmoid)"][2] == "32.0 / 34.3 (stuck)"
    # done: a closed grid with every seed at its best lr, or a closed grid where no lr trained (no seeds to run)
    assert q["stock_matched"]["done"] and q["tfixup_sigmoid"]["done"] and not q["tfixup_giadam"]["done"]
    one_seed = {**q["stock_matched"], "seeds": q["stock_matched"]["seeds"][:1]}
    without = {k: v for k, v in records.items() if (v["arm"], v["seed"]) != ("stock_matched", 2)}
    assert not hf.summarise(cfg, without, None, len(without), {})["llama_question"]["stock_matched"]["done"]
    finished = {"stock_matched": q["stock_matched"], "tfixup_sigmoid": q["tfixup_sigmoid"],
                "dyt": {**closed, "label": "DyT", "done": True}}
    verdict = hf.llama_verdict(finished)
    # the lowest mean over its seeds (33.1 against the baseline's 38.7), each seed said
    assert "The warmup baseline, stock + matched warmup: 39.4 / 38.0 at lr 0.001." in verdict  # 2^5.3, 2^5.25
    assert verdict.startswith("Lowest best valid perplexity at its own best lr (the mean of its seeds): T-Fixup, no "
                              "warmup, the gate bounded (sigmoid) (32.0 / 34.3 at lr 0.001).") and verdict.endswith(
        "Norm-free T-Fixup: T-Fixup, no warmup, the gate bounded (sigmoid): trains at its best lr (0.001: 32.0 / 34.3). "
        "Trains at no lr of its grid: DyT."), verdict
    assert "waits for the rest" in hf.llama_verdict({**finished, "x": {**one_seed, "done": False}})
    assert ("(sigmoid): stays at the unigram level on a seed at its best lr (0.001: 32.0 / 34.3 (stuck))."
            in hf.llama_verdict({**finished, "tfixup_sigmoid": {**q_stuck["tfixup_sigmoid"], "done": True}}))
    # a method that is neither a norm-free candidate nor the baseline is said with its seeds too
    other = hf.llama_verdict({**finished, "giadam": {**q["stock_matched"], "label": "GI-Adam"}})
    assert other.endswith("The other methods: GI-Adam: trains at its best lr (0.001: 39.4 / 38.0). "
                          "Trains at no lr of its grid: DyT."), other
    assert "## The LLaMA question" in hf.report(res) and "| 0.0005 | 0.001 | 0.002 |" in hf.report(res)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "hf.json").write_text(json.dumps(res))
    block = docs.block_llama(tmp_path, tmp_path)
    front = docs.block_llama_verdict(tmp_path, tmp_path)  # README's line: the same verdict, the table linked
    assert front.startswith("**Each method at its own best learning rate on a 24-layer Llama**") and front.endswith(
        hf.llama_verdict(q))
    assert "| T-Fixup, no warmup, the gate bounded (sigmoid) | 0.001 | 32.0 / 34.3 |" in block and "hf.png" in block


def test_apply_tfixups_gated_mlp_options_are_refused_in_one_line_where_they_do_not_apply():
    import transformers

    from tfixup import hf as tfixup_hf

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32))
    with pytest.raises(ValueError, match="gated_mlp changes the gated MLP of the Llama family"):
        tfixup_hf.apply_tfixup(gpt2, gated_mlp="sigmoid")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=32))
    with pytest.raises(ValueError, match="gated_mlp='tanh' is not one of 'sigmoid', 'scaled'"):
        tfixup_hf.apply_tfixup(llama, gated_mlp="tanh")
    assert not getattr(llama, "tfixup_applied", False)  # refused before any change
    assert tfixup_hf.gated_mlp_scale(24) == 1 / 24
    from tfixup import apply_tfixup  # the package's one call passes the option on

    apply_tfixup(llama, gated_mlp="scaled")
    assert all(layer.mlp.tfixup_output_scale == 0.5 for layer in llama.model.layers)
