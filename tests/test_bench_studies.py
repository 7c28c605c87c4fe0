"""The evidence studies in harness/bench/: their arithmetic on known inputs, the unigram level against
fairseq's own criterion, resuming and interrupting, and --smoke runs end to end on the real data
(structure and units only: the numbers of a smoke run are not results)."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from harness.bench import batch, common, convergence, depth, quality  # noqa: E402
from harness.bench.unigram import unigram_level  # noqa: E402
from tfixup import atomic  # noqa: E402

LEVEL = {"oracle": 9.5, "train_fit": 9.8, "label_smoothing": 0.1, "vocab": 100, "valid_tokens": 1000}


def rec(id_, curve, status="ok", **meta):
    return {"id": id_, "status": status, "valid_curve": curve, "wall_s": 10.0, "s_per_update": 0.1, **meta}


# ---------------------------------------------------------------- arithmetic on known records


def test_convergence_ratio_and_stuck(tmp_path, monkeypatch):
    monkeypatch.setattr(convergence.common, "data_description", lambda d: "synthetic")
    monkeypatch.setattr(convergence.common, "data_counts", lambda d: {"valid": 1})
    cfg = dict(convergence.MODES["smoke"], mode="smoke", lrs=[1e-3], n_runs=3, dropout=0.1, decay_period=4000)
    meta = dict(group="main", lr=1e-3, seed=1, updates=400)
    records = {
        # the baseline's best is 8.0 at update 400
        "main-postln_warmup-lr0.001-s1": rec("main-postln_warmup-lr0.001-s1",
                                             [(100, 9.8), (200, 9.0), (300, 8.3), (400, 8.0)],
                                             method="postln_warmup", **meta),
        # T-Fixup gets there at 150: ratio 150 / 400
        "main-tfixup-lr0.001-s1": rec("main-tfixup-lr0.001-s1", [(50, 9.0), (100, 8.2), (150, 7.9), (400, 7.0)],
                                      method="tfixup", **meta),
        # Post-LN without warmup stays at the unigram level: stuck
        "main-postln-lr0.001-s1": rec("main-postln-lr0.001-s1", [(100, 9.8), (400, 9.7)], method="postln", **meta),
    }
    res = convergence.summarise(cfg, records, LEVEL, tmp_path, margin=1.0)
    rows = {r["method"]: r for r in res["rows"]}
    assert res["stuck_threshold"] == pytest.approx(8.8)
    assert rows["tfixup"]["ratio_to_baseline"] == pytest.approx(150 / 400)
    assert rows["tfixup"]["updates_to_baseline_best"] == 150
    assert [rows[m]["stuck"] for m in ("tfixup", "postln_warmup", "postln")] == [False, False, True]
    assert rows["postln"]["updates_to_baseline_best"] is None
    head = res["headline"]["main lr 0.001"]
    assert head["ratio_mean"] == pytest.approx(0.375) and head["reached"] == 1
    assert head["stuck"]["postln"] == "1/1" and head["stuck"]["tfixup"] == "0/1"
    assert res["complete"]
    text = convergence.report(res)
    assert "STUCK" in text and "0.375" in text


def lr1e3_summary(tmp_path, monkeypatch, curves: dict, **cfg_kw) -> dict:
    """convergence.summarise of one seed at lr 1e-3 of each arm -> its valid curve (400 updates)."""
    monkeypatch.setattr(convergence.common, "data_description", lambda d: "synthetic")
    monkeypatch.setattr(convergence.common, "data_counts", lambda d: {"valid": 1})
    cfg = dict(convergence.MODES["smoke"], mode="smoke", lrs=[1e-3], n_runs=len(curves), dropout=0.1,
               decay_period=4000, **cfg_kw)
    meta = dict(group="main", lr=1e-3, seed=1, updates=400)
    records = {f"main-{arm}-lr0.001-s1": rec(f"main-{arm}-lr0.001-s1", curve, method=arm, **meta)
               for arm, curve in curves.items()}
    return convergence.summarise(cfg, records, LEVEL, tmp_path, margin=1.0)


def test_convergence_ratio_against_each_baseline_schedule_and_the_better_one(tmp_path, monkeypatch):
    """T-Fixup's ratio is given against the Post-LN baseline on fairseq's inverse_sqrt and on the matched
    schedule, and the headline takes the schedule whose baseline reached the lower loss."""
    res = lr1e3_summary(tmp_path, monkeypatch, {
        "postln_warmup": [(100, 9.0), (400, 8.0)], "postln_matched": [(100, 8.9), (200, 7.8), (400, 7.6)],
        "tfixup": [(100, 8.0), (200, 7.7), (400, 7.0)]})
    head = res["headline"]["main lr 0.001"]
    assert head["per_baseline"]["postln_warmup"]["ratio_mean"] == pytest.approx(100 / 400)
    assert head["per_baseline"]["postln_matched"]["ratio_mean"] == pytest.approx(400 / 400)  # 7.6 at 400
    assert head["better_baseline"] == "postln_matched" and head["ratio_mean"] == pytest.approx(1.0)
    assert "Post-LN + matched warmup" in convergence.report(res)


def test_convergence_headline_with_the_small_init_baseline_at_each_budget(tmp_path, monkeypatch):
    """The Post-LN baseline with transformers' initialisation is a headline baseline too (the better of the four
    arms is chosen on valid); each baseline says how many of its runs were still improving at the end, and the
    ratios are given again with every run cut at half the budget."""
    res = lr1e3_summary(tmp_path, monkeypatch, {
        "postln_warmup": [(100, 9.0), (200, 8.5), (400, 8.0)],
        "postln_si_matched": [(100, 8.9), (200, 7.6), (400, 7.7)],  # best before its end: not still improving
        "tfixup": [(100, 8.0), (200, 7.7), (400, 7.0)]}, updates=400)
    head = res["headline"]["main lr 0.001"]
    assert head["better_baseline"] == "postln_si_matched" and head["ratio_mean"] == pytest.approx(400 / 200)
    assert head["per_baseline"]["postln_warmup"]["baseline_still_improving"] == 1
    assert head["per_baseline"]["postln_si_matched"]["baseline_still_improving"] == 0
    half = head["at_budget"]["200"]  # 400 updates: budgets 200 and 400
    # cut at 200: the warmup baseline's best is 8.5 at 200, T-Fixup's 8.0 at 100 is below it: 0.5
    assert half["per_baseline"]["postln_warmup"]["ratio_mean"] == pytest.approx(0.5)
    assert set(head["at_budget"]) == {"200", "400"}
    text = convergence.report(res)
    assert "Post-LN, small init + matched warmup (**better**)" in text and "200: 0.50x (1/1 reached)" in text


def test_convergence_states_tfixup_against_every_warmup_method_on_its_better_schedule(tmp_path, monkeypatch):
    """Each warmup method gets T-Fixup's ratio on both of its schedules and on the better one, from the same
    code as the Post-LN headline; a method with one schedule run is stated against that one."""
    res = lr1e3_summary(tmp_path, monkeypatch, {
        "admin_warmup": [(100, 9.0), (400, 8.0)], "admin_matched": [(100, 8.9), (200, 7.8), (400, 7.6)],
        "lri_warmup": [(100, 9.0), (400, 8.5)], "tfixup": [(100, 8.0), (200, 7.7), (400, 7.0)]})
    admin = res["per_method"]["main lr 0.001"]["admin"]
    assert admin["better"] == "admin_matched"
    assert admin["arms"]["admin_warmup"]["ratio_mean"] == pytest.approx(100 / 400)
    assert admin["arms"]["admin_matched"]["ratio_mean"] == pytest.approx(400 / 400)
    lri = res["per_method"]["main lr 0.001"]["lri"]
    assert lri["better"] == "lri_warmup" and set(lri["arms"]) == {"lri_warmup"}
    text = convergence.report(res)
    assert "| main lr 0.001 | Admin | 8.000 (1 seed) | 0.25x (1/1 reached) | 7.600 (1 seed) | 1.00x" in text


def test_convergence_states_tfixup_against_dyt_and_rezero_with_and_without_warmup(tmp_path, monkeypatch):
    """DyT (trained with warmup) and ReZero (without) run on all three schedules; the better schedule is the
    one of the lowest best valid loss, without warmup where that is lower (ReZero here), and each schedule
    has its own columns."""
    res = lr1e3_summary(tmp_path, monkeypatch, {
        "dyt_warmup": [(100, 9.0), (400, 8.0)], "dyt_matched": [(100, 8.9), (200, 7.8), (400, 7.6)],
        "dyt": [(100, 9.5), (400, 9.4)],
        "rezero_warmup": [(100, 9.0), (400, 8.4)], "rezero_matched": [(200, 8.2), (400, 8.1)],
        "rezero": [(100, 8.5), (200, 7.5)],
        "tfixup": [(100, 8.0), (200, 7.7), (400, 7.0)]})
    per = res["per_method"]["main lr 0.001"]
    assert per["dyt"]["better"] == "dyt_matched" and set(per["dyt"]["arms"]) == {"dyt_warmup", "dyt_matched", "dyt"}
    assert per["dyt"]["arms"]["dyt"]["ratio_mean"] == pytest.approx(100 / 400)  # 9.4, at 400
    assert per["rezero"]["better"] == "rezero"  # 7.5 without warmup, below its warmups' 8.1 and 8.4
    assert per["rezero"]["arms"]["rezero"]["ratio_mean"] == pytest.approx(400 / 200)  # T-Fixup below 7.5 at 400
    text = convergence.report(res)
    assert ("| main lr 0.001 | DyT | 8.000 (1 seed) | 0.25x (1/1 reached) | 7.600 (1 seed) | 1.00x (1/1 reached) "
            "| matched warmup | 1.00x (1/1 reached) | 9.400 (1 seed) | 0.25x (1/1 reached) |") in text
    assert ("| main lr 0.001 | ReZero | 8.400 (1 seed) | 0.25x (1/1 reached) | 8.100 (1 seed) | 0.25x (1/1 reached) "
            "| no warmup | 2.00x (1/1 reached) | 7.500 (1 seed) | 2.00x (1/1 reached) |") in text
    # in the figure, a method run both ways has its no-warmup curve dash-dotted, beside its solid matched one
    assert [convergence.ARMS[a].linestyle for a in ("dyt", "dyt_matched", "rezero", "rezero_warmup", "tfixup")] == [
        "-.", "-", "-.", "--", "-"]


def test_plateau_final_bleu_per_method_and_the_paired_bootstrap_of_each_gap(tmp_path, monkeypatch):
    from harness.bench import plateau

    monkeypatch.setattr(plateau.common, "data_counts", lambda d: {"test": 3})
    refs = ["a man rides a horse", "two dogs play in the snow", "a child eats an apple"] * 20
    (tmp_path / "test.raw.en").write_text("\n".join(refs) + "\n")
    good, bad = list(refs), [r.replace("a ", "the ") for r in refs]

    def run(method, seed, bleu, hyps):
        return {"id": f"multi30k-{method}-s{seed}", "corpus": "multi30k", "method": method, "seed": seed,
                "status": "ok", "valid_curve": [(124, 6.0), (248, 5.0)], "bleu_curve": [(124, 20.0), (248, bleu)],
                "wall_curve": [(124, 60.0), (248, 120.0)], "epochs": 2, "test_hypotheses": hyps,
                "test": {"bleu_detok": bleu, "bleu_tok": bleu, "lowercase": True}, "stopped_by": "patience"}
    records = {r["id"]: r for r in (run("tfixup", 1, 40.0, good), run("tfixup", 2, 38.0, good),
                                    run("postln_matched", 1, 30.0, bad))}
    records["multi30k-tfixup-s2"]["stopped_by"] = "max epoch/update"
    cfg = dict(plateau.MODES["default"], mode="default", quality=dict(quality.MODES["default"], mode="default"))
    res = plateau.summarise(cfg, records, {"multi30k": str(tmp_path)}, 3)
    assert res["per_method"]["tfixup"] == {"seeds": 2, "sacrebleu_mean": 39.0, "sacrebleu_min": 38.0,
                                           "sacrebleu_max": 40.0, "epochs": [2, 2]}
    (gap,) = res["gaps"]
    assert (gap["tfixup"], gap["baseline"]) == ("multi30k-tfixup-s1", "multi30k-postln_matched-s1")
    assert gap["gap"] > 0 and gap["ci95"][0] <= gap["gap"] <= gap["ci95"][1] and gap["p_gap_le_0"] == 0
    rows = {r["id"]: r for r in res["rows"]}
    assert rows["multi30k-tfixup-s1"]["updates_to_postln_matched_best"] == 248  # first to 30 valid BLEU
    text = plateau.report(res)
    assert "95% interval" in text
    assert ("**Not at a plateau:** multi30k-tfixup-s2 was stopped by the 40-epoch cap (best valid BLEU at epoch 2)"
            in text) and "multi30k-tfixup-s1 was" not in text
    # one baseline seed: its gap's spread over seeds is not known; each run's mean lr over its own updates
    assert "| Post-LN + matched warmup | 1 | +" in text and "- (one seed)" in text
    assert "multi30k-tfixup-s1 0.985 (248 updates)" in text  # lr sqrt(4000 / (4000 + t)) over t < 248
    # a second baseline seed: the gaps' mean, range and standard deviation over the seeds
    records["multi30k-postln_matched-s2"] = run("postln_matched", 2, 30.0, bad[:30] + good[30:])
    res = plateau.summarise(cfg, records, {"multi30k": str(tmp_path)}, 4)
    g1, g2 = (g["gap"] for g in res["gaps"])
    row = next(line for line in plateau.report(res).splitlines() if line.startswith("| Post-LN + matched warmup | 2 | +"))
    assert f"[{min(g1, g2):+.2f}, {max(g1, g2):+.2f}]" in row and f"{abs(g1 - g2) / 2 ** 0.5:.2f}" in row


def test_convergence_methods_option_runs_only_those():
    """--methods names the runs to run now: a headline method with every seed, another with the
    first seed only; the study (and its report) stays whole."""
    cfg = convergence.make_config(convergence.parser().parse_args(
        ["--data", "d", "--out", "o", "--lrs", "5e-4", "--long-updates", "0"]))
    every = convergence.make_runs(cfg, pathlib.Path("d"))
    ids = [r.id for r in convergence.selected(every, ["tfixup", "preln", "sgd"])]
    assert ids == ["main-tfixup-lr0.0005-s1", "main-tfixup-lr0.0005-s2", "main-tfixup-lr0.0005-s3",
                   "main-preln-lr0.0005-s1", "fig3c-sgd-lr0.1-s1", "fig3c-sgd-lr0.3-s1", "fig3c-sgd-lr1-s1"]
    every = convergence.make_runs(convergence.make_config(convergence.parser().parse_args(["--data", "d", "--out", "o"])),
                                  pathlib.Path("d"))
    main = [a.name for a in convergence.ARMS.values() if a.group == "main"]
    # per lr: 7 headline arms (T-Fixup; Post-LN on each schedule with fairseq's init, on each with the small
    # init) x 3 seeds, the other main arms once; 3 Fig. 3c Adam arms per lr, 2 SGD arms x 3 lrs; a long run per
    # headline arm
    assert len(convergence.HEADLINE) == 7
    assert len(every) == 2 * (7 * 3 + len(main) - 7) + 2 * 3 + 2 * 3 + 7


def test_a_diverged_run_counts_as_stuck(tmp_path, monkeypatch):
    monkeypatch.setattr(convergence.common, "data_description", lambda d: "synthetic")
    monkeypatch.setattr(convergence.common, "data_counts", lambda d: {"valid": 1})
    cfg = dict(convergence.MODES["smoke"], mode="smoke", lrs=[1e-3], n_runs=2, dropout=0.1, decay_period=4000)
    meta = dict(group="main", lr=1e-3, seed=1, updates=400)
    records = {"main-postln-lr0.001-s1": rec("main-postln-lr0.001-s1", [(100, 5.0)], status="nan",
                                             method="postln", **meta)}
    res = convergence.summarise(cfg, records, LEVEL, tmp_path, margin=1.0)
    assert res["rows"][0]["stuck"] and not res["complete"]


def test_depth_trained_means_below_the_unigram_level(tmp_path, monkeypatch):
    monkeypatch.setattr(depth.common, "data_description", lambda d: "synthetic")
    monkeypatch.setattr(depth.common, "data_counts", lambda d: {"valid": 1})
    cfg = dict(depth.MODES["smoke"], mode="smoke", n_runs=4, lr=5e-4, decay_period=4000, seed=1)
    records = {
        "tfixup-6": rec("tfixup-6", [(8, 8.5)], method="tfixup", depth=6, updates=8),
        "tfixup-200": rec("tfixup-200", [(8, 8.7)], method="tfixup", depth=200, updates=8),
        # dropped by 3 bits from its start but still at the unigram level: not trained
        "postln-6": rec("postln-6", [(4, 12.8), (8, 9.6)], method="postln", depth=6, updates=8),
        "postln-200": rec("postln-200", [(4, 8.0)], status="nan", method="postln", depth=200, updates=8),
    }
    res = depth.summarise(cfg, records, LEVEL, tmp_path, margin=1.0)
    trained = {(r["method"], r["depth"]): r["trained"] for r in res["rows"]}
    assert trained == {("tfixup", 6): True, ("tfixup", 200): True, ("postln", 6): False, ("postln", 200): False}
    assert res["deepest_trained"] == {"tfixup": 200, "postln": None}


def test_depth_on_cpu_leaves_the_other_methods_deep_runs_out_and_says_what_they_cost(tmp_path):
    """Past cpu_depth layers per side a CPU plan keeps the paper's three methods, what is recorded and what
    --only names; a GPU plan keeps every run; the report lists what was left out with its estimated hours."""
    args = depth.parser().parse_args(["--data", str(tmp_path), "--out", "-"])
    cfg = depth.make_config(args)
    every = depth.make_runs(cfg, tmp_path)
    kept, left_runs = depth.cpu_budget(cfg, every, recorded={"dyt-100"}, only=["rezero-200"])
    left = {r.id for r in left_runs}
    assert {r.id for r in kept} | set(left) == {r.id for r in every} and not {r.id for r in kept} & set(left)
    assert {"tfixup-200", "postln-100", "preln-100", "dyt-100", "rezero-200", "admin-50"} <= {r.id for r in kept}
    assert {"admin-100", "dyt-200", "tfixup_zb-100"} <= set(left)
    assert all(r.meta["depth"] > cfg["cpu_depth"] and r.meta["method"] not in depth.CORE
               for r in every if r.id in left)
    assert depth.cpu_budget(dict(cfg, device="cuda"), every, set()) == (every, [])
    records = {i: dict(id=i, method=m, depth=100, updates=600, wall_s=w, device="cpu")
               for i, m, w in (("tfixup-100", "tfixup", 3600), ("postln-100", "postln", 7200),
                               ("preln-100", "preln", 1800))}
    assert depth.estimated_hours(records, 100, 600) == 1.0 and depth.estimated_hours(records, 200, 300) is None


def test_batch_scaling_factor(tmp_path, monkeypatch):
    monkeypatch.setattr(batch.common, "data_description", lambda d: "synthetic")
    monkeypatch.setattr(batch.common, "data_counts", lambda d: {"valid": 1})
    cfg = dict(batch.MODES["default"], mode="default", n_runs=3, lr=5e-4, decay_period=4000, seed=1)
    records = {  # target: 1x's best by update 400 = 8.0; 2x needs 200 updates, 4x 150
        "tfixup-x1": rec("tfixup-x1", [(200, 9.0), (400, 8.0), (800, 7.0)], multiplier=1, updates=800),
        "tfixup-x2": rec("tfixup-x2", [(100, 8.6), (200, 7.9), (400, 7.0)], multiplier=2, updates=400),
        "tfixup-x4": rec("tfixup-x4", [(100, 8.1), (150, 7.95)], multiplier=4, updates=200),
    }
    res = batch.summarise(cfg, records, LEVEL, tmp_path)
    assert res["target_valid_loss"] == 8.0
    assert [r["updates_to_target"] for r in res["rows"]] == [400, 200, 150]
    assert res["factor_per_doubling"] == [0.5, 0.75] and res["factor_per_doubling_mean"] == pytest.approx(0.625)
    assert not res["any_diverged"]
    assert batch.budget(cfg, 1) == (800, 50) and batch.budget(cfg, 8) == (100, 6)


def test_one_headline_metric_skips_what_is_no_measurement():
    curve = [(10, 5.0), (20, float("nan")), (30, 3.0), (40, None), (50, 3.0), (60, float("inf"))]
    assert common.best(curve) == (30, 3.0) and common.best(curve, higher=True) == (10, 5.0)
    assert common.best([(1, float("nan")), (2, None)]) == (None, None) == common.best([])
    assert common.reach(curve, 4.0) == 30 and common.reach(curve, 5.0, higher=True) == 10
    assert common.reach(curve, 1.0) is None and common.reach(curve, None) is None
    # T-Fixup's updates to the baseline's best (3.5 at update 20) / the baseline's: 30 / 20
    assert common.to_best(curve, [(10, 4.0), (20, 3.5), (30, float("nan"))]) == (30, 1.5)
    assert common.to_best(curve, []) == (None, None)


def test_one_data_description_for_every_kind_of_data(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "meta.json").write_text(json.dumps({"sentences": {"train": 3, "valid": 1}, "vocab": {"de": 7, "en": 5},
                                              "parameters": {"bpe_merges": "800"}}))
    assert common.data_description(hf).startswith("Multi30k De-En (train 3, valid 1 sentence pairs; test = "
                                                  "test_2016_flickr), Moses-tokenized, lowercased, 800 joint BPE")
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "dict.txt").write_text("a 2\n")
    (lm / "manifest.json").write_text(json.dumps({
        "complete": True, "sentences": {"train": 3, "valid": 1}, "unk_rate_percent": {"valid.None": 1.5},
        "params": {"train": "/s/multi30k/train.en.gz", "valid": "/s/multi30k/val.en.gz"}}))
    assert common.data_description(lm) == (
        "Multi30k English side, multi30k/train.en.gz (3 lines) to train, multi30k/val.en.gz (1 lines) to validate; "
        "Moses-tokenized, lowercased, words seen >= 2 times in train (1.5% of valid tokens <unk>)")
    (tmp_path / "mt").mkdir()
    (tmp_path / "mt" / "manifest.json").write_text(json.dumps({"complete": True, "sentences": {"train": 3}}))
    assert common.data_description(tmp_path / "mt").startswith("IWSLT'14 De-En real sample (train 3 sentence pairs)")


def test_quality_updates_to_the_baselines_best_bleu(tmp_path, monkeypatch):
    monkeypatch.setattr(quality.common, "data_counts", lambda d: {"valid": 1})
    monkeypatch.setattr(quality, "unigram_level", lambda d, s, t: LEVEL)
    cfg = dict(quality.MODES["default"], mode="default")
    base = {"id": "multi30k-postln", "corpus": "multi30k", "method": "postln", "status": "ok",
            "valid_curve": [(100, 8.0), (200, 6.0)], "bleu_curve": [(100, 10.0), (200, 30.0)],
            "wall_curve": [(100, 60.0), (200, 120.0)], "test": {"bleu_tok": 31.0}}
    tfix = {"id": "multi30k-tfixup", "corpus": "multi30k", "method": "tfixup", "status": "ok",
            "valid_curve": [(100, 7.0), (200, 5.5)], "bleu_curve": [(100, 31.0), (200, 35.0)],
            "wall_curve": [(100, 66.0), (200, 130.0)], "test": {"bleu_tok": 36.0}}
    res = quality.summarise(cfg, {base["id"]: base, tfix["id"]: tfix}, {"multi30k": str(tmp_path)}, 2)
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["tfixup"]["updates_to_baseline_best_valid_bleu"] == 100
    assert rows["tfixup"]["wall_min_to_baseline_best_valid_bleu"] == 1.1
    assert rows["postln"]["updates_to_baseline_best_valid_bleu"] == 200
    assert rows["tfixup"]["test_bleu_tok"] == 36.0 and res["complete"]


def test_quality_tfixup_against_each_method_on_its_better_schedule_chosen_on_valid():
    """Each method (ReZero, trained without warmup, too): T-Fixup's ratio and test BLEU gap on each schedule run and on the one with the
    higher best valid BLEU (not the higher test BLEU)."""
    def rec(method, bleu, test, seed=1):
        return {"id": quality.run_id("multi30k", method, seed), "corpus": "multi30k", "method": method,
                "seed": seed, "status": "ok", "bleu_curve": bleu, "test": {"bleu_tok": test}}
    records = {r["id"]: r for r in (
        rec("tfixup", [(100, 20.0), (200, 30.0)], 31.0),
        rec("tfixup", [(100, 12.0), (200, 28.0)], 29.0, seed=2),
        rec("admin", [(100, 10.0), (200, 24.0)], 22.0),            # better on valid, worse on test
        rec("admin", [(100, 11.0), (200, 20.0)], 21.0, seed=2),   # paired with T-Fixup's seed 2
        rec("admin_matched", [(100, 15.0), (200, 19.0)], 23.0),
        rec("admin_matched", [(100, 15.0), (200, 19.0)], 23.0, seed=2),  # not the better schedule
        rec("dsinit", [(100, 5.0), (200, 18.0)], 17.0),
        rec("rezero", [(100, 8.0), (200, 25.0)], 26.0))}  # trained without warmup in its paper
    got = quality.versus_methods(records)["multi30k"]
    assert got["rezero"]["better"] == "rezero" and got["rezero"]["arms"]["rezero"]["tfixup_gap"] == 5.0
    assert got["admin"]["better"] == "admin"
    assert got["admin"]["arms"]["admin"] == {"best_valid_bleu": 24.0, "test_bleu_tok": 22.0, "tfixup_ratio": 1.0,
                                             "tfixup_gap": 9.0}
    assert got["admin"]["arms"]["admin_matched"]["tfixup_ratio"] == 0.5
    assert got["admin"]["better_seeds"] == {2: {"best_valid_bleu": 20.0, "test_bleu_tok": 21.0,
                                                "tfixup_ratio": 1.0, "tfixup_gap": 8.0}}
    assert set(got["dsinit"]["arms"]) == {"dsinit"} and got["dsinit"]["better_seeds"] == {} and "rfixup" not in got


def test_quality_plot_of_every_arm_puts_its_legend_beside_the_curves(tmp_path, monkeypatch):
    """With every arm on a corpus (more than 6 labels), one legend right of the plots, none on the curves."""
    legends = []
    monkeypatch.setattr(quality.atomic, "save_figure",
                        lambda path, fig: legends.extend(ax.get_legend() for ax in fig.axes))
    records = {quality.run_id("multi30k", m): {"id": quality.run_id("multi30k", m), "corpus": "multi30k",
                                               "method": m, "valid_curve": [(100, 8.0), (200, 7.0)],
                                               "bleu_curve": [(100, 1.0), (200, 2.0)]}
               for m in list(quality.ARMS)[:8]}
    quality.plot({"records": records}, tmp_path / "q.png")
    loss, bleu = legends
    assert bleu is None and len(loss.get_texts()) == 8


def test_quality_times_of_a_resumed_run_add_up(tmp_path):
    """A run resumed after a session's end: its train time is every train.sh call's (train_runs.tsv),
    and its clock at each epoch goes on from where the first call's stopped (fairseq's train_wall
    starts again at 0 in the second call)."""
    (tmp_path / "train_runs.tsv").write_text("1000\t3000\t1\tcpu\tinterrupted\n4000\t4500\t1\tcpu\t0\n")
    assert quality.train_wall(tmp_path, 123.4) == (2500.0, 2)
    assert quality.train_wall(tmp_path / "none", 123.4) == (123.4, 1)
    epochs = [{"train_num_updates": 124, "train_wall": 250.0}, {"train_num_updates": 248, "train_wall": 500.0},
              {"train_num_updates": 372, "train_wall": 240.0}, {"train_num_updates": 496, "train_wall": 490.0}]
    assert quality.wall_curve(epochs) == [(124, 250.0), (248, 500.0), (372, 740.0), (496, 990.0)]


def test_quality_samples_are_the_first_test_sentences(tmp_path):
    gen = tmp_path / "generate-test.txt"
    gen.write_text("S-2\tdrei\nT-2\tthree\nH-2\t-0.1\tthree\nS-0\teins\nT-0\tone\nH-0\t-0.2\tone\n"
                   "S-1\tzwei\nT-1\ttwo\nH-1\t-0.3\ttoo\nD-1\t-0.3\ttoo\n")
    got = quality.samples(gen, 2)
    assert got == [{"id": 0, "source": "eins", "reference": "one", "hypothesis": "one"},
                   {"id": 1, "source": "zwei", "reference": "two", "hypothesis": "too"}]


# ---------------------------------------------------------------- the unigram level


def test_unigram_level_is_fairseqs_loss_of_the_best_unigram_model(iwslt_bin):
    """Score fairseq's label_smoothed_nll_loss with q = the level's distribution at every valid
    position: it must equal the computed level, and any other unigram distribution must do worse."""
    import numpy as np
    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from fairseq.data import Dictionary, data_utils

    level = unigram_level(iwslt_bin, "de", "en", label_smoothing=0.1)
    d = Dictionary.load(str(iwslt_bin / "dict.en.txt"))
    ds = data_utils.load_indexed_dataset(str(iwslt_bin / "valid.de-en.en"), d)
    target = torch.cat([ds[i] for i in range(len(ds))]).long()
    assert level["valid_tokens"] == len(target) and level["vocab"] == len(d)
    counts = np.bincount(target.numpy(), minlength=len(d)).astype(np.float64)
    eps, n, v = 0.1, len(target), len(d)
    eps_i = eps / (v - 1)
    q = torch.tensor(((1 - eps - eps_i) * counts + eps_i * n) / n)

    def loss_bits(logq):
        lprobs = logq.expand(len(target), v)
        loss, _ = label_smoothed_nll_loss(lprobs, target.unsqueeze(-1), eps, ignore_index=d.pad(), reduce=True)
        return float(loss) / n / math.log(2)

    assert loss_bits(q.log()) == pytest.approx(level["oracle"], abs=1e-3)
    torch.manual_seed(0)
    other = torch.log_softmax(q.log() + 0.05 * torch.randn(v, dtype=torch.float64), -1)
    assert loss_bits(other) > level["oracle"] + 1e-4
    # fit on train, scored on valid: never better than the valid-fit optimum
    assert level["train_fit"] >= level["oracle"]


def test_unigram_level_refuses_a_truncated_data_bin(iwslt_bin, tmp_path):
    """The counts are read from fairseq's .idx/.bin with numpy (no fairseq import): a .bin that lacks
    part of the sentences its index lists is refused, naming the file, not counted."""
    import shutil

    for f in iwslt_bin.iterdir():
        if f.name.startswith(("dict.", "train.de-en.en", "valid.de-en.en")):
            shutil.copy(f, tmp_path / f.name)
    assert unigram_level(tmp_path, "de", "en") == unigram_level(iwslt_bin, "de", "en")
    binfile = tmp_path / "valid.de-en.en.bin"
    binfile.write_bytes(binfile.read_bytes()[:-4])
    with pytest.raises(ValueError, match=r"valid\.de-en\.en\.bin does not hold the 200 sentences"):
        unigram_level(tmp_path, "de", "en")


# ---------------------------------------------------------------- runs: resume and interrupt


def bench_cmd(name, data, out, *extra):
    return [sys.executable, "-m", f"harness.bench.{name}", "--smoke", "--data", str(data), "--out", str(out), *extra]


BENCH_ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


@pytest.fixture(autouse=True)
def bench_work(tmp_path, monkeypatch):
    """The studies' scratch space in the test's temp dir, not the checkout."""
    monkeypatch.setitem(BENCH_ENV, "TFIXUP_BENCH_WORK", str(tmp_path / "bench-work"))


def check_outputs(out: pathlib.Path, name: str) -> dict:
    for ext in ("json", "md", "png"):
        assert (out / f"{name}.{ext}").stat().st_size > 0
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temp files left behind"
    res = json.loads((out / f"{name}.json").read_text())
    assert res["mode"] == "smoke" and res["command"].startswith(f"python -m harness.bench.{name}")
    assert "date_utc" in res["machine"] and res["data"]
    assert oct((out / f"{name}.json").stat().st_mode & 0o777) == oct(0o666 & ~current_umask())
    return res


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_convergence_smoke_then_resume(iwslt_bin, tmp_path, monkeypatch, fairseq_train_here):
    """The study's main() on the real data, its runs trained in this process (conftest.fairseq_train_here;
    a run's own process: test_sigterm_stops_a_study_and_its_runs, the plateau smoke's train.sh)."""
    out = tmp_path / "conv"
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "bench-work"))
    argv = ["--smoke", "--data", str(iwslt_bin), "--out", str(out), "--jobs", "1"]
    monkeypatch.setattr(sys, "argv", ["convergence.py", *argv])  # the command its report records
    assert convergence.main(argv) == 0
    res = check_outputs(out, "convergence")
    lv = res["unigram_level"]
    assert 5 < lv["oracle"] <= lv["train_fit"] < 14  # bits per token for a ~6k-symbol vocabulary
    assert res["stuck_threshold"] == pytest.approx(lv["train_fit"] - 1.0, abs=1e-3)
    assert sorted(r["method"] for r in res["rows"]) == ["postln_warmup", "tfixup"]
    for r in res["records"].values():
        assert r["status"] == "ok" and [u for u, _ in r["valid_curve"]] == [4, 8]
        assert all(math.isfinite(l) for _, l in r["valid_curve"])
        assert "--decay-period 4000" in r["command"] or "--warmup-updates 4" in r["command"]
    assert "main lr 0.001" in res["headline"]
    assert len(list((out / "convergence" / "runs").glob("*.json"))) == 2


def test_a_study_runs_what_its_store_lacks_and_reruns_a_changed_command(tmp_path, monkeypatch):
    """Orchestration with a fake executor (milliseconds, no fairseq-train): recorded runs are skipped, a
    run recorded with another command runs again, a run whose executor fails leaves no record and the
    others go on; the report is rewritten after every record."""
    from harness.bench import runs as runlib

    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    runs = [runlib.Run(f"r{i}", {"seed": i}, ["--seed", str(i)], str(tmp_path)) for i in (1, 2, 3, 4, 5)]
    store = tmp_path / "study" / "runs"
    store.mkdir(parents=True)
    atomic.write_json(store / "r1.json", {"id": "r1", "key": runs[0].key(), "status": "ok"})
    atomic.write_json(store / "r2.json", {"id": "r2", "key": "another command", "status": "ok"})
    ran, reports = [], []

    def execute(run, work):  # r3's executor breaks; r5's run fails to run (a tool's error): no result
        ran.append(run.id)
        if run.id == "r3":
            raise OSError("disk full")
        return {"id": run.id, "key": run.key(), "status": "error" if run.id == "r5" else "ok"}

    res = runlib.run_study("study", tmp_path, runs, lambda recs: {"recorded": sorted(recs)},
                           lambda res, path: path.write_bytes(b"png"),
                           lambda res: reports.append(res["recorded"]) or "report", "caption", jobs=1,
                           execute=execute)
    assert sorted(ran) == ["r2", "r3", "r4", "r5"] and res == {"recorded": ["r1", "r2", "r4"]}
    assert json.loads((store / "r2.json").read_text())["key"] == runs[1].key()
    assert not (store / "r3.json").exists() and not (store / "r5.json").exists()
    assert ["r1", "r2", "r4"] in reports


def test_quick_runs_write_the_report_once_and_a_stopped_study_shows_what_it_recorded(tmp_path, monkeypatch):
    """Runs that finish within REWRITE_EVERY_S of the last writing add no rewrite of their own: the
    outputs are written once, at the end. A study stopped (Ctrl-C) after a recorded run writes them then, with
    that run in them."""
    from harness.bench import runs as runlib

    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    runs = [runlib.Run(f"r{i}", {}, ["--seed", str(i)], str(tmp_path)) for i in (1, 2, 3)]
    reports = []

    def execute(run, work):
        if run.id == stop_at:
            raise KeyboardInterrupt
        return {"id": run.id, "key": run.key(), "status": "ok"}

    study = lambda: runlib.run_study("study", tmp_path, runs, lambda recs: {"recorded": sorted(recs)},  # noqa: E731
                                     lambda res, path: path.write_bytes(b"png"),
                                     lambda res: reports.append(res["recorded"]) or "report", "caption", jobs=1,
                                     execute=execute, quiet=True)
    stop_at = None
    study()
    assert reports == [["r1", "r2", "r3"]]
    for f in (tmp_path / "study" / "runs").glob("*.json"):
        f.unlink()
    reports.clear()
    stop_at = "r2"
    with pytest.raises(SystemExit):
        study()
    stored = sorted(f.stem for f in (tmp_path / "study" / "runs").glob("*.json"))
    assert "r1" in stored and "r2" not in stored  # r3 may have finished beside r2's stop
    assert reports == [stored] and (tmp_path / "study.md").exists()


def test_a_study_resumed_on_the_other_device_keeps_its_records():
    """Every committed record of the depth, convergence and LM studies counts for the same run planned with
    --device cuda (only --cpu differs), and the other way round; a run's other settings still tell runs apart."""
    from harness.bench import lm

    for study, data in ((depth, "iwslt14-v1000"), (convergence, "iwslt14-v1000"), (lm, "lm-multi30k-en-t0-v0")):
        args = study.parser().parse_args(["--data", data, "--out", "-"])
        cpu = {r.id: r for r in study.make_runs(study.make_config(args), pathlib.Path(data))}
        args.device = "cuda"
        cuda = {r.id: r for r in study.make_runs(study.make_config(args), pathlib.Path(data))}
        assert all("--cpu" in r.args for r in cpu.values()) and not any("--cpu" in r.args for r in cuda.values())
        store = REPO / "results" / "bench" / study.__name__.split(".")[-1] / "runs"
        records = {f.stem: json.loads(f.read_text()) for f in store.glob("*.json")}
        mine = [i for i in records if i in cpu]
        assert mine and all(cpu[i].recorded_by(records[i]) and cuda[i].recorded_by(records[i]) for i in mine)
        assert cuda[mine[0]].recorded_by({"key": cpu[mine[0]].key()})
        assert not cuda[mine[0]].recorded_by({"key": cpu[mine[1]].key()})


