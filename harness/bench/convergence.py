"""Convergence without warmup (paper Fig. 3c), at the paper's depth, on the real IWSLT'14 De-En sample.

Every method that names this study in tfixup/methods.py against stock fairseq Post-LN with warmup, at the same size,
data, batch and budget: 6+6 layers, the paper's (it notes that Transformers of <= 3 layers train without warmup, so
shallower models cannot show the failure); no warmup is lr*sqrt(P/(P+t)) with the paper's P = 4000; lr 5e-4 (the
paper's) and 1e-3; the baselines warm up over ``warmup`` updates (the paper's 4000 would not end within a CPU
budget); width and batch CPU-sized. A run is **stuck** when its best valid loss is not ``--margin`` bits below the
unigram level (harness/bench/unigram.py). Headline, per lr and seed: updates T-Fixup needs to reach the warmup
baseline's best valid loss / updates the baseline needs. Resumable: runs are recorded under OUT/convergence/runs/.

    python -m harness.bench.convergence --smoke --out /tmp/conv          # < 1 min, for the tests
    python -m harness.bench.convergence --out results/bench              # the study (hours on 2 cores)
"""

import dataclasses
import pathlib
import statistics
import sys

from harness.bench import common, runs as runlib
from tfixup import methods

# Schedules (common.SUFFIX), all with the same peak lr: warmup, fairseq's inverse_sqrt (linear over W updates,
# then lr * sqrt(W / t)); matched, linear over W onto T-Fixup's curve lr * sqrt(P / (P + t)); nowarmup, that
# curve from update 0 (the paper's P); nowarmup_w, with P = W: T-Fixup on (nearly) the old baseline's curve.

# the methods with LayerNorm asked, besides the LayerNorm-free ones, whether they train without warmup: Post-LN
# and Pre-LN, with fairseq's initialisation and with transformers' (the small init)
QUESTION = ("postln", "preln", "postln_si", "preln_si")


def study_arms() -> dict:
    """arm name -> common.Arm, from tfixup/methods.py: a method trained with warmup on both warmups (group main; a
    Fig. 3c arm: matched and none, group fig3c), one trained without, without; QUESTION and every LayerNorm-free
    method but T-Fixup's own on all three schedules (does it train without warmup?); T-Fixup with P = W. A method
    trained both ways has its no-warmup curve dash-dotted."""
    specs = []  # (method, schedule, group)
    for name in methods.studied("convergence"):
        group = "fig3c" if name in methods.ABLATIONS else "main"
        warmups = ("warmup", "matched") if group == "main" else ("matched", "nowarmup")
        specs += [(name, kind, group) for kind in (warmups if methods.method(name).warmup else ("nowarmup",))]
    main = [n for n in methods.studied("convergence") if n not in methods.ABLATIONS]
    question = [n for n in QUESTION if n in main] + [n for n in main
                                                     if methods.method(n).layernorm_free and not methods.is_tfixup(n)]
    specs += [(n, kind, "main") for n in question for kind in methods.SCHEDULES] + [("tfixup", "nowarmup_w", "main")]
    out = {}
    for name, kind, group in specs:  # the first of an arm's specs makes it
        out.setdefault(name + common.SUFFIX[kind], common.arm(name, kind, group=group))
    matched = {a.method for a in out.values() if a.schedule == "matched"}
    return common.arm_table(dataclasses.replace(a, linestyle="-.") if a.schedule == "nowarmup" and a.method in matched
                            else a for a in out.values())


ARMS = study_arms()
BASELINE = "postln_warmup"
# the warmup baseline on each schedule, with fairseq's initialisation and with transformers' (small init):
# T-Fixup's ratio is given against each, and against the better one
BASELINE_SCHEDULES = tuple(a for a in ("postln_warmup", "postln_matched", "postln_si_warmup", "postln_si_matched")
                           if a in ARMS)
