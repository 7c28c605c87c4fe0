"""Convergence without warmup (paper Fig. 3c) on the real IWSLT'14 De-En sample.

Same model size, data and update budget for every method, several seeds:

  tfixup          transformer_tfixup, no LayerNorm, no warmup (T-Fixup)
  postln_warmup   stock Post-LN transformer with linear warmup (the baseline)
  postln          stock Post-LN transformer, no warmup
  preln           stock Pre-LN transformer, no warmup

Each run is ``fairseq-train --user-dir fairseq_tfixup --cpu``; valid loss is read
from its JSON log every ``--valid-every`` updates, BLEU comes from
fairseq-generate on a fixed slice of the real test set. The headline number is
"updates to reach the baseline's best valid loss", T-Fixup / Post-LN+warmup.

The paper warms up for 4000 of ~50k+ updates; with a budget of a few hundred
updates the warmup is scaled to ``--warmup-frac`` of the budget, and the
no-warmup runs decay with period P = that warmup, so that after the warmup all
runs follow the same inverse-sqrt curve.

    python -m bench.convergence --quick --out /tmp/conv
    python -m bench.convergence --out results/bench        # default mode, ~20 min
"""

import pathlib
import shutil
import statistics
import sys
import tempfile

from bench import common

METHODS = {
    "tfixup": ("tfixup", False, "T-Fixup, no warmup"),
    "postln_warmup": ("postln", True, "Post-LN + warmup (baseline)"),
    "postln": ("postln", False, "Post-LN, no warmup"),
    "preln": ("preln", False, "Pre-LN, no warmup"),
}

RATIO_PAIR = ("tfixup", "postln_warmup")

MODES = {  # model dims, budget, seeds; the default fits ~20 min on one core of this machine
    "smoke": dict(embed=64, ffn=128, heads=2, layers=2, updates=12, valid_every=6, seeds=[1],
                  methods=["tfixup", "postln_warmup"], max_tokens=1024, beam=1, valid_lines=100, test_lines=30),
    "quick": dict(embed=128, ffn=256, heads=4, layers=2, updates=40, valid_every=20, seeds=[1],
                  methods=list(METHODS), max_tokens=2048, beam=1, valid_lines=300, test_lines=200),
    "default": dict(embed=128, ffn=256, heads=4, layers=2, updates=100, valid_every=10, seeds=[1, 2],
                    methods=list(METHODS), max_tokens=2048, beam=1, valid_lines=300, test_lines=200),
}


def updates_to_reach(curve: list, target: float):
    """First update whose valid loss is <= target (None if never)."""
    for upd, loss in curve:
        if loss <= target:
            return upd
    return None


def mean_curve(curves: list) -> list:
    """Mean valid loss over seeds at the updates every seed logged (a diverged seed ends its curve)."""
    common_updates = sorted(set.intersection(*(set(u for u, _ in c) for c in curves))) if curves else []
    return [(u, statistics.mean(dict(c)[u] for c in curves)) for u in common_updates]