def test_only_runs_the_named_runs_and_refuses_an_unknown_id(tmp_path, monkeypatch):
    from harness.bench import runs as runlib

    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    runs = [runlib.Run(f"r{i}", {}, ["--seed", str(i)], str(tmp_path)) for i in (1, 2, 3)]
    ran = []

    def execute(run, work):
        ran.append(run.id)
        return {"id": run.id, "key": run.key(), "status": "ok"}

    study = lambda **kw: runlib.run_study("study", tmp_path, runs, lambda recs: {"recorded": sorted(recs)},  # noqa: E731
                                          lambda res, path: path.write_bytes(b"png"), lambda res: "report", "caption",
                                          jobs=1, execute=execute, **kw)
    assert study(only=["r2"]) == {"recorded": ["r2"]} and ran == ["r2"]
    with pytest.raises(SystemExit, match="--only: no run r9 in this study; its ids: r1 r2 r3"):
        study(only=["r9", "r1"])
    assert ran == ["r2"]


def test_sigterm_stops_a_study_and_its_runs(tmp_path):
    """SIGTERM to a study's process stops its running child (here a sleep standing in for fairseq-train,
    in its own process group as every run is), records nothing for it, exits 130 with one line."""
    script = f"""
import pathlib, sys
sys.path.insert(0, {str(REPO)!r})
from harness.bench import runs as runlib
runs = [runlib.Run("r1", {{}}, [], "d")]
def execute(run, work):
    work.mkdir(parents=True, exist_ok=True)
    runlib.run_logged(["sh", "-c", "echo $$ > " + str(work / "sleep.pid") + "; exec sleep 300"], work / "run.log", {{}})
    return {{"id": run.id, "key": run.key(), "status": "ok"}}
runlib.run_study("study", pathlib.Path({str(tmp_path)!r}), runs, lambda recs: {{}}, lambda res, path: None,
                 lambda res: "", "caption", jobs=1, execute=execute)
"""
    env = dict(os.environ, TFIXUP_BENCH_WORK=str(tmp_path / "work"))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # the run's child has started (its pid file): the study's handler is installed (before any run starts), and a
    # SIGTERM before run_logged has registered the child still stops it (run_logged checks after registering)
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "work" / "study" / "sleep.pid").exists():
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-1500:]
    assert "interrupted" in err and "Traceback" not in err
    assert not list((tmp_path / "study" / "runs").glob("*.json"))
    sleeper = int((tmp_path / "work" / "study" / "sleep.pid").read_text())
    assert _gone(sleeper), f"the run's process {sleeper} still runs"


