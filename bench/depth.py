"""Depth (paper Fig. 4b): 64-128-2 models with 6 ... 200 layers per side, no warmup.

  tfixup   transformer_tfixup_deep_narrow (no LayerNorm, T-Fixup init)
  postln   stock fairseq ``transformer`` 64-128-2, Post-LN
  preln    stock fairseq ``transformer`` 64-128-2, Pre-LN

Same data, lr, schedule (inverse_sqrt_nowarmup) and short update budget for all.
Each run is ``fairseq-train --user-dir fairseq_tfixup --cpu`` with a JSON log at
every update; we record the loss of the first and last updates, the valid loss
at the end, NaN/Inf (fairseq stops with FloatingPointError), and the wall time
per update. "trained" means finite and the last updates' train loss at least
``--min-drop`` bits below the first update's. The unigram entropy of the target
side is printed as a reference: a model near it has learnt word frequencies only.

    python -m bench.depth --quick --out /tmp/depth
    python -m bench.depth --out results/bench           # default mode, ~15-20 min
"""

import math
import pathlib
import statistics
import sys
import tempfile

from bench import common

METHODS = {
    "tfixup": ("transformer_tfixup_deep_narrow", [], "T-Fixup"),
    "postln": ("transformer", [], "Post-LN"),
    "preln": ("transformer", ["--encoder-normalize-before", "--decoder-normalize-before"], "Pre-LN"),
}

MODES = {
    "smoke": dict(depths=[2, 6], methods=["tfixup", "postln"], updates=6, max_tokens=512,
                  valid_lines=100, test_lines=30),
    "quick": dict(depths=[6, 24], methods=list(METHODS), updates=15, max_tokens=512,
                  valid_lines=300, test_lines=200),
    "default": dict(depths=[6, 200, 24, 50, 100], methods=list(METHODS), updates=30, max_tokens=256,
                    valid_lines=300, test_lines=200),
}


def unigram_entropy(dict_file: pathlib.Path) -> float:
    """Entropy (bits/token) of the target words' frequencies in the training data (fairseq's dict counts)."""
    counts = [int(line.rsplit(" ", 1)[1]) for line in open(dict_file) if line.strip()]
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c)


def summarise(res: dict, min_drop: float) -> dict:
    train = res["train"]
    losses = [r["loss"] for r in train]
    finite = [l for l in losses if isinstance(l, float) and math.isfinite(l)]
    # seconds per update from fairseq's "ups" at --log-interval 1, skipping the first two (warm-up of caches)
    spu = [1.0 / r["ups"] for r in train[2:] if isinstance(r.get("ups"), float) and r["ups"] > 0]
    first = losses[0] if losses else None
    last = statistics.mean(finite[-10:]) if finite else None
    valid = res["valid"][-1]["valid_loss"] if res["valid"] else None
    ok = res["status"] == "ok"
    return {
        "status": res["status"], "updates_done": int(train[-1]["num_updates"]) if train else 0,
        "first_loss": first, "last_loss_mean10": last,
        "valid_loss": valid if ok else None,
        "trained": bool(ok and first is not None and last is not None and last <= first - min_drop),
        "s_per_update": statistics.median(spu) if spu else None,
        "wall_s": res["wall_s"], "train_curve": [(int(r["num_updates"]), r["loss"]) for r in train],
        "command": res["command"], **({"error_tail": res["error_tail"]} if "error_tail" in res else {}),
    }


def run(args, cfg, write) -> dict:
    """Every (depth, method) in the mode's order; after each run ``write`` gets the result so far."""
    data = common.prepare_data(cfg["valid_lines"], cfg["test_lines"], args.data, args.data_root)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-depth-") as work:
        for depth in cfg["depths"]:
            for name in cfg["methods"]:
                arch, extra, _ = METHODS[name]
                flags = (["--arch", arch] + extra + common.dims_flags(64, 128, 2, depth, depth)
                         + common.schedule_flags(0, args.decay_period)
                         + common.common_train_flags(args.lr, cfg["max_tokens"], cfg["updates"], args.seed, 0.1)
                         + ["--log-interval", "1", "--no-save", "--validate-interval", "1000"])
                common.log(f"train {name} {depth}+{depth} layers ({cfg['updates']} updates)")
                res = common.fairseq_train(data, flags, pathlib.Path(work) / f"{name}-{depth}",
                                           threads=args.threads, timeout=args.run_timeout)
                row = {"method": name, "depth": depth, **summarise(res, args.min_drop)}
                common.log(f"  {row['status']}: loss {row['first_loss']} -> {row['last_loss_mean10']}, valid "
                           f"{row['valid_loss']}, {row['s_per_update']} s/update")
                rows.append(row)
                write(result_of(args, cfg, data, rows, complete=False))
    return result_of(args, cfg, data, rows, complete=True)


