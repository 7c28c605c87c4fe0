"""Every committed run record is a run of its study's plan, made by the same command (its key): a change
to a study or to the command builder that would silently turn the committed results into records of
other runs (and rerun them) fails here. And every method row of tfixup/methods.py is planned by
each study it names, with no code of the study naming it."""

import dataclasses
import json
import pathlib

import pytest

from conftest import REPO
from harness.bench import batch, common, convergence, depth, hf, lm, plateau, quality
from tfixup import methods

RESULTS = REPO / "results" / "bench"
IWSLT, MULTI30K = pathlib.Path("/data/iwslt14-v1000"), pathlib.Path("/data/multi30k.de-en")
LM_DATA = pathlib.Path("/data/lm-multi30k-en-t0-v0")
PLANS = {
    "convergence": lambda: convergence.plan(IWSLT), "depth": lambda: depth.plan(IWSLT),
    "batch": lambda: batch.plan(IWSLT), "quality": lambda: quality.plan({"multi30k": MULTI30K, "iwslt": IWSLT}),
    "plateau": lambda: plateau.plan({"multi30k": MULTI30K}),
    "lm": lambda: lm.plan(LM_DATA),
    "hf": lambda: hf.plan(pathlib.Path("/data/hf-data")),
}


@pytest.mark.parametrize("study", PLANS)
def test_every_committed_record_is_a_planned_run_with_its_key(study):
    planned = {r.id: r.key() for r in PLANS[study]()}
    assert len(planned) == len(PLANS[study]())  # ids are unique
    for path in sorted((RESULTS / study / "runs").glob("*.json")):
        rec = json.loads(path.read_text())
        assert rec["id"] == path.stem and rec["id"] in planned, path.name
        assert rec["key"] == planned[rec["id"]], f"{path.name}: planned with another command than it ran"


def test_a_new_method_row_appears_in_every_study_it_names(monkeypatch):
    """Adding a method is its module plus one row: a throwaway row shows up in each study's plan."""
    row = dataclasses.replace(methods.METHODS["postln"], label="Throwaway")
    monkeypatch.setitem(methods.METHODS, "throwaway", row)
    for module in (convergence, quality, depth, lm):
        monkeypatch.setattr(module, "ARMS", module.study_arms())
    arms = {"convergence": {r.meta["method"] for r in convergence.plan(IWSLT)},
            "quality": {r.meta["method"] for r in quality.plan({"multi30k": MULTI30K})},
            "depth": {r.meta["method"] for r in depth.plan(IWSLT)},
            "lm": {r.meta["method"] for r in lm.plan(LM_DATA)}}
    assert {"throwaway_warmup", "throwaway_matched"} <= arms["convergence"]
    assert {"throwaway", "throwaway_matched"} <= arms["quality"]
    assert "throwaway" in arms["depth"]
    assert "throwaway_matched" in arms["lm"]  # a row with a language model (lm_arch), trained with warmup


def test_a_layernorm_free_row_is_run_both_ways_and_at_the_deepest_depth(monkeypatch):
    """A LayerNorm-free row (``layernorm_free``) is asked whether it needs warmup (convergence: all three
    schedules, whichever its paper trains with) and runs at 200 layers per side (depth); a row with
    LayerNorm stops at 100, as do the methods beyond the paper's three."""
    monkeypatch.setitem(methods.METHODS, "free_w", dataclasses.replace(methods.METHODS["postln"], label="Free W",
                                                                    layernorm_free=True))
    monkeypatch.setitem(methods.METHODS, "free_n", dataclasses.replace(methods.METHODS["radam"], label="Free N",
                                                                    layernorm_free=True))
    monkeypatch.setitem(methods.METHODS, "normed", dataclasses.replace(methods.METHODS["postln"], label="Normed"))
    for module in (convergence, depth):
        monkeypatch.setattr(module, "ARMS", module.study_arms())
    arms = {r.meta["method"] for r in convergence.plan(IWSLT)}
    for name in ("free_w", "free_n"):
        assert {name + "_warmup", name + "_matched", name} <= arms
    assert {"normed_warmup", "normed_matched"} <= arms and "normed" not in arms
    ids = {r.id for r in depth.plan(IWSLT)}
    assert {"free_w-200", "free_n-200", "normed-100", "postln-200", "preln-200", "tfixup-200"} <= ids
    assert "normed-200" not in ids and "dlcl-200" not in ids


def test_the_studies_plan_dyt_and_rezero():
    convergence_ids = {r.id for r in convergence.plan(IWSLT)}
    for lr in ("0.001", "0.0005"):
        for arm in ("dyt_warmup", "dyt_matched", "dyt", "rezero", "rezero_warmup", "rezero_matched"):
            assert f"main-{arm}-lr{lr}-s1" in convergence_ids
    assert {f"{m}-{d}" for m in ("dyt", "rezero") for d in (6, 20, 50, 100, 200)} <= {r.id for r in depth.plan(IWSLT)}
    assert {"multi30k-dyt", "multi30k-dyt_matched", "multi30k-rezero"} <= {
        r.id for r in quality.plan({"multi30k": MULTI30K})}
    assert {f"L{n}-{a}-lr0.001-s1" for n in (6, 24) for a in ("dyt_matched", "rezero")} <= {
        r.id for r in lm.plan(LM_DATA)}