def _gone(pid: int, within_s: float = 15) -> bool:
    """PID has ended (or is a zombie) within WITHIN_S seconds of its tree being stopped."""
    from harness import proc as proclib

    deadline = time.time() + within_s
    while pid in proclib.tree_pids(pid):  # the live (not zombie) processes, as the stopper sees them
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_report_only_rewrites_the_report_from_recorded_runs_and_runs_nothing(tmp_path, monkeypatch):
    from harness.bench import runs as runlib

    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    runs = [runlib.Run(f"r{i}", {"seed": i}, ["--seed", str(i)], str(tmp_path)) for i in (1, 2)]
    store = tmp_path / "study" / "runs"
    store.mkdir(parents=True)
    atomic.write_json(store / "r1.json", {"id": "r1", "key": runs[0].key(), "status": "ok"})
    ran = []
    res = runlib.run_study("study", tmp_path, runs, lambda recs: {"recorded": sorted(recs)},
                           lambda res, path: path.write_bytes(b"png"), lambda res: f"recorded {res['recorded']}",
                           "caption", jobs=1, execute=lambda r, work: ran.append(r.id), report_only=True)
    assert ran == [] and res == {"recorded": ["r1"]}
    assert (tmp_path / "study.md").read_text().startswith("recorded ['r1']")
    assert sorted(p.name for p in store.iterdir()) == ["r1.json"]


