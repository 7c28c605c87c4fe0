"""Large batch without warmup (paper Fig. 4c): T-Fixup at 1x, 2x, 4x and 8x the batch.

The batch grows with ``--update-freq`` (k batches of ``max_tokens`` summed into one update, as k GPUs would); model,
lr, schedule (no warmup) and seed are fixed. The paper reports that convergence speed scales with the batch: for
each k we measure the updates to reach the valid loss the 1x run reaches at half its budget (the same, reachable
target for all); perfect scaling halves them per doubling. Larger batches get proportionally fewer updates, with 2x
slack (``budget``). Resumable: finished runs are recorded under OUT/batch/runs/.

    python -m harness.bench.batch --smoke --out /tmp/batch
    python -m harness.bench.batch --out results/bench
"""

import math
import pathlib
import statistics
import sys

from harness.bench import common, runs as runlib
from tfixup import atomic

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, layers=2, multipliers=[1, 2], updates=8, valid_every=2,
                  max_tokens=512, valid_lines=50, test_lines=10),
    "default": dict(embed=128, ffn=256, heads=4, layers=6, multipliers=[1, 2, 4, 8], updates=800, valid_every=50,
                    max_tokens=2048, valid_lines=1000, test_lines=0),
}


def budget(cfg: dict, k: int) -> tuple:
    """(update budget, validation interval) for multiplier k: 2x the ideal budget updates/k/2, and
    a validation interval that resolves it as finely as 1x's."""
    updates = cfg["updates"] if k == 1 else max(2, math.ceil(cfg["updates"] / k))
    return updates, max(1, cfg["valid_every"] // k)


def make_runs(cfg: dict, data: pathlib.Path) -> list:
    out = []
    for k in cfg["multipliers"]:
        updates, every = budget(cfg, k)
        recipe = common.recipe(cfg, "tfixup", lr=cfg["lr"], seed=cfg["seed"], max_update=updates,
                               decay_period=cfg["decay_period"])
        args = common.train_args(recipe) + ["--update-freq", k] + common.valid_args(every)
        out.append(runlib.Run(f"tfixup-x{k}", dict(multiplier=k, updates=updates), args, str(data)))
    return out


def summarise(cfg: dict, records: dict, level: dict, data: pathlib.Path) -> dict:
    base, target = records.get("tfixup-x1"), None
    if base and base["valid_curve"] and base["status"] == "ok":
        target = common.best([p for p in base["valid_curve"] if p[0] <= cfg["updates"] // 2])[1]
    rows = [{"multiplier": rec["multiplier"], "updates": rec["updates"], "status": rec["status"],
             "diverged": rec["status"] == "nan", "updates_to_target": common.reach(rec["valid_curve"], target),
             "final_valid": rec["valid_curve"][-1][1] if rec["valid_curve"] else None,
             "tokens_per_update": cfg["max_tokens"] * rec["multiplier"], "wall_s": rec["wall_s"]}
            for rec in sorted(records.values(), key=lambda r: r["multiplier"])]
    factors = [round(b["updates_to_target"] / a["updates_to_target"], 3) for a, b in zip(rows, rows[1:])
               if a["updates_to_target"] and b["updates_to_target"] and b["multiplier"] == 2 * a["multiplier"]]
    return {**common.study_result("batch", cfg, data, records, unigram_level=level, target_valid_loss=target),
            "rows": rows, "factor_per_doubling": factors,
            "factor_per_doubling_mean": round(statistics.mean(factors), 3) if factors else None,
            "any_diverged": any(r["diverged"] for r in rows), "records": records}


def report(res: dict) -> str:
    cfg = res["config"]
    return runlib.report_head("Large batch without warmup (paper Fig. 4c), T-Fixup", res, cfg["n_runs"], (
        f"T-Fixup {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers, lr {cfg['lr']}, "
        f"lr*sqrt(P/(P+t)), P = {cfg['decay_period']}, no warmup; batch = update-freq k x {cfg['max_tokens']} tokens. "
        f"Target: valid loss {res['target_valid_loss']} bits (the 1x run's best by update {cfg['updates'] // 2}); "
        f"unigram level {res['unigram_level']['train_fit']} bits.\n\n"
        + common.md_table(["batch", "tokens per update", "updates run", "status", "updates to target", "final valid",
                           "wall s"],
                          [[f"{r['multiplier']}x", r["tokens_per_update"], r["updates"], r["status"],
                            r["updates_to_target"], r["final_valid"], r["wall_s"]] for r in res["rows"]])
        + f"\n\nUpdates to the target, 2k / k (perfect scaling: 0.5): {res['factor_per_doubling'] or 'n/a'}; "
        f"mean {res['factor_per_doubling_mean']}. Diverged: {'yes' if res['any_diverged'] else 'none'}.\n"))


def plot(res: dict, path: pathlib.Path) -> None:
    fig, axes = common.pyplot().subplots(1, 2, figsize=(10, 4))
    for rec in sorted(res["records"].values(), key=lambda r: r["multiplier"]):
        if rec["valid_curve"]:
            u, l = zip(*rec["valid_curve"])
            axes[0].plot(u, l, label=f"{rec['multiplier']}x")
            axes[1].plot([x * rec["multiplier"] for x in u], l, label=f"{rec['multiplier']}x")
    for ax, xl in zip(axes, ("updates", "updates x batch multiplier (tokens seen / batch)")):
        if res["target_valid_loss"] is not None:
            ax.axhline(res["target_valid_loss"], color="gray", ls=":", label="target")
        common.finish_axes(ax, xl, "valid loss (bits)")
    axes[0].set_title("valid loss vs updates", fontsize=9)
    axes[1].set_title("same, vs data seen (curves coincide if per-token progress is unchanged)", fontsize=8)
    atomic.save_figure(path, fig)


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "batch.{json,md,png}, batch/runs/")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one thread each)")
    p.add_argument("--multipliers", type=int, nargs="+")
    p.add_argument("--updates", type=int, help="update budget of the 1x run")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--decay-period", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    return p


def make_config(args) -> dict:
    if args.multipliers and 1 not in args.multipliers:
        raise SystemExit("error: --multipliers must include 1 (the run that sets the target)")
    return runlib.with_overrides(dict(MODES[args.mode], mode=args.mode, lr=args.lr, decay_period=args.decay_period,
                                      seed=args.seed), args, ("multipliers", "updates"))


def plan(data, mode: str = "default") -> list:
    return runlib.default_plan(sys.modules[__name__], data, mode)


def main(argv=None):
    args, cfg, data, level, all_runs = runlib.iwslt_setup(sys.modules[__name__], argv)
    runlib.run_study("batch" + args.tag, args.out, all_runs, lambda recs: summarise(cfg, recs, level, data),
                     plot, report, "large-batch study", args.jobs, args.threads, report_only=args.report_only,
                     only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
