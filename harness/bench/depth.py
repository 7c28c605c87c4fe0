"""Depth (paper Fig. 4b): 64-128-2 models with 6 to 200 layers per side, no warmup.

Every method of the study at 6, 20, 50 and 100 layers per side; at 200 (``ln_free_from``) the paper's three and
the LayerNorm-free ones, the depth that asks whether a method without LayerNorm still trains. Same data, lr (5e-4),
schedule (lr*sqrt(P/(P+t)), P = 4000: no warmup for anyone) and batch for all. A run is **trained** when its final
valid loss is at least ``--margin`` bits below the unigram level (harness/bench/unigram.py), not when its loss
merely dropped: every model leaves its random start quickly, and one at the unigram level has learnt word
frequencies only. The deepest runs get fewer updates (``--deep-updates``). On CPU only the paper's three methods run
past ``cpu_depth`` (50) layers (a 100-layer run takes about an hour of one core, the other methods' deep runs about
ten CPU-hours more): the report lists the rest with their estimated cost; ``--device cuda`` or ``--only`` runs them.
Resumable: finished runs are recorded under OUT/depth/runs/.

    python -m harness.bench.depth --smoke --out /tmp/depth
    python -m harness.bench.depth --out results/bench
"""

import pathlib
import sys

from harness.bench import common, runs as runlib
from tfixup import atomic, methods


def study_arms() -> dict:
    """name -> common.Arm: every method of the study, every run without warmup (so labelled by the method alone)."""
    return common.arm_table(common.arm(m, "nowarmup", label=methods.method(m).label) for m in methods.studied("depth"))


ARMS = study_arms()
CORE = ["tfixup", "postln", "preln"]  # the paper's comparison: run first, at every depth

MODES = {
    "smoke": dict(depths=[2], methods=["tfixup", "postln"], updates=8, deep_updates=8, deep_from=1000,
                  ln_free_from=1000, cpu_depth=1000, valid_every=4, max_tokens=512, valid_lines=50, test_lines=10),
    "default": dict(depths=[6, 20, 50, 100, 200], methods=None, updates=600, deep_updates=300, deep_from=200,
                    ln_free_from=200, cpu_depth=50, valid_every=50, max_tokens=1024, valid_lines=1000, test_lines=0),
}


def cpu_budget(cfg: dict, runs: list, recorded: set, only: list = None) -> tuple:
    """(runs to plan, runs left out) on CPU: past ``cpu_depth`` layers per side only the paper's three
    methods, besides any run already recorded (on either device) or named in ONLY. On a GPU: every run."""
    if cfg.get("device", "cpu") != "cpu":
        return runs, []
    keep = [r for r in runs if r.meta["depth"] <= cfg["cpu_depth"] or r.meta["method"] in CORE
            or r.id in recorded or r.id in (only or [])]
    return keep, [r for r in runs if r not in keep]


