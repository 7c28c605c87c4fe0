"""Convergence without warmup (paper Fig. 3c), at the paper's depth, on the real IWSLT'14 De-En sample.

Methods, same model size, data, batch and update budget:

  tfixup          transformer_tfixup: no LayerNorm, T-Fixup init, no warmup
  postln_warmup   stock fairseq Post-LN transformer, linear warmup then inverse sqrt (the baseline)
  postln          stock Post-LN, no warmup
  preln           stock Pre-LN, no warmup

Setting, checked against the paper: 6+6 layers (the paper's; it notes that
Transformers of <= 3 layers train without warmup, so shallower models cannot
show the failure); the no-warmup runs decay as lr*sqrt(P/(P+t)) with the paper's
P = 4000 (so their lr is nearly flat over this budget); lr 5e-4 (the paper's) and
1e-3; the baseline warms up over ``--warmup`` updates (the paper's 4000 would not
end within a CPU budget) and then decays as fairseq's inverse_sqrt. Width and
batch are CPU-sized (default 128-256-4, 2048 tokens per update).

Each run is ``fairseq-train --user-dir fairseq_tfixup --cpu`` with 1 thread;
valid loss (label-smoothed, bits) every ``--valid-every`` updates on 1000 real
valid sentences. The unigram level (bench/unigram.py) is computed from the data:
a run whose best valid loss is not at least ``--margin`` bits below it is
**stuck** at the unigram stage. Headline, per lr and seed: updates T-Fixup needs
to reach the warmup baseline's best valid loss / updates the baseline needs.

Resumable: each finished run is recorded under OUT/convergence/runs/; rerunning
skips those and runs the rest (``--jobs`` at a time).

    python -m bench.convergence --smoke --out /tmp/conv          # < 1 min, for the tests
    python -m bench.convergence --out results/bench              # the study (hours on 2 cores)
"""

import pathlib
import statistics
import sys

from bench import common, runs as runlib
from bench.unigram import unigram_level

METHODS = {  # name: (method in fairseq_tfixup/presets.py, warmup?, label)
    "tfixup": ("tfixup", False, "T-Fixup, no warmup"),
    "postln_warmup": ("postln", True, "Post-LN + warmup (baseline)"),
    "postln": ("postln", False, "Post-LN, no warmup"),
    "preln": ("preln", False, "Pre-LN, no warmup"),
    # the other methods of the paper's tables, and two later ones, each with its own paper's warmup
    "radam": ("radam", False, "RAdam (Post-LN), no warmup"),
    "dsinit_warmup": ("dsinit", True, "DS-Init + warmup"),
    "rfixup_warmup": ("rfixup", True, "R-Fixup + warmup"),
    "dlcl_warmup": ("dlcl", True, "DLCL + warmup"),
    "dlcl_preln_warmup": ("dlcl_preln", True, "DLCL-Pre-LN + warmup"),
    "deepnorm_warmup": ("deepnorm", True, "DeepNorm + warmup"),
    "admin_warmup": ("admin", True, "Admin + warmup"),
    "lri_warmup": ("lri", True, "LRI + warmup"),
}
BASELINES = ["radam", "dsinit_warmup", "rfixup_warmup", "dlcl_warmup", "dlcl_preln_warmup", "deepnorm_warmup",
             "admin_warmup", "lri_warmup"]
BASELINE = "postln_warmup"

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, layers=2, updates=8, valid_every=4, seeds=[1], lrs=[1e-3],
                  methods=["tfixup", BASELINE], one_seed_methods=[], warmup=4, max_tokens=512,
                  long_updates=0, valid_lines=50, test_lines=10),
    # 6+6 (the paper's depth) at a quarter of its small width; 800 updates, enough for the warmup
    # baseline to leave the unigram stage (the report's "stuck" column says whether it did);
    # the long runs show what happens after
    "default": dict(embed=128, ffn=256, heads=4, layers=6, updates=800, valid_every=50, seeds=[1, 2, 3],
                    lrs=[1e-3, 5e-4], methods=["tfixup", BASELINE, "postln"], one_seed_methods=["preln"] + BASELINES,
                    warmup=200, max_tokens=2048, long_updates=2500, valid_lines=1000, test_lines=0),
}


def make_runs(cfg: dict, data: pathlib.Path) -> list:
    """The study's runs, the most informative first: per lr (1e-3 before 5e-4), the headline's
    methods with every seed, then the other methods with the first seed; the long runs last."""
    out = []

    def add(method, lr, seed, updates, tag):
        family, warm, _ = METHODS[method]
        fam = common.FAMILIES[family]
        args = (["--arch", fam["arch"]] + fam["flags"]
                + common.dims_flags(cfg["embed"], cfg["ffn"], cfg["heads"], cfg["layers"], cfg["layers"])
                + common.schedule_flags(cfg["warmup"] if warm else 0, cfg["decay_period"])
                + common.common_train_flags(lr, cfg["max_tokens"], updates, seed, cfg["dropout"], fam["optimizer"])
                + ["--validate-interval-updates", cfg["valid_every"], "--validate-interval", 100000,
                   "--save-interval", 100000, "--no-save", "--log-interval", cfg["valid_every"]])
        out.append(runlib.Run(f"{tag}-{method}-lr{lr:g}-s{seed}", dict(
            method=method, lr=lr, seed=seed, updates=updates, group=tag), args, str(data)))

    for lr in cfg["lrs"]:
        for seed in cfg["seeds"]:
            for m in cfg["methods"]:
                add(m, lr, seed, cfg["updates"], "main")
        for m in cfg["one_seed_methods"]:
            add(m, lr, cfg["seeds"][0], cfg["updates"], "main")
    if cfg["long_updates"]:
        for m in cfg["methods"]:
            add(m, max(cfg["lrs"]), cfg["seeds"][0], cfg["long_updates"], "long")
    return out