# every seed (and a long run): T-Fixup and Post-LN on every schedule, with and without warmup, on each
# initialisation, since any of them may be a baseline's better setting; the other arms the first seed
HEADLINE = ["tfixup", BASELINE, "postln", "postln_matched",
            *(a for a in ("postln_si", *BASELINE_SCHEDULES[2:]) if a in ARMS)]

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, layers=2, updates=8, valid_every=4, seeds=[1], lrs=[1e-3],
                  headline=["tfixup", BASELINE], others=False, sgd_lrs=[],
                  warmup=4, max_tokens=512, long_updates=0, valid_lines=50, test_lines=10),
    # 6+6 (the paper's depth) at a quarter of its small width; 800 updates, enough for the warmup baseline to leave
    # the unigram stage (the report's "stuck" column says whether it did); the long runs show what happens after
    "default": dict(embed=128, ffn=256, heads=4, layers=6, updates=800, valid_every=50, seeds=[1, 2, 3],
                    lrs=[1e-3, 5e-4], headline=HEADLINE, others=True, sgd_lrs=[0.1, 0.3, 1.0],
                    warmup=200, max_tokens=2048, long_updates=2500, valid_lines=1000, test_lines=0),
}


# the settings of a mode that the command line overrides (runs.add_overrides)
OVERRIDES = {**dict.fromkeys(("updates", "warmup", "layers", "embed", "ffn", "heads", "max_tokens", "long_updates"),
                             int), "seeds": [int], "lrs": [float]}


def make_run(cfg: dict, data, arm: str, lr: float, seed: int, updates: int, tag: str, arms: dict = None,
             device: str = "cpu") -> "runlib.Run":
    """One run of ARM (of ``arms``, default this study's) at LR, nothing saved; its id is TAG-ARM-lrLR-sSEED."""
    a = (arms or ARMS)[arm]
    pw = a.schedule == "nowarmup_w"
    recipe = common.recipe(cfg, a.method, lr=lr, seed=seed, max_update=updates, dropout=cfg["dropout"],
                           schedule="nowarmup" if pw else a.schedule,
                           decay_period=cfg["warmup"] if pw else cfg["decay_period"])
    return runlib.Run(f"{tag}-{arm}-lr{lr:g}-s{seed}", dict(method=arm, lr=lr, seed=seed, updates=updates, group=tag),
                      common.train_args(recipe, device) + common.valid_args(cfg["valid_every"]), str(data))


def make_runs(cfg: dict, data: pathlib.Path) -> list:
    """The study's runs, the most informative first: per lr, the headline's arms with every seed, the other main
    arms with the first seed; then the Fig. 3c arms (SGD ones at each of its own lrs); the long runs last."""
    out, first, n = [], cfg["seeds"][0], cfg["updates"]

    def add(arm, lr, seed, updates, tag):
        out.append(make_run(cfg, data, arm, lr, seed, updates, tag, device=cfg.get("device", "cpu")))

    others = [a for a in ARMS.values() if a.name not in cfg["headline"]] if cfg["others"] else []
    for lr in cfg["lrs"]:
        for seed in cfg["seeds"]:
            for arm in cfg["headline"]:
                add(arm, lr, seed, n, "main")
        for a in (a for a in others if a.group == "main"):
            add(a.name, lr, first, n, "main")
    for a in (a for a in others if a.group == "fig3c"):
        for lr in (cfg["sgd_lrs"] if a.method == "sgd" else cfg["lrs"]):
            add(a.name, lr, first, n, "fig3c")
    for arm in cfg["headline"] if cfg["long_updates"] else ():
        add(arm, max(cfg["lrs"]), first, cfg["long_updates"], "long")
    return out


def still_improving(rec: dict) -> bool:
    """The run's best valid loss is its last validation: a ratio against its best holds for this budget only."""
    curve = rec["valid_curve"]
    return rec["status"] == "ok" and bool(curve) and common.best(curve)[0] == curve[-1][0]


def truncated(records: dict, budget: int) -> dict:
    """The records with their valid curves cut at BUDGET updates: each run as if it had stopped there."""
    return {k: {**r, "valid_curve": [p for p in r["valid_curve"] if p[0] <= budget]} for k, r in records.items()}


def curve_row(rec: dict, keys, threshold: float) -> dict:
    """A run's row: KEYS of its record, its best and final valid loss, stuck (failed, or its best above THRESHOLD)."""
    b_upd, b_loss = common.best(rec["valid_curve"])
    return {**{k: rec[k] for k in keys}, "best_valid": b_loss, "best_at": b_upd,
            "final_valid": rec["valid_curve"][-1][1] if rec["valid_curve"] else None,
            "stuck": rec["status"] != "ok" or b_loss is None or b_loss > threshold}


def ratio_to(records: dict, row: dict, arm: str) -> tuple:
    """common.to_best of ROW's run against ARM's run of the same group, lr and seed; (None, None) without one."""
    base = records.get(row["id"].replace(f"-{row['method']}-", f"-{arm}-"))
    if not (base and row["status"] == "ok"):
        return None, None
    return common.to_best(records[row["id"]]["valid_curve"], base["valid_curve"])