def estimated_hours(records: dict, depth: int, updates: int):
    """One CPU thread's hours for a run of DEPTH layers per side and UPDATES updates: the median wall time
    of the CPU runs recorded alike (None where there is none)."""
    walls = sorted(r["wall_s"] for r in records.values() if r["depth"] == depth and r["updates"] == updates
                   and r.get("wall_s") and r.get("device", "cpu") == "cpu")
    return round(walls[len(walls) // 2] / 3600, 2) if walls else None


def run_of(cfg: dict, data: pathlib.Path, m: str, depth: int) -> runlib.Run:
    updates = cfg["deep_updates"] if depth >= cfg["deep_from"] else cfg["updates"]
    recipe = common.recipe(dict(cfg, embed=64, ffn=128, heads=2, layers=depth), ARMS[m].method, lr=cfg["lr"],
                           seed=cfg["seed"], max_update=updates, schedule="nowarmup", decay_period=cfg["decay_period"])
    args = common.train_args(recipe, cfg.get("device", "cpu")) + common.valid_args(cfg["valid_every"])
    return runlib.Run(f"{m}-{depth}", dict(method=m, depth=depth, updates=updates), args, str(data))


def make_runs(cfg: dict, data: pathlib.Path) -> list:
    """The paper's three methods at every depth first, then the others (from ``ln_free_from`` on: LayerNorm-free)."""
    arms = cfg["methods"] or list(ARMS)  # None: every method of the study
    rest = [m for m in arms if m not in CORE]
    return ([run_of(cfg, data, m, d) for d in cfg["depths"] for m in arms if m in CORE]
            + [run_of(cfg, data, m, d) for d in cfg["depths"] for m in rest
               if d < cfg["ln_free_from"] or methods.method(ARMS[m].method).layernorm_free])


def summarise(cfg: dict, records: dict, level: dict, data: pathlib.Path, margin: float) -> dict:
    threshold = level["train_fit"] - margin
    rows = []
    for rec in records.values():
        curve = rec["valid_curve"]
        final = curve[-1][1] if curve and rec["status"] == "ok" else None
        rows.append({"method": rec["method"], "depth": rec["depth"], "updates": rec["updates"],
                     "status": rec["status"], "final_valid": final, "best_valid": common.best(curve)[1],
                     "trained": final is not None and final <= threshold, "s_per_update": rec.get("s_per_update")})
    rows.sort(key=lambda r: (r["depth"], list(ARMS).index(r["method"])))
    deepest = {m: max((r["depth"] for r in rows if r["method"] == m and r["trained"]), default=None)
               for m in (cfg["methods"] or list(ARMS))}
    left_out = [{**r, "cpu_hours": estimated_hours(records, r["depth"], r["updates"])}
                for r in cfg.get("out_of_budget", [])]
    return {**common.study_result("depth", cfg, data, records, unigram_level=level,
                                  trained_threshold=round(threshold, 4), margin_bits=margin),
            "deepest_trained": deepest, "rows": rows, "out_of_budget": left_out, "records": records}


def report(res: dict) -> str:
    cfg, lv = res["config"], res["unigram_level"]
    text = runlib.report_head("Depth: 64-128-2, 6 to 200 layers per side, no warmup (paper Fig. 4b)", res,
                              cfg["n_runs"], (
        f"lr {cfg['lr']}, lr*sqrt(P/(P+t)) with P = {cfg['decay_period']} for every method (no warmup), "
        f"{cfg['max_tokens']} tokens per update, dropout 0.1, seed {cfg['seed']}; {cfg['updates']} updates, "
        f"**{cfg['deep_updates']} from {cfg['deep_from']} layers per side** (time). Unigram level of the valid set: "
        f"{lv['train_fit']} bits; a run is **trained** when its final valid loss is at most "
        f"{res['trained_threshold']} ({res['margin_bits']} bit below).\n\n"
        + common.md_table(["layers per side", "method", "updates", "status", "final valid", "best valid", "trained",
                           "s/update"],
                          [[r["depth"], ARMS[r["method"]].label, r["updates"], r["status"], r["final_valid"],
                            r["best_valid"], "yes" if r["trained"] else "NO", r["s_per_update"]]
                           for r in res["rows"]])
        + "\n\nDeepest model that trained (layers per side): "
        + ", ".join(f"{ARMS[m].label} {d if d is not None else 'none'}" for m, d in res["deepest_trained"].items())
        + "\n"))
    left = res.get("out_of_budget") or []
    if left:
        text += (f"\n## Not run on CPU ({len(left)} runs, about {sum(r['cpu_hours'] or 0 for r in left):.0f} "
                 f"CPU-hours)\n\nPast {cfg['cpu_depth']} layers per side this machine runs only the paper's three "
                 "methods; each run below would take the hours shown on one CPU thread (the median wall time of the "
                 "runs recorded at its depth). `--device cuda` runs them, as does naming one in `--only`.\n\n"
                 + common.md_table(["run", "layers per side", "method", "updates", "CPU-hours (estimated)"],
                                   [[r["id"], r["depth"], ARMS[r["method"]].label, r["updates"], r["cpu_hours"]]
                                    for r in left]) + "\n")
    return text


def plot(res: dict, path: pathlib.Path) -> None:
    arms = [a for a in ARMS.values() if any(r["method"] == a.name for r in res["records"].values())]
    fig, axes = common.panel_grid(len(arms) + 1, 4, 4.5, 3.8)  # rows: one row of 11 panels was too wide to read
    full = max((r["updates"] for r in res["rows"]), default=0)
    for arm in arms:
        rows = [r for r in res["rows"] if r["method"] == arm.name and r["final_valid"] is not None]
        axes[0].plot([r["depth"] for r in rows], [r["final_valid"] for r in rows], "o-", color=arm.color,
                     label=arm.label)
        # the deepest runs had fewer updates (time): hollow, so that a shorter budget does not read as depth
        short = [r for r in rows if r["updates"] < full]
        axes[0].plot([r["depth"] for r in short], [r["final_valid"] for r in short], "o", color="white",
                     markeredgecolor=arm.color, markersize=6)
    if any(r["updates"] < full for r in res["rows"]):
        axes[0].plot([], [], "o", color="white", markeredgecolor="gray", label=f"hollow: fewer than {full} updates")
    for ax in axes:
        common.level_lines(ax, res["unigram_level"]["train_fit"], res["trained_threshold"], "trained below this")
    axes[0].set_xscale("log")
    common.finish_axes(axes[0], "layers per side", "final valid loss (bits)", "final valid loss vs depth",
                       legend=dict(fontsize=7))
    for ax, arm in zip(axes[1:], arms):
        for rec in sorted(res["records"].values(), key=lambda r: r["depth"]):
            if rec["method"] == arm.name and rec["valid_curve"]:
                ax.plot(*zip(*rec["valid_curve"]), label=f"{rec['depth']}+{rec['depth']}")
        common.finish_axes(ax, "updates", title=f"{arm.label}: valid loss", legend=dict(fontsize=7))
    fig.tight_layout()  # rows of panels: keep titles clear of the axis labels above them
    atomic.save_figure(path, fig)


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "depth.{json,md,png}, depth/runs/")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one thread each)")
    p.add_argument("--depths", type=int, nargs="+", help="layers per side (override the mode's)")
    p.add_argument("--methods", nargs="+", choices=list(ARMS))
    p.add_argument("--updates", type=int, help="updates per run below --deep-from layers")
    p.add_argument("--deep-updates", type=int, help="updates per run from --deep-from layers on")
    p.add_argument("--deep-from", type=int, help="depth from which runs get --deep-updates")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default 5e-4, the paper's)")
    p.add_argument("--decay-period", type=int, default=4000, help="P of inverse_sqrt_nowarmup (default 4000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--margin", type=float, default=1.0, help="bits below the unigram level that count as trained")
    runlib.add_device_option(p)
    return p


def make_config(args) -> dict:
    return runlib.with_overrides(dict(MODES[args.mode], mode=args.mode, lr=args.lr, decay_period=args.decay_period,
                                      seed=args.seed, device=args.device),
                                 args, ("depths", "methods", "updates", "deep_updates", "deep_from"))


def plan(data, mode: str = "default") -> list:
    return runlib.default_plan(sys.modules[__name__], data, mode)


def main(argv=None):
    args, cfg, data, level, all_runs = runlib.iwslt_setup(sys.modules[__name__], argv)
    records = runlib.load_records(pathlib.Path(args.out) / ("depth" + args.tag) / "runs").values()
    recorded = {r.id for r in all_runs if any(r.recorded_by(rec) for rec in records)}
    all_runs, left = cpu_budget(cfg, all_runs, recorded, args.only)
    cfg["out_of_budget"] = [{"id": r.id, **r.meta} for r in left]  # the run's method, depth and updates
    cfg["n_runs"] = len(all_runs)
    runlib.run_study("depth" + args.tag, args.out, all_runs,
                     lambda recs: summarise(cfg, recs, level, data, args.margin), plot, report, "depth study",
                     args.jobs, args.threads, report_only=args.report_only, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
