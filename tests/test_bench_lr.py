"""The learning-rate study (harness/bench/lr.py): how its grid grows from the records, the best lr, the lr
range and T-Fixup's ratio at the best lrs on known records, and a --smoke run end to end on the real data."""

import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from harness.bench import lr  # noqa: E402

LEVEL = {"train_fit": 9.8, "oracle": 9.5}
THRESHOLD = {"translation": 8.8}
DATA = {"translation": "/data/iwslt14-v1000"}


def cfg(**kw):
    c = lr.make_config(lr.parser().parse_args(["--out", "-", "--smoke"]))
    c.update({"lrs": [1e-3, 2e-3], "max_lr": 8e-3, "seeds": [1, 2], "arms": ["tfixup", "postln_matched"], **kw})
    return c


def record(run, curve, status="ok"):
    return {"id": run.id, **run.meta, "status": status, "valid_curve": curve, "command": "fairseq-train --cpu",
            "wall_s": 1.0}


def test_arms_come_from_the_method_table():
    got = lr.study_arms("translation")
    assert (got["tfixup"].method, got["tfixup"].schedule) == ("tfixup", "nowarmup")
    assert (got["postln_matched"].method, got["postln_matched"].schedule) == ("postln", "matched")
    assert set(got) >= {"tfixup", "postln_matched", "preln_matched"}
    assert lr.study_arms("lm")["preln_matched"].method == "preln"


def test_the_grid_doubles_while_a_method_trains_then_adds_the_second_seed():
    c = cfg()
    runs = lr.plan(c, DATA, {}, THRESHOLD)
    # every arm at the lr nearest the studies' two first (a study cut short has whole columns)
    assert [r.id for r in runs] == ["mt-tfixup-lr0.001-s1", "mt-postln_matched-lr0.001-s1",
                                    "mt-tfixup-lr0.002-s1", "mt-postln_matched-lr0.002-s1"]
    by_id = {r.id: r for r in runs}
    recs = {
        # T-Fixup trains at both: the grid grows to 4e-3
        "mt-tfixup-lr0.001-s1": record(by_id["mt-tfixup-lr0.001-s1"], [(4, 8.0), (8, 7.5)]),
        "mt-tfixup-lr0.002-s1": record(by_id["mt-tfixup-lr0.002-s1"], [(4, 7.8), (8, 7.2)]),
        # Post-LN diverges at 2e-3: its grid is closed, its best lr 1e-3, its second seed there
        "mt-postln_matched-lr0.001-s1": record(by_id["mt-postln_matched-lr0.001-s1"], [(4, 8.5), (8, 8.0)]),
        "mt-postln_matched-lr0.002-s1": record(by_id["mt-postln_matched-lr0.002-s1"], [(4, 9.9)], status="nan"),
    }
    ids = [r.id for r in lr.plan(c, DATA, recs, THRESHOLD)]
    assert "mt-tfixup-lr0.004-s1" in ids and "mt-tfixup-lr0.002-s2" not in ids
    assert "mt-postln_matched-lr0.001-s2" in ids and "mt-postln_matched-lr0.004-s1" not in ids


def test_the_grid_stops_at_max_lr():
    c = cfg(max_lr=2e-3)
    runs = lr.plan(c, DATA, {}, THRESHOLD)
    recs = {r.id: record(r, [(4, 8.0), (8, 8.0 - r.meta["lr"] * 500)]) for r in runs}  # lower at 2e-3
    ids = [r.id for r in lr.plan(c, DATA, recs, THRESHOLD)]
    assert "mt-tfixup-lr0.004-s1" not in ids and "mt-tfixup-lr0.002-s2" in ids  # best: the lowest loss


def test_best_lr_range_and_ratio_on_known_records(monkeypatch):
    monkeypatch.setattr(lr.common, "data_description", lambda d: "synthetic")
    c = cfg()
    c["translation"] = dict(c["translation"], valid_every=4)
    mk = lambda arm, x, seed: lr._run(c, "translation", DATA, arm, x, seed)  # noqa: E731
    recs = {}
    for run, curve, status in [
            (mk("tfixup", 1e-3, 1), [(4, 8.6), (8, 8.0), (12, 7.6), (16, 7.5)], "ok"),
            (mk("tfixup", 2e-3, 1), [(4, 8.2), (8, 7.4), (12, 7.0), (16, 6.9)], "ok"),
            (mk("tfixup", 4e-3, 1), [(4, 9.9), (8, 9.9)], "ok"),  # stuck: the range ends at 2e-3
            (mk("tfixup", 2e-3, 2), [(4, 8.3), (8, 7.5), (12, 7.1), (16, 7.0)], "ok"),
            (mk("postln_matched", 1e-3, 1), [(4, 9.0), (8, 8.4), (12, 8.0), (16, 7.4)], "ok"),
            (mk("postln_matched", 2e-3, 1), [(4, 9.8)], "nan"),
            (mk("postln_matched", 1e-3, 2), [(4, 9.0), (8, 8.4), (12, 7.6), (16, 7.5)], "ok")]:
        recs[run.id] = record(run, curve, status)
    res = lr.summarise(c, recs, {"translation": LEVEL}, DATA, 1.0, planned=len(recs))
    p = res["parts"]["translation"]
    assert p["methods"]["tfixup"]["best_lr"] == 2e-3 and p["methods"]["tfixup"]["lr_range"] == (1e-3, 2e-3)
    assert p["methods"]["postln_matched"]["best_lr"] == 1e-3
    assert p["methods"]["postln_matched"]["lr_range"] == (1e-3, 1e-3)
    assert p["methods"]["tfixup"]["grid_closed"] and p["methods"]["postln_matched"]["grid_closed"]
    v = p["versus"]["postln_matched"]
    # seed 1: Post-LN's best 7.4 at 16; T-Fixup (2e-3, s1) is below 7.4 at update 8: 8/16; seed 2: 7.5 at 16,
    # T-Fixup (2e-3, s2) at 8 (7.5 <= 7.5): 8/16; the step is 4/16
    assert [q["ratio"] for q in v["pairs"]] == [0.5, 0.5] and v["step_max"] == 0.25
    assert res["complete"] and p["device"] == "cpu"
    text = lr.report(res)
    assert "NaN" in text and "STUCK" in text and "0.001 - 0.002" in text