def versus(records: dict, here: list, tfixup: list, arms) -> tuple:
    """T-Fixup against each of ARMS among the rows HERE (one group and lr): per arm its mean best valid loss, its
    runs still improving at the end, T-Fixup's ratio over their shared seeds (mean, sd, range); and the better arm
    (the lower mean best valid loss)."""
    out = {}
    for arm in arms:
        ran = [r for r in here if r["method"] == arm and r["best_valid"] is not None]
        if not ran:
            continue
        paired = [r for r in tfixup if f"{r['group']}-{arm}-lr{r['lr']:g}-s{r['seed']}" in records]
        got = [ratio for _, ratio in (ratio_to(records, r, arm) for r in paired) if ratio is not None]
        out[arm] = {"baseline_best_valid_mean": round(statistics.mean(r["best_valid"] for r in ran), 4),
                    "baseline_seeds": len(ran),
                    "baseline_still_improving": sum(still_improving(records[r["id"]]) for r in ran),
                    "seeds": len(paired), "reached": len(got),
                    "ratio_mean": round(statistics.mean(got), 3) if got else None,
                    "ratio_sd": round(statistics.stdev(got), 3) if len(got) > 1 else None,
                    "ratio_min": min(got, default=None), "ratio_max": max(got, default=None)}
    better = min(out, key=lambda a: out[a]["baseline_best_valid_mean"], default=None)
    return out, better