def updates_to_reach(curve: list, target: float):
    """First update whose valid loss is <= target (None if never)."""
    return next((u for u, l in curve if l <= target), None)


def best(curve: list):
    """(update, loss) of the lowest valid loss."""
    return min(curve, key=lambda ul: ul[1]) if curve else (None, None)


def summarise(cfg: dict, records: dict, level: dict, data: pathlib.Path, margin: float) -> dict:
    threshold = level["train_fit"] - margin
    rows = []
    for rec in records.values():
        b_upd, b_loss = best(rec["valid_curve"])
        rows.append({**{k: rec[k] for k in ("id", "group", "method", "lr", "seed", "updates", "status", "wall_s")},
                     "best_valid": b_loss, "best_at": b_upd,
                     "final_valid": rec["valid_curve"][-1][1] if rec["valid_curve"] else None,
                     "stuck": rec["status"] != "ok" or b_loss is None or b_loss > threshold})
    # per (group, lr, seed): T-Fixup's updates to the baseline's best, over the baseline's
    for r in rows:
        base = records.get(r["id"].replace(f"-{r['method']}-", f"-{BASELINE}-"))
        r["updates_to_baseline_best"] = r["ratio_to_baseline"] = None
        if base and base["valid_curve"] and r["status"] == "ok":
            b_upd, b_loss = best(base["valid_curve"])
            u = updates_to_reach(records[r["id"]]["valid_curve"], b_loss)
            r["updates_to_baseline_best"] = u
            r["ratio_to_baseline"] = round(u / b_upd, 3) if u is not None and b_upd else None
    headline = {}
    for group in ("main", "long"):
        for lr in cfg["lrs"]:
            ratios = [r["ratio_to_baseline"] for r in rows
                      if r["group"] == group and r["lr"] == lr and r["method"] == "tfixup"]
            if not ratios:
                continue
            got = [x for x in ratios if x is not None]
            stuck = {m: f"{sum(r['stuck'] for r in rows if r['group'] == group and r['lr'] == lr and r['method'] == m)}"
                        f"/{sum(r['group'] == group and r['lr'] == lr and r['method'] == m for r in rows)}"
                     for m in METHODS if any(r['method'] == m and r['group'] == group and r['lr'] == lr for r in rows)}
            headline[f"{group} lr {lr:g}"] = {"stuck": stuck,
                "seeds": len(ratios), "reached": len(got),
                "ratio_mean": round(statistics.mean(got), 3) if got else None,
                "ratio_sd": round(statistics.stdev(got), 3) if len(got) > 1 else None,
                "ratio_min": min(got, default=None), "ratio_max": max(got, default=None),
            }
    return {
        "benchmark": "convergence", "mode": cfg["mode"], "command": common.command_line(),
        "machine": common.machine(), "threads": 1, "data": common.data_description(data),
        "data_counts": common.data_counts(data), "config": cfg,
        "unigram_level": level, "stuck_threshold": round(threshold, 4), "margin_bits": margin,
        "complete": len(records) == cfg["n_runs"], "runs_recorded": len(records),
        "headline": headline, "rows": sorted(rows, key=lambda r: (r["group"], -r["lr"], r["method"], r["seed"])),
        "records": records,
    }