def run(args, cfg, write) -> dict:
    """Train every (seed, method); after each run ``write`` gets the result so far (complete=False),
    so that a run cut short by the clock still leaves what it measured."""
    data = common.prepare_data(cfg["valid_lines"], cfg["test_lines"], args.data, args.data_root)
    warmup = max(1, int(cfg["updates"] * args.warmup_frac))
    runs = []
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-conv-"))
    try:
        for seed in cfg["seeds"]:
            for name in cfg["methods"]:
                if seed != cfg["seeds"][0] and name not in RATIO_PAIR and not args.all_seeds:
                    continue  # time: on a shared 2-core CPU only the ratio's pair gets every seed
                family, with_warmup, _ = METHODS[name]
                fam = common.FAMILIES[family]
                flags = (["--arch", fam["arch"]] + fam["flags"]
                         + common.dims_flags(cfg["embed"], cfg["ffn"], cfg["heads"], cfg["layers"], cfg["layers"])
                         + common.schedule_flags(warmup if with_warmup else 0, warmup)
                         + common.common_train_flags(args.lr, cfg["max_tokens"], cfg["updates"], seed, 0.1)
                         + ["--validate-interval-updates", str(cfg["valid_every"]), "--validate-interval", "1000",
                            "--save-interval", "1000", "--no-epoch-checkpoints", "--no-save-optimizer-state",
                            "--log-interval", str(cfg["valid_every"])])
                save = work / f"{name}-s{seed}"
                common.log(f"train {name} seed {seed} ({cfg['updates']} updates)")
                res = common.fairseq_train(data, flags, save, threads=args.threads)
                curve = [(int(r["valid_num_updates"]), r["valid_loss"]) for r in res["valid"]]
                entry = {"method": name, "seed": seed, "status": res["status"], "wall_s": res["wall_s"],
                         "valid_curve": curve, "train_curve": [(int(r["num_updates"]), r["loss"]) for r in res["train"]],
                         "command": res["command"]}
                if "error_tail" in res:
                    entry["error_tail"] = res["error_tail"]
                ckpt = save / "checkpoint_last.pt"
                entry["bleu"] = (common.generate_bleu(data, ckpt, beam=cfg["beam"], threads=args.threads)
                                 if res["status"] == "ok" and ckpt.is_file() else {"bleu": None})
                common.log(f"  {res['status']}: best valid {min((l for _, l in curve), default=None)}, "
                           f"BLEU {entry['bleu'].get('bleu')}, {res['wall_s']} s")
                runs.append(entry)
                shutil.rmtree(save, ignore_errors=True)
                write(summarise(args, cfg, data, warmup, runs, complete=False))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summarise(args, cfg, data, warmup, runs, complete=True)


def summarise(args, cfg, data, warmup, runs, complete) -> dict:
    """Per method over seeds: final/best valid loss, BLEU, updates to the baseline's best."""
    summary = {}
    curves = {m: mean_curve([r["valid_curve"] for r in runs if r["method"] == m and r["valid_curve"]])
              for m in cfg["methods"] if any(r["method"] == m for r in runs)}
    base = curves.get("postln_warmup") or []
    target = min((l for _, l in base), default=None)
    for m in curves:
        mine = [r for r in runs if r["method"] == m]
        finals = [r["valid_curve"][-1][1] for r in mine if r["valid_curve"] and r["status"] == "ok"]
        bleus = [r["bleu"]["bleu"] for r in mine if r["bleu"].get("bleu") is not None]
        summary[m] = {
            "label": METHODS[m][2],
            "runs": len(mine), "diverged": sum(r["status"] != "ok" for r in mine),
            "final_valid_loss": statistics.mean(finals) if finals else None,
            "final_valid_loss_sd": statistics.stdev(finals) if len(finals) > 1 else None,
            "best_valid_loss": min((l for _, l in curves[m]), default=None),
            "bleu": statistics.mean(bleus) if bleus else None,
            "bleu_sd": statistics.stdev(bleus) if len(bleus) > 1 else None,
            "updates_to_baseline_best": updates_to_reach(curves[m], target) if target is not None else None,
            "mean_valid_curve": curves[m],
        }
    t_fix = summary.get("tfixup", {}).get("updates_to_baseline_best")
    t_base = summary.get("postln_warmup", {}).get("updates_to_baseline_best")
    ratio = (t_fix / t_base) if (t_fix and t_base) else None
    return {
        "benchmark": "convergence", "mode": args.mode, "complete": complete, "command": common.command_line(),
        "machine": common.machine(), "data": common.data_description(data), "threads": args.threads,
        "data_counts": common.data_counts(data),
        "config": {**cfg, "lr": args.lr, "all_seeds": args.all_seeds, "warmup_updates_baseline": warmup, "decay_period_nowarmup": warmup,
                   "optimizer": "adam (0.9, 0.98), wd 1e-4, label smoothing 0.1, dropout 0.1"},
        "baseline_best_valid_loss": target,
        "ratio_updates_tfixup_over_postln_warmup": ratio,
        "summary": summary, "runs": runs,
    }