def test_a_study_that_records_no_new_run_leaves_its_committed_report_alone(tmp_path, monkeypatch):
    """Every run recorded (a fresh clone of the committed results): the study runs nothing and rewrites
    none of STUDY.{json,md,png} (their date, machine and command stay those of the runs); --report-only
    rewrites them, and so does a run recorded now."""
    from harness.bench import runs as runlib

    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    runs = [runlib.Run(f"r{i}", {}, ["--seed", str(i)], str(tmp_path)) for i in (1, 2)]
    store = tmp_path / "study" / "runs"
    store.mkdir(parents=True)
    for r in runs[:1]:
        atomic.write_json(store / f"{r.id}.json", {"id": r.id, "key": r.key(), "status": "ok"})
    committed = {f"study.{ext}": f"committed {ext}" for ext in ("json", "md", "png")}
    for name, text in committed.items():
        (tmp_path / name).write_text(text)
    ran = []
    study = lambda **kw: runlib.run_study(  # noqa: E731
        "study", tmp_path, runs, lambda recs: {"recorded": sorted(recs)},
        lambda res, path: path.write_bytes(b"png"), lambda res: f"recorded {res['recorded']}", "caption", jobs=1,
        execute=lambda r, work: ran.append(r.id) or {"id": r.id, "key": r.key(), "status": "ok"}, **kw)
    assert study(only=["r1"]) == {"recorded": ["r1"]} and ran == []  # recorded already: nothing new
    assert {n: (tmp_path / n).read_text() for n in committed} == committed
    assert study(report_only=True) == {"recorded": ["r1"]} and ran == []
    assert (tmp_path / "study.md").read_text().startswith("recorded ['r1']")
    (tmp_path / "study.md").write_text("committed md")
    assert study() == {"recorded": ["r1", "r2"]} and ran == ["r2"]  # a new run: the report follows it
    assert (tmp_path / "study.md").read_text().startswith("recorded ['r1', 'r2']")