def at_budgets(cfg: dict, records: dict, group: str, lr: float, threshold: float) -> dict:
    """budget -> the headline of one group and lr with every run stopped there: at half its runs' updates and all of
    them (the long runs also at the main runs')."""
    out, n = {}, cfg["long_updates"] if group == "long" else cfg["updates"]
    for budget in sorted({n // 2, n} | ({cfg["updates"]} if group == "long" else set())):
        cut = truncated({k: r for k, r in records.items() if r["group"] == group and r["lr"] == lr}, budget)
        here = [curve_row(r, ("id", "group", "method", "lr", "seed", "status"), threshold) for r in cut.values()]
        per_baseline, better = versus(cut, here, [r for r in here if r["method"] == "tfixup"], BASELINE_SCHEDULES)
        if better:
            out[str(budget)] = {"per_baseline": per_baseline, "better_baseline": better, **per_baseline[better]}
    return out


def summarise(cfg: dict, records: dict, level: dict, data: pathlib.Path, margin: float) -> dict:
    threshold = level["train_fit"] - margin
    rows = [{**curve_row(rec, ("id", "group", "method", "lr", "seed", "updates", "status", "wall_s"), threshold),
             "schedule": ARMS[rec["method"]].schedule} for rec in records.values()]
    # per (group, lr, seed) and baseline schedule: updates to the baseline's best / the baseline's updates
    for r in rows:
        for b in BASELINE_SCHEDULES:
            r[f"updates_to_{b}_best"], r[f"ratio_to_{b}"] = ratio_to(records, r, b)
        # kept under the old names: the ratio to fairseq's inverse_sqrt baseline
        r["updates_to_baseline_best"] = r[f"updates_to_{BASELINE}_best"]
        r["ratio_to_baseline"] = r[f"ratio_to_{BASELINE}"]
    headline, per_method = {}, {}
    schedule_arms = {}  # each baseline of the main group -> its arms on every schedule (not P = W)
    for arm in ARMS.values():
        if arm.group == "main" and arm.method != "tfixup" and arm.schedule in methods.SCHEDULES:
            schedule_arms.setdefault(arm.method, []).append(arm.name)
    for group in ("main", "long"):
        for lr in cfg["lrs"]:
            here = [r for r in rows if r["group"] == group and r["lr"] == lr]
            tfixup = [r for r in here if r["method"] == "tfixup"]
            if not tfixup:
                continue
            stuck = {m: f"{sum(r['stuck'] for r in here if r['method'] == m)}/{sum(r['method'] == m for r in here)}"
                     for m in ARMS if any(r["method"] == m for r in here)}
            per_baseline, better = versus(records, here, tfixup, BASELINE_SCHEDULES)
            headline[f"{group} lr {lr:g}"] = {"stuck": stuck, "per_baseline": per_baseline, "better_baseline": better,
                                              **(per_baseline[better] if better else {}), "tfixup_seeds": len(tfixup),
                                              "at_budget": at_budgets(cfg, records, group, lr, threshold)}
            for name, candidates in schedule_arms.items():
                arms, better = versus(records, here, tfixup, candidates)  # better: of every schedule it ran
                if better:
                    per_method.setdefault(f"{group} lr {lr:g}", {})[name] = {"arms": arms, "better": better}
    sgd_choice = {}
    for m in (a.name for a in ARMS.values() if a.method == "sgd"):
        grid = [r for r in rows if r["method"] == m and r["best_valid"] is not None]
        if grid:
            pick = min(grid, key=lambda r: r["best_valid"])
            sgd_choice[m] = {"lr": pick["lr"], "best_valid": pick["best_valid"], "stuck": pick["stuck"],
                             "grid": {f"{r['lr']:g}": r["best_valid"] for r in sorted(grid, key=lambda r: r["lr"])}}
    return {**common.study_result("convergence", cfg, data, records, unigram_level=level,
                                  stuck_threshold=round(threshold, 4), margin_bits=margin),
            "headline": headline, "per_method": per_method, "sgd_lr_chosen_on_valid": sgd_choice,
            "rows": sorted(rows, key=lambda r: (r["group"], -r["lr"], r["method"], r["seed"])), "records": records}


STATUS = {"nan": "diverged (NaN loss)"}  # a run's status as the report words it, where that differs


def report(res: dict) -> str:
    cfg, lv = res["config"], res["unigram_level"]
    title = f"Convergence without warmup (paper Fig. 3c), {cfg['layers']}+{cfg['layers']} layers"
    text = runlib.report_head(title, res, cfg["n_runs"], (
        f"Model {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers, "
        f"{cfg['max_tokens']} tokens per update, dropout {cfg['dropout']}, Adam (0.9, 0.98), wd 1e-4, label "
        f"smoothing 0.1, no clipping (SGD arms: plain SGD, no momentum). Every run has the same peak lr at its "
        f"lr. Schedules: **no warmup** lr*sqrt(P/(P+t)), P = {cfg['decay_period']} (the paper's; T-Fixup's); "
        f"**warmup** (fairseq's inverse_sqrt) linear from 1e-7 over W = {cfg['warmup']} updates, then "
        f"lr*sqrt(W/t); **matched warmup** (inverse_sqrt_matched) linear from 1e-7 over W = {cfg['warmup']} "
        f"updates onto the no-warmup curve, then that curve: after update W the rate equals T-Fixup's at every "
        f"update, so the method and the warmup are the only differences; **P = W**: no warmup with "
        f"P = {cfg['warmup']}, T-Fixup on nearly the old baseline's curve. "
        f"Valid loss (label-smoothed, bits) every {cfg['valid_every']} updates on "
        f"{res['data_counts'].get('valid')} valid sentences.\n\n"
        f"**Unigram level** of this valid set (computed from the data, harness/bench/unigram.py): "
        f"{lv['train_fit']} bits for the unigram model fit on train ({lv['oracle']} for the best unigram "
        f"model fit on valid itself). A run is **stuck** when its best valid loss is not at least "
        f"{res['margin_bits']} bit below {lv['train_fit']}, i.e. above {res['stuck_threshold']}.\n\n"))
    w, p = cfg["warmup"], cfg["decay_period"]
    text += common.mean_lr_text([("no warmup", "nowarmup", w, p), ("matched warmup", "matched", w, p),
                                 ("warmup", "warmup", w, p), ("P = W", "nowarmup", w, w)],
                                cfg["updates"], cfg["lrs"][0])
    if res["headline"]:
        text += ("## Headline: updates for T-Fixup to reach the baseline's best valid loss / the baseline's updates\n\n"
                 "Against the Post-LN baseline on each schedule, with fairseq's initialisation and with transformers' "
                 "(small init: weights N(0, 0.02)), and against the better of them (**better**: the lower mean best "
                 "valid loss over its seeds). **Still improving**: the baseline's runs whose best valid loss is their "
                 "last validation. A ratio against a baseline that was still improving when the budget ended is a "
                 "bound for that budget, not the ratio of two finished runs: with a longer budget the baseline's "
                 "best moves and the ratio with it. So each ratio is also given with every run stopped at other "
                 "budgets (the same runs' curves, cut there; the long runs go to "
                 f"{cfg['long_updates']} updates).\n\n")
        rows = [[k, ARMS[b].label + (" (**better**)" if b == h.get("better_baseline") else ""), _best_text(pb),
                 _improving(pb), _ratio_text(pb), "; ".join(
                     f"{n}: {_ratio_text(v['per_baseline'][b])}, still improving {_improving(v['per_baseline'][b])}"
                     for n, v in h.get("at_budget", {}).items() if b in v["per_baseline"]) or None]
                for k, h in res["headline"].items() for b, pb in h["per_baseline"].items()]
        text += common.md_table(["runs", "baseline", "its best valid", "still improving", "T-Fixup's ratio",
                                 "at each budget (updates: ratio)"], rows) + "\n\n"
        stuck = {k: [f"{ARMS[m].label} {v}" for m, v in h["stuck"].items() if not v.startswith("0/")]
                 for k, h in res["headline"].items()}
        stuck = "; ".join(f"{k}: " + ", ".join(v) for k, v in stuck.items() if v)
        text += f"Stuck runs (every other run left the unigram stage): {stuck or 'none'}.\n\n"
    text += common.versus_methods_md(
        res.get("per_method"),
        "T-Fixup's updates to reach the method's best valid loss / the method's updates, over the seeds both have (the "
        "better schedule: the lowest mean best valid loss of every schedule the method ran, with or without warmup). "
        "Without warmup: the methods trained so in their papers and those the study also runs without it "
        "(Post-LN, Pre-LN, the LayerNorm-free ones).\n\n",
        ["runs", "method", "best valid, warmup", "T-Fixup's ratio to it", "best valid, matched warmup",
         "T-Fixup's ratio to it", "better schedule", "T-Fixup's ratio to the better", "best valid, no warmup",
         "T-Fixup's ratio to it"], _versus_cells)
    fig3c = [r for r in res["rows"] if r["group"] == "fig3c"]
    if fig3c:
        text += ("## Fig. 3c arms\n\nEach against the same model's Adam runs above (seed 1). SGD: the learning "
                 "rate chosen on valid from the grid " + ", ".join(f"{x:g}" for x in cfg.get("sgd_lrs", []))
                 + ".\n\n" + common.md_table(
                     ["arm", "lr", "status", "best valid", "at update", "final valid", "stuck", "chosen on valid"],
                     [[ARMS[r["method"]].label, r["lr"], STATUS.get(r["status"], r["status"]), r["best_valid"],
                       r["best_at"], r["final_valid"], "STUCK" if r["stuck"] else "no",
                       "yes" if res["sgd_lr_chosen_on_valid"].get(r["method"], {}).get("lr") == r["lr"] else ""]
                      for r in fig3c]) + "\n\n")
    text += "## Every run\n\n" + common.md_table(
        ["group", "lr", "method", "seed", "updates", "status", "best valid", "at update", "final valid", "stuck",
         "ratio to warmup baseline", "ratio to matched baseline", "wall s"],
        [[r["group"], r["lr"], ARMS[r["method"]].label, r["seed"], r["updates"], STATUS.get(r["status"], r["status"]),
          r["best_valid"], r["best_at"], r["final_valid"], "STUCK" if r["stuck"] else "no",
          r.get(f"ratio_to_{BASELINE_SCHEDULES[0]}"), r.get(f"ratio_to_{BASELINE_SCHEDULES[1]}"), r["wall_s"]]
         for r in res["rows"]]) + "\n"
    return text


def _versus_cells(name: str, v: dict) -> list:
    """A method's cells in the T-Fixup-against-every-method table: each warmup, the better schedule, no warmup."""
    def on(kind):
        arm = v["arms"].get(name + common.SUFFIX[kind])
        return [None, None] if arm is None else [_best_text(arm), _ratio_text(arm)]

    better = [common.SCHEDULE_LABEL[ARMS[v["better"]].schedule].lstrip(" +,"), _ratio_text(v["arms"][v["better"]])]
    return on("warmup") + on("matched") + better + on("nowarmup")


def _improving(arm: dict) -> str:
    """'k/n': k of the baseline's n runs were still improving when their budget ended."""
    return f"{arm.get('baseline_still_improving', '?')}/{arm['baseline_seeds']}"


def _best_text(arm: dict) -> str:
    n = arm["baseline_seeds"]
    return f"{arm['baseline_best_valid_mean']:.3f} ({n} seed{'s' if n > 1 else ''})"


def _ratio_text(h: dict):
    if not h or h.get("ratio_mean") is None:
        return None if not h else f"not reached ({h.get('reached', 0)}/{h.get('seeds', 0)})"
    sd = f" ± {h['ratio_sd']:.2f}" if h.get("ratio_sd") is not None else ""
    return f"{h['ratio_mean']:.2f}x{sd} ({h['reached']}/{h['seeds']} reached)"


HEADLINE_PANEL = ["tfixup", "postln_warmup", "postln_matched", "postln", "preln", "tfixup_pw", "radam",
                  "postln_si_warmup", "postln_si_matched"]
FIG3C_REFERENCE = ["tfixup", "postln_matched", "postln"]


def plot(res: dict, path: pathlib.Path) -> None:
    """A panel of valid loss curves per lr for the headline, the other methods and the Fig. 3c arms; the long runs."""
    recs = [r for r in res["records"].values() if r["valid_curve"]]
    out = []  # (title, records) per panel
    for lr in sorted({r["lr"] for r in recs if r["group"] == "main"}, reverse=True):
        main = [r for r in recs if r["group"] == "main" and r["lr"] == lr]
        out.append((f"lr {lr:g}: T-Fixup and the Post-LN/Pre-LN baselines",
                    [r for r in main if r["method"] in HEADLINE_PANEL]))
        out.append((f"lr {lr:g}: the other methods (dashed: inverse_sqrt, solid: matched, dash-dot: no warmup)",
                    [r for r in main if r["method"] not in HEADLINE_PANEL or r["method"] == "tfixup"]))
        arms = [r for r in recs if r["group"] == "fig3c" and (
            r["lr"] == lr if ARMS[r["method"]].method != "sgd"
            else res["sgd_lr_chosen_on_valid"].get(r["method"], {}).get("lr") == r["lr"])]
        if arms:
            ref = [r for r in main if r["method"] in FIG3C_REFERENCE and r["seed"] == 1]
            out.append((f"lr {lr:g} (Adam): Fig. 3c arms; SGD at its lr chosen on valid", ref + arms))
    long = [r for r in recs if r["group"] == "long"]
    if long:
        out.append((f"long runs, lr {max(r['lr'] for r in long):g}", long))
    shown = out or [("no runs yet", [])]
    fig, axes = common.panel_grid(len(shown), 3, 5.6, 4.3)
    for ax, (title, panel) in zip(axes, shown):
        labelled = set()
        for rec in panel:
            a = ARMS[rec["method"]]
            label = a.label + (f" (lr {rec['lr']:g})" if a.method == "sgd" else "")
            ax.plot(*zip(*rec["valid_curve"]), color=a.color, ls=a.linestyle, lw=1.2, alpha=0.8,
                    label=None if a.name in labelled else label)
            labelled.add(a.name)
        common.level_lines(ax, res["unigram_level"]["train_fit"], res["stuck_threshold"], "stuck above this")
        common.finish_axes(ax, "updates", "valid loss (bits, label-smoothed)", title, legend=dict(fontsize=6.5))
    cfg = res["config"]
    common.save_titled_figure(path, fig, f"IWSLT'14 De-En sample, {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, "
                                         f"{cfg['layers']}+{cfg['layers']} layers")


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "convergence.{json,md,png}, convergence/runs/")
    runlib.add_training_options(p, 2, OVERRIDES)
    runlib.add_device_option(p)
    p.add_argument("--methods", nargs="+", choices=list(ARMS),
                   help="run now only the study's runs of these methods (the report covers the whole study)")
    return p


def make_config(args) -> dict:
    """The mode's settings with the command line's overrides."""
    return runlib.with_overrides(dict(MODES[args.mode], mode=args.mode, dropout=args.dropout,
                                      decay_period=args.decay_period, device=args.device), args, OVERRIDES)


def plan(data, mode: str = "default") -> list:
    return runlib.default_plan(sys.modules[__name__], data, mode)


def selected(runs: list, arms) -> list:
    """The runs of ``arms`` (all when none are named), in the study's order."""
    return [r for r in runs if not arms or r.meta["method"] in arms]


def main(argv=None):
    args, cfg, data, level, all_runs = runlib.iwslt_setup(sys.modules[__name__], argv)
    runlib.run_study("convergence" + args.tag, args.out, all_runs,
                     lambda recs: summarise(cfg, recs, level, data, args.margin),
                     plot, report, "valid loss curves", args.jobs, args.threads,
                     todo=selected(all_runs, args.methods), report_only=args.report_only, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