def test_tight_range_half_budget_ratio_and_mixed_devices(monkeypatch):
    """Beside the 1-bit "trains" range, the range within TIGHT_BITS of the method's own best; each seed pair's
    ratio with both runs cut at half the budget, whether the method was still improving, and the devices of a
    pair that trained on two."""
    monkeypatch.setattr(lr.common, "data_description", lambda d: "synthetic")
    c = cfg(lrs=[1e-3, 2e-3, 4e-3], max_lr=4e-3, seeds=[1])
    c["translation"] = dict(c["translation"], valid_every=4, updates=16)
    mk = lambda arm, x, seed: lr._run(c, "translation", DATA, arm, x, seed)  # noqa: E731
    recs = {}
    for run, curve in [(mk("tfixup", 1e-3, 1), [(4, 8.6), (8, 8.0), (16, 7.3)]),
                       (mk("tfixup", 2e-3, 1), [(4, 8.5), (8, 7.4), (12, 7.0), (16, 6.9)]),
                       (mk("tfixup", 4e-3, 1), [(4, 8.5), (16, 8.4)]),  # trains, 1.5 bit behind its best
                       (mk("postln_matched", 1e-3, 1), [(4, 9.0), (8, 8.4), (12, 8.0), (16, 7.4)]),
                       (mk("postln_matched", 2e-3, 1), [(4, 9.0), (8, 8.5), (16, 8.2)]),
                       (mk("postln_matched", 4e-3, 1), [(4, 9.9)])]:
        recs[run.id] = record(run, curve)
    recs[mk("postln_matched", 1e-3, 1).id]["device"] = "NVIDIA H100"
    p = lr.summarise(c, recs, {"translation": LEVEL}, DATA, 1.0, planned=len(recs))["parts"]["translation"]
    assert p["methods"]["tfixup"]["lr_range"] == (1e-3, 4e-3)
    assert p["methods"]["tfixup"]["lr_range_tight"] == (1e-3, 2e-3)  # 7.3 within 0.5 bit of 6.9, 8.4 not
    pair = p["versus"]["postln_matched"]["pairs"][0]
    # Post-LN's best 7.4 at 16 (its last validation); T-Fixup reaches it at 8: 0.5. Cut at 8: Post-LN's best 8.4
    # at 8, T-Fixup below it at 8: 1.0
    assert pair["ratio"] == 0.5 and pair["method_still_improving"] and pair["ratio_at_half_budget"] == 1.0
    assert pair["devices"] == ["cpu", "NVIDIA H100"]
    text = lr.report(lr.summarise(c, recs, {"translation": LEVEL}, DATA, 1.0, planned=len(recs)))
    assert "T-Fixup on cpu, the method on NVIDIA H100" in text and "yes, 1.000 at 8" in text


def test_dyt_derf_and_pre_ln_run_both_ways_in_translation_only():
    got = lr.study_arms("translation")
    for name in ("dyt", "derf", "preln"):
        assert {name, name + "_matched"} <= set(got), name
        assert got[name].schedule == "nowarmup" and got[name + "_matched"].schedule == "matched"
    assert "postln" not in got and "dyt" not in lr.study_arms("lm")


def test_the_language_model_runs_a_third_seed_at_each_best_lr():
    c = lr.make_config(lr.parser().parse_args(["--out", "-", "--data", "d"]))
    assert lr.seeds(c, "lm") == [1, 2, 3] and lr.seeds(c, "translation") == [1, 2]


def test_device_words():
    assert lr.devices(["cuda"]) == {"translation": "cuda", "lm": "cuda"}
    assert lr.devices(["translation=cuda"]) == {"translation": "cuda", "lm": "cpu"}
    with pytest.raises(SystemExit, match="PART=DEVICE"):
        lr.devices(["gpu"])


def test_smoke_runs_end_to_end(tmp_path, iwslt_bin, monkeypatch, fairseq_train_here):
    """The study's main() on the real data, its runs trained in this process (conftest.fairseq_train_here)."""
    out = tmp_path / "out"
    monkeypatch.setenv("TFIXUP_BENCH_WORK", str(tmp_path / "work"))
    assert lr.main(["--smoke", "--out", str(out), "--data", str(iwslt_bin), "--jobs", "1", "--rounds", "1"]) == 0
    res = json.loads((out / "lr.json").read_text())
    assert res["runs_recorded"] == 2 and (out / "lr.png").read_bytes()[:4] == b"\x89PNG"
    assert all(r["device"] == "cpu" for r in res["records"].values())