def test_plateau_continues_only_a_quality_run_that_finished(tmp_path):
    """A quality run interrupted on its way to the cap (its checkpoint_last.pt from epoch 3, say) is
    resumed as the quality run; only one that train.sh booked as ended (outcome 0) is trained on."""
    from harness.bench import plateau

    run = tmp_path / "multi30k-tfixup"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint_last.pt").write_bytes(b"x")
    assert not plateau._finished(run)  # no train_runs.tsv
    (run / "train_runs.tsv").write_text("1\t2\t1\tcpu\tinterrupted\n")
    assert not plateau._finished(run)
    (run / "train_runs.tsv").write_text("1\t2\t1\tcpu\tinterrupted\n3\t4\t1\tcpu\t0\n")
    assert plateau._finished(run)


def test_plateau_smoke_continues_the_quality_run_through_train_and_evaluate(iwslt_bin, tmp_path):
    """The plateau study's smoke, through train.sh -> evaluate.sh on the shared real data-bin (60 test
    sentences): its first stage is the quality study's run (recorded there: curves, test BLEU with its
    signature, samples), which it then trains on in the same folder, resumed, and evaluates again."""
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness.bench.plateau", "--smoke", "--iwslt", str(iwslt_bin), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=BENCH_ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    qrec = json.loads((out / "quality" / "runs" / "iwslt-tfixup.json").read_text())
    assert qrec["status"] == "ok", qrec.get("error_tail")
    assert qrec["valid_curve"] and qrec["bleu_curve"] and qrec["valid_curve"][-1][0] == 20
    assert all(b is not None and 0 <= b <= 100 for _, b in qrec["bleu_curve"])
    assert qrec["test"]["sentences"] == 60 and 0 <= qrec["test"]["bleu_tok"] <= 100
    assert qrec["test"]["sacrebleu_signature"].startswith("nrefs:1|case:lc")
    assert len(qrec["samples"]) == 3 and all(s["source"] and s["reference"] for s in qrec["samples"])
    assert len(qrec["test_hypotheses"]) == 60
    assert "--eval-bleu" in qrec["train_command"] and "CLIP_NORM=0" in qrec["train_command"]
    res = check_outputs(out, "plateau")
    (rec,) = res["records"].values()
    assert rec["status"] == "ok", rec.get("error_tail")
    assert rec["continues"] == "iwslt-tfixup" and rec["at_cap"]["test"]["bleu_tok"] == qrec["test"]["bleu_tok"]
    # resumed at the quality run's 20 updates, trained to 40 (smoke cap), one curve over both calls
    assert [u for u, _ in rec["valid_curve"]][-1] == 40 and rec["train_segments"] == 2
    assert "--best-checkpoint-metric bleu" in rec["train_command"] and "MAX_UPDATE=40" in rec["train_command"]
    work = tmp_path / "bench-work" / "quality" / "iwslt-tfixup"
    # generation is capped at 1.2 x source + 10 tokens (fairseq applies it to the batch's longest
    # source); without the cap an untrained model writes 200 tokens per sentence
    cmd = (work / "eval" / "generate-test.cmd").read_text().split()
    assert cmd[cmd.index("--max-len-a") + 1] == "1.2" and cmd[cmd.index("--max-len-b") + 1] == "10"
    lines = (work / "eval" / "generate-test.txt").read_text().splitlines()
    longest_source = max(len(l.split("\t")[1].split()) for l in lines if l.startswith("S-"))
    longest_hyp = max(len(l.split("\t")[2].split()) for l in lines if l.startswith("H-"))
    assert longest_hyp <= 2.4 * longest_source + 10  # a source word is rarely over 2 BPE pieces
    assert not (work / "checkpoints").exists()  # removed once the plateau run is recorded