def result_of(args, cfg, data, rows, complete) -> dict:
    rows = sorted(rows, key=lambda r: (r["depth"], list(METHODS).index(r["method"])))
    trained = {m: max((r["depth"] for r in rows if r["method"] == m and r["trained"]), default=None)
               for m in cfg["methods"]}
    return {
        "benchmark": "depth", "mode": args.mode, "complete": complete, "command": common.command_line(), "machine": common.machine(),
        "data": common.data_description(data), "threads": args.threads,
        "data_counts": common.data_counts(data),
        "config": {**cfg, "dims": "64-128-2", "lr": args.lr, "decay_period": args.decay_period, "seed": args.seed,
                   "min_drop": args.min_drop, "schedule": "inverse_sqrt_nowarmup (no warmup) for every method",
                   "optimizer": "adam (0.9, 0.98), wd 1e-4, label smoothing 0.1, dropout 0.1"},
        "unigram_entropy_bits": unigram_entropy(data / "dict.en.txt"),
        "deepest_trained": trained, "runs": rows,
    }


def report(result: dict) -> str:
    cfg = result["config"]
    label = {m: METHODS[m][2] for m in METHODS}
    rows = [[f"{r['depth']}+{r['depth']}", label[r["method"]], r["status"], r["updates_done"], r["first_loss"],
             r["last_loss_mean10"], r["valid_loss"], "yes" if r["trained"] else "no", r["s_per_update"]]
            for r in result["runs"]]
    deepest = ", ".join(f"{label[m]}: {d if d is not None else 'none'}" for m, d in result["deepest_trained"].items())
    return (
        common.header_md("Depth: 64-128-2 models, 6 to 200 layers per side, no warmup (paper Fig. 4b)", result)
        + ("" if result["complete"] else "**PARTIAL: written while the benchmark ran (or after it was stopped); not every run had finished.**\n\n")
        + f"{cfg['updates']} updates at max-tokens {cfg['max_tokens']}, lr {cfg['lr']}, "
        f"lr*sqrt(P/(P+t)) with P = {cfg['decay_period']} for every method (no warmup), seed {cfg['seed']}. "
        f"Loss = label-smoothed cross-entropy in bits; 'last' = mean of the last 10 updates; valid loss on "
        f"{result['data_counts'].get('valid')} valid sentences after the last update. 'trained' = finite and last <= first - "
        f"{cfg['min_drop']}. Unigram entropy of the target words: {result['unigram_entropy_bits']:.2f} bits.\n\n"
        + common.md_table(["layers", "method", "status", "updates", "first loss", "last loss", "valid loss",
                           "trained", "s/update"], rows)
        + f"\n\nDeepest model that trained (layers per side): {deepest}\n"
    )


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"tfixup": "C3", "postln": "C0", "preln": "C1"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for m in result["config"]["methods"]:
        rs = [r for r in result["runs"] if r["method"] == m]
        ok = [r for r in rs if r["valid_loss"] is not None]
        bad = [r for r in rs if r["status"] != "ok"]
        axes[0].plot([r["depth"] for r in ok], [r["valid_loss"] for r in ok], "o-", color=colors[m],
                     label=METHODS[m][2])
        for r in bad:
            axes[0].axvline(r["depth"], color=colors[m], ls="--", alpha=0.5)
            axes[0].annotate(f"{METHODS[m][2]} {r['status']}", (r["depth"], axes[0].get_ylim()[1]),
                             color=colors[m], fontsize=7, rotation=90, va="top")
        sp = [r for r in rs if r["s_per_update"]]
        axes[1].plot([r["depth"] for r in sp], [r["s_per_update"] for r in sp], "o-", color=colors[m],
                     label=METHODS[m][2])
        deepest = max(rs, key=lambda r: r["depth"]) if rs else None
        if deepest and deepest["train_curve"]:
            u, l = zip(*[(u, l) for u, l in deepest["train_curve"] if isinstance(l, float) and math.isfinite(l)] or [(0, 0)])
            axes[2].plot(u, l, color=colors[m], label=f"{METHODS[m][2]} {deepest['depth']}+{deepest['depth']}")
    axes[0].axhline(result["unigram_entropy_bits"], color="gray", ls=":", label="unigram entropy")
    for ax, t, y in ((axes[0], "valid loss after the budget", "valid loss (bits)"),
                     (axes[1], "wall time per update (1 CPU thread)", "s / update"),
                     (axes[2], "train loss, deepest models", "train loss (bits)")):
        ax.set_title(t, fontsize=9)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:2]:
        ax.set_xscale("log")
        ax.set_xlabel("layers per side")
    axes[2].set_xlabel("updates")
    common.save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    p = common.benchmark_parser(__doc__.split("\n\n")[0], "depth.{json,md,png}")
    p.add_argument("--depths", type=int, nargs="+", help="layers per side (override the mode's)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the mode's methods")
    p.add_argument("--updates", type=int, help="override the mode's update budget")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default 5e-4)")
    p.add_argument("--decay-period", type=int, default=4000, help="P of inverse_sqrt_nowarmup (default 4000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-drop", type=float, default=1.0, help="loss drop (bits) that counts as trained")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds before one run is stopped")
    args = p.parse_args(argv)
    cfg = dict(MODES[args.mode])
    for k in ("depths", "methods", "updates"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    out = pathlib.Path(args.out)
    stem = "depth" + args.tag

    def write(result):
        common.write_outputs(out, stem, result, plot, report(result), "depth study")

    result = run(args, cfg, write)
    write(result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