def report(res: dict) -> str:
    cfg, lv = res["config"], res["unigram_level"]
    title = f"Convergence without warmup (paper Fig. 3c), {cfg['layers']}+{cfg['layers']} layers"
    text = runlib.report_head(title, res, cfg["n_runs"])
    text += (
        f"Model {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {cfg['layers']}+{cfg['layers']} layers, "
        f"{cfg['max_tokens']} tokens per update, dropout {cfg['dropout']}, Adam (0.9, 0.98), wd 1e-4, label "
        f"smoothing 0.1, no clipping. No-warmup runs: lr*sqrt(P/(P+t)), P = {cfg['decay_period']} (the paper's). "
        f"Baseline: linear warmup over {cfg['warmup']} updates from 1e-7, then inverse sqrt. "
        f"Valid loss (label-smoothed, bits) every {cfg['valid_every']} updates on "
        f"{res['data_counts'].get('valid')} valid sentences.\n\n"
        f"**Unigram level** of this valid set (computed from the data, bench/unigram.py): "
        f"{lv['train_fit']} bits for the unigram model fit on train ({lv['oracle']} for the best unigram "
        f"model fit on valid itself). A run is **stuck** when its best valid loss is not at least "
        f"{res['margin_bits']} bit below {lv['train_fit']}, i.e. above {res['stuck_threshold']}.\n\n")
    if res["headline"]:
        text += "## Headline: updates for T-Fixup to reach the baseline's best valid loss / the baseline's updates\n\n"
        text += common.md_table(
            ["runs", "seeds", "T-Fixup reached it", "ratio mean", "sd", "min", "max", "stuck runs per method"],
            [[k, h["seeds"], h["reached"], h["ratio_mean"], h["ratio_sd"], h["ratio_min"], h["ratio_max"],
              ", ".join(f"{METHODS[m][2]} {v}" for m, v in h["stuck"].items())]
             for k, h in res["headline"].items()]) + "\n\n"
    text += "## Every run\n\n" + common.md_table(
        ["group", "lr", "method", "seed", "updates", "status", "best valid", "at update", "final valid", "stuck",
         "updates to baseline best", "ratio", "wall s"],
        [[r["group"], r["lr"], METHODS[r["method"]][2], r["seed"], r["updates"], r["status"], r["best_valid"],
          r["best_at"], r["final_valid"], "STUCK" if r["stuck"] else "no", r["updates_to_baseline_best"],
          r["ratio_to_baseline"], r["wall_s"]] for r in res["rows"]]) + "\n"
    return text


def color(name: str) -> str:
    """The method's color in every benchmark figure; Post-LN without warmup is told apart from the baseline."""
    return common.POSTLN_NO_WARMUP_COLOR if name == "postln" else common.METHOD_COLORS[METHODS[name][0]]


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["group"], r["lr"]) for r in res["records"].values()}, key=lambda p: (p[0] != "main", -p[1]))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.2 * max(1, len(panels)), 4.2), squeeze=False)
    for ax, (group, lr) in zip(axes[0], panels):
        labelled = set()
        for rec in res["records"].values():
            if rec["group"] != group or rec["lr"] != lr or not rec["valid_curve"]:
                continue
            u, l = zip(*rec["valid_curve"])
            m = rec["method"]
            ax.plot(u, l, color=color(m), lw=1.2, alpha=0.8,
                    label=None if m in labelled else METHODS[m][2])
            labelled.add(m)
        ax.axhline(res["unigram_level"]["train_fit"], color="gray", ls="--", lw=1, label="unigram level")
        ax.axhline(res["stuck_threshold"], color="gray", ls=":", lw=1, label="stuck above this")
        ax.set_title(f"{group} runs, lr {lr:g}", fontsize=9)
        ax.set_xlabel("updates")
        ax.set_ylabel("valid loss (bits, label-smoothed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    cfg = res["config"]
    fig.suptitle(f"IWSLT'14 De-En sample, {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, "
                 f"{cfg['layers']}+{cfg['layers']} layers", fontsize=10)
    common.save_figure(fig, path)
    plt.close(fig)


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "convergence.{json,md,png}, convergence/runs/")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one thread each)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="bits below the unigram level a run must reach to count as not stuck (default 1)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--decay-period", type=int, default=4000, help="P of the no-warmup schedule (default 4000)")
    for k in ("updates", "warmup", "layers", "embed", "ffn", "heads", "max_tokens", "long_updates"):
        p.add_argument("--" + k.replace("_", "-"), type=int, help=f"override the mode's {k}")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--lrs", type=float, nargs="+")
    p.add_argument("--methods", nargs="+", choices=list(METHODS),
                   help="run only these: the headline's methods with every seed, the others with the first")
    return p


def make_config(args) -> dict:
    """The mode's settings with the command line's overrides."""
    cfg = dict(MODES[args.mode], mode=args.mode, dropout=args.dropout, decay_period=args.decay_period)
    for k in ("updates", "warmup", "layers", "embed", "ffn", "heads", "max_tokens", "long_updates",
              "seeds", "lrs"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.methods:  # both lists: --methods tfixup once also ran every one-seed method
        cfg["methods"] = [m for m in args.methods if m in MODES[args.mode]["methods"]]
        cfg["one_seed_methods"] = [m for m in args.methods if m not in MODES[args.mode]["methods"]]
    return cfg


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.mode == "quick":
        p.error("convergence has --smoke and the default mode only")
    cfg = make_config(args)
    data = common.prepare_data(cfg["valid_lines"], cfg["test_lines"], args.data, args.data_root)
    level = unigram_level(data, "de", "en")
    common.log(f"unigram level of valid: {level['train_fit']} bits (fit on train), {level['oracle']} (fit on valid)")
    all_runs = make_runs(cfg, data)
    cfg["n_runs"] = len(all_runs)
    runlib.run_study("convergence" + args.tag, args.out, all_runs,
                     lambda recs: summarise(cfg, recs, level, data, args.margin),
                     plot, report, "valid loss curves", args.jobs, args.threads, report_only=args.report_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