def test_every_method_has_a_color_of_its_own():
    colors = [m.color for m in methods.METHODS.values()] + [common.POSTLN_NO_WARMUP_COLOR]
    assert len(set(colors)) == len(colors)


def test_an_arm_is_drawn_in_its_methods_color_but_post_ln_without_warmup_beside_post_ln_with_it():
    for study in (convergence, lm):  # Post-LN both ways
        assert study.ARMS["postln"].color == common.POSTLN_NO_WARMUP_COLOR
        assert study.ARMS["postln_matched"].color == methods.method("postln").color
    assert depth.ARMS["postln"].color == quality.ARMS["postln"].color == methods.method("postln").color
    assert {a.color for a in quality.ARMS.values() if a.method == "tfixup"} == {methods.method("tfixup").color}


def test_the_wide_plateau_runs_are_the_same_three_methods_at_256_512_4_under_names_of_their_own():
    narrow = {r.id: r for r in plateau.plan({"multi30k": MULTI30K})}
    wide = plateau.plan({"multi30k": MULTI30K}, "wide")
    assert [r.id for r in wide] == ["multi30k-w256-postln_matched-s1", "multi30k-w256-tfixup-s1",
                                    "multi30k-w256-preln_matched-s1"]
    for run in wide:
        same = narrow[run.id.replace("-w256", "")]
        differ = sorted(set(run.args) ^ set(same.args))
        assert differ == ["EMBED_DIM=128", "EMBED_DIM=256", "FFN_DIM=256", "FFN_DIM=512"], run.id
    # the quality runs they start from are not the quality study's
    _, qcfg = plateau.configs("wide")
    assert quality.make_run(qcfg, {"multi30k": MULTI30K}, "multi30k", "tfixup").id == "multi30k-w256-tfixup"


def test_wide_and_smoke_together_are_refused_with_one_line(capsys):
    with pytest.raises(SystemExit):
        plateau.main(["--wide", "--smoke", "--out", "-", "--iwslt", "x"])
    assert "--wide and --smoke" in capsys.readouterr().err


def test_the_zero_bias_tfixup_row_is_planned_by_convergence_and_depth_with_its_flags():
    """tfixup_zb (transformer_tfixup with --tfixup-zero-attn-bias --tfixup-scale-positions) runs without
    warmup only (a T-Fixup variant is not asked whether it needs warmup) in the convergence and depth studies (as a LayerNorm-free method, to the depth study's deepest
    depth), and in no other."""
    conv = [r for r in convergence.plan(IWSLT) if r.meta["method"].startswith("tfixup_zb")]
    deep = [r for r in depth.plan(IWSLT) if r.meta["method"] == "tfixup_zb"]
    assert "tfixup_zb" in {r.meta["method"] for r in conv} and deep
    assert max(r.meta["depth"] for r in deep) == max(r.meta["depth"] for r in depth.plan(IWSLT))
    for run in conv + deep:
        i = run.args.index("--arch")
        assert run.args[i + 1] == "transformer_tfixup"
        assert {"--tfixup-zero-attn-bias", "--tfixup-scale-positions"} <= set(run.args)
    assert all("inverse_sqrt_nowarmup" in r.args for r in conv + deep)  # T-Fixup's variant: no warmup question
    assert not any(r.meta["method"].startswith("tfixup_zb") for r in quality.plan({"multi30k": MULTI30K}))


def test_the_small_init_post_ln_is_planned_beside_post_ln_and_derf_and_gi_adam_where_their_rows_say():
    """Post-LN with transformers' initialisation runs with every seed wherever Post-LN's headline does (the
    convergence headline on every schedule, warmup or none, the plateau, the quality study's second seed); Derf
    on the warmup schedules and without warmup; GI-Adam without warmup, with its optimizer."""
    conv = {r.id: r for r in convergence.plan(IWSLT)}
    for lr in ("0.001", "0.0005"):
        for arm in ("postln_si", "postln_si_warmup", "postln_si_matched"):
            assert {f"main-{arm}-lr{lr}-s{s}" for s in (1, 2, 3)} <= set(conv)
        for arm in ("derf_warmup", "derf_matched", "derf", "postln_giadam", "preln_giadam"):
            assert f"main-{arm}-lr{lr}-s1" in conv
    assert "--optimizer" in conv["main-postln_giadam-lr0.001-s1"].args
    args = conv["main-postln_giadam-lr0.001-s1"].args
    assert args[args.index("--optimizer") + 1] == "giadam" and "inverse_sqrt_nowarmup" in args
    assert "postln_si_matched" in convergence.BASELINE_SCHEDULES and "postln_si_matched" in plateau.BASELINES
    assert {"multi30k-postln_si_matched-s1", "multi30k-postln_si_matched-s2"} <= {
        r.id for r in plateau.plan({"multi30k": MULTI30K})}
    assert {"multi30k-postln_si", "multi30k-postln_si_matched", "multi30k-postln_si_matched-s2", "multi30k-derf",
            "multi30k-postln_giadam", "multi30k-preln_giadam"} <= {r.id for r in quality.plan({"multi30k": MULTI30K})}