def report(result: dict) -> str:
    cfg = result["config"]
    rows = [[s["label"], f"{s['runs'] - s['diverged']}/{s['runs']}", s["final_valid_loss"], s["final_valid_loss_sd"],
             s["best_valid_loss"], s["bleu"], s["bleu_sd"], s["updates_to_baseline_best"]]
            for s in result["summary"].values()]
    ratio = result["ratio_updates_tfixup_over_postln_warmup"]
    return (
        common.header_md("Convergence without warmup (paper Fig. 3c)", result)
        + ("" if result["complete"] else "**PARTIAL: written while the benchmark ran (or after it was stopped); not every run had finished.**\n\n")
        + f"Model {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers; "
        f"{cfg['updates']} updates at max-tokens {cfg['max_tokens']}, lr {cfg['lr']}, seeds {cfg['seeds']} "
        f"({'all methods' if cfg['all_seeds'] else 'T-Fixup and the baseline; the others seed ' + str(cfg['seeds'][0])}); "
        f"baseline warmup {cfg['warmup_updates_baseline']} updates (scaled to the budget), no-warmup runs decay "
        f"lr*sqrt(P/(P+t)) with P = {cfg['decay_period_nowarmup']}. Valid loss (base 2, label-smoothed) every "
        f"{cfg['valid_every']} updates on {result['data_counts'].get('valid')} valid sentences; BLEU (beam {cfg['beam']}, "
        f"sacrebleu on tokenised lowercased text) on the first {result['data_counts'].get('test')} test sentences.\n\n"
        + common.md_table(["method", "trained", "final valid loss", "sd", "best valid loss (mean curve)",
                           "BLEU", "sd", "updates to baseline best"], rows)
        + f"\n\nBaseline (Post-LN + warmup) best valid loss: {result['baseline_best_valid_loss']}. "
        f"Updates to reach it, T-Fixup / Post-LN+warmup: **{'%.2f' % ratio if ratio else 'n/a'}**\n"
    )


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = {"tfixup": "C3", "postln_warmup": "C0", "postln": "C2", "preln": "C1"}
    for r in result["runs"]:
        if r["valid_curve"]:
            u, l = zip(*r["valid_curve"])
            ax.plot(u, l, color=colors[r["method"]], alpha=0.25, lw=1)
    for m, s in result["summary"].items():
        if s["mean_valid_curve"]:
            u, l = zip(*s["mean_valid_curve"])
            ax.plot(u, l, color=colors[m], lw=2, label=s["label"])
    if result["baseline_best_valid_loss"] is not None:
        ax.axhline(result["baseline_best_valid_loss"], color="gray", ls=":", lw=1, label="baseline best")
    ax.set_xlabel("updates")
    ax.set_ylabel("valid loss (label-smoothed, base 2)")
    cfg = result["config"]
    ax.set_title(f"IWSLT'14 De-En sample, {cfg['embed']}-{cfg['ffn']}-{cfg['heads']} {cfg['layers']}+{cfg['layers']} "
                 f"layers, lr {cfg['lr']}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    common.save_figure(fig, path)
    plt.close(fig)


def main(argv=None):
    p = common.benchmark_parser(__doc__.split("\n\n")[0], "convergence.{json,md,png}")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup-frac", type=float, default=0.25,
                   help="baseline warmup as a fraction of the update budget (default 0.25)")
    p.add_argument("--updates", type=int, help="override the mode's update budget")
    p.add_argument("--seeds", type=int, nargs="+", help="override the mode's seeds")
    p.add_argument("--layers", type=int, help="override the mode's layers per side")
    p.add_argument("--embed", type=int, help="override the mode's embedding dim")
    p.add_argument("--ffn", type=int, help="override the mode's FFN dim")
    p.add_argument("--heads", type=int, help="override the mode's attention heads")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="override the mode's methods")
    p.add_argument("--all-seeds", action="store_true",
                   help="run every method with every seed (default: the other methods only with the first seed)")
    args = p.parse_args(argv)
    cfg = dict(MODES[args.mode])
    for k in ("updates", "seeds", "layers", "methods", "embed", "ffn", "heads"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if "postln_warmup" not in cfg["methods"]:
        common.log("no postln_warmup among --methods: no baseline, so no ratio")
    cfg["valid_every"] = min(cfg["valid_every"], cfg["updates"])
    out = pathlib.Path(args.out)
    stem = "convergence" + args.tag

    def write(result):
        common.write_outputs(out, stem, result, plot, report(result), "valid loss curves")

    result = run(args, cfg, write)
    write(result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