def test_progress_lines_read_the_log_where_a_run_trains(tmp_path, monkeypatch):
    """A study whose runs train in another folder (the plateau's, in the quality study's) names it with
    run_dir, and its progress lines show the update reached there, not "starting". The run ends once a
    progress line has been said (the event, not a clock: a line is due every heartbeat_s while it runs)."""
    import threading
    from harness.bench import runs as runlib

    elsewhere = tmp_path / "quality" / "q-run"
    elsewhere.mkdir(parents=True)
    (elsewhere / "train.log").write_text('2026-11-26 00:14:28 | INFO | train_inner | {"epoch": 3, "update": 2.5, '
                                         '"loss": "5.1", "num_updates": "321"}\n')
    said, progress = [], threading.Event()

    def log(msg):
        said.append(msg)
        if msg.startswith("running: "):
            progress.set()

    monkeypatch.setattr(runlib.common, "log", log)

    def execute(run):
        progress.wait(120)  # generous: a loaded machine may be slow to say it; the assert below tells
        return {"id": run.id, "key": run.key(), "status": "ok"}

    run = runlib.Run("p-run", {}, [], "data")
    runlib.run_all([run], tmp_path / "store", execute, work=tmp_path / "plateau", jobs=1, heartbeat_s=0.05,
                   run_dir=lambda rid: elsewhere)
    assert progress.is_set(), said
    assert "running: p-run (update 321)" in said, said


def test_two_commands_sharing_a_study_never_train_one_run_twice(tmp_path, capsys):
    """A run another command holds (its lock taken) is left to it, and one that another command recorded
    after this one made its list is not trained again; the rest run and are recorded."""
    from harness.bench import runs as runlib

    work, store = tmp_path / "work", tmp_path / "store"
    held, late, free = (runlib.Run(i, {}, [], "data") for i in ("held", "late", "free"))
    trained = []

    def execute(run):
        trained.append(run.id)
        if run.id == "free":  # meanwhile another command records "late"
            atomic.write_json(store / "late.json", {"id": "late", "key": late.key(), "status": "ok"})
        return {"id": run.id, "key": run.key(), "status": "ok"}

    with runlib.locked(work / ".locks" / "held.lock"):
        records = runlib.run_all([held, free, late], store, execute, work=work, jobs=1)
    assert trained == ["free"] and set(records) == {"free"}
    assert sorted(p.stem for p in store.glob("*.json")) == ["free", "late"]
    out = capsys.readouterr()
    assert "held: running in another command" in out.out + out.err
    assert "late: recorded by another command meanwhile" in out.out + out.err
