"""Best against best: every method at its own best learning rate.

Two parts, each a grid of peak lrs per method on its better schedule: ``translation``, the convergence study's
setting (harness/bench/convergence.py) for the rows of tfixup/methods.py whose ``studies`` name "lr"; ``lm``, the
24-layer LM of harness/bench/lm.py for those naming "lr_lm". A method trained with warmup in its paper runs on the
matched warmup (in the convergence study the better warmup for every such method at both lrs but LRI at 1e-3);
T-Fixup without warmup; DyT, Derf (LayerNorm-free, trained with warmup) and Pre-LN also without warmup in the
translation part (no warmup was DyT's and Pre-LN's better schedule in the convergence study at both lrs).

The grid starts at ``lrs`` and doubles an arm's largest lr while it still trains (up to ``max_lr``), so every range
ends where the method diverges or stays at the unigram stage; it grows from the records, in rounds (``--rounds``).
A run **trains** when its best valid loss is at least ``--margin`` bits below the unigram level (unigram.py)
and it did not diverge; a method's **best lr** has the lowest best valid loss (first seed), and its other seeds run
there. Headline, per seed: T-Fixup's updates (at its best lr) to the method's best valid loss (at the method's) /
the method's updates. Resumable: runs are recorded under OUT/lr/runs/; one recorded on the other ``--device``
counts (runs.Run.recorded_by).

    python -m harness.bench.lr --smoke --out /tmp/lr --data DATA                  # < 1 min, for the tests
    python -m harness.bench.lr --out results/bench --data work/data-bin/iwslt14-v1000 --jobs 2
"""

import collections
import math
import pathlib
import statistics
import sys

from harness.bench import common, convergence, lm, runs as runlib
from harness.bench.common import best
from harness.bench.convergence import curve_row, still_improving, truncated
from harness.bench.unigram import lm_unigram_level, unigram_level
from tfixup import methods

PARTS = {"translation": "lr", "lm": "lr_lm"}  # part -> the studies tag of the method rows it runs
# methods with LayerNorm that the translation part also runs without warmup: in the convergence study Pre-LN's
# best valid loss was lower without warmup than on either warmup at both lrs (by 0.008 and 0.05 bit)
BOTH_WAYS = ("preln",)


def study_arms(part: str) -> dict:
    """arm name -> common.Arm of a part: each method that names the part's tag, on the matched warmup if trained
    with warmup (in translation a LayerNorm-free one, and BOTH_WAYS, also without), else without."""
    out = []
    for name in methods.studied(PARTS[part]):
        m = methods.method(name)
        both = m.warmup and (m.layernorm_free or name in BOTH_WAYS) and part == "translation"
        kinds = ["matched", "nowarmup"] if both else ["matched" if m.warmup else "nowarmup"]
        for kind in kinds:
            label = m.label + (common.SCHEDULE_LABEL[kind] if kind == "matched" or len(kinds) > 1 else "")
            out.append(common.arm(name, kind, label=label))
    return common.arm_table(out)


MODES = {
    "smoke": dict(translation=dict(convergence.MODES["smoke"], valid_every=2, dropout=0.1, decay_period=4000),
                  lm=None, lrs=[1e-3], max_lr=2e-3, seeds=[1, 2], arms=["tfixup", "postln_matched"]),
    # the convergence study's setting, validated every 20 updates: a ratio's step is 20 / the method's updates
    # to its best valid loss (0.025 at 800; below 0.03 from 667 updates on)
    "default": dict(translation=dict(convergence.MODES["default"], valid_every=20, dropout=0.1, decay_period=4000),
                    # the LM study's 24-layer model, validated every 10 of its 400 updates
                    lm=dict(lm.MODES["default"], depths=[24], valid_every=10, dropout=0.1, decay_period=4000, seed=1),
                    lrs=[2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3], lm_lrs=[5e-4, 1e-3, 2e-3], max_lr=6.4e-2, seeds=[1, 2],
                    # the LM's ratios moved most from seed to seed (DyT 0.525 / 0.375): a third seed there
                    lm_seeds=[1, 2, 3], arms=None),
}


def _part_arms(cfg: dict, part: str) -> dict:
    return {a: v for a, v in study_arms(part).items() if not cfg["arms"] or a in cfg["arms"]}


def _run(cfg: dict, part: str, data: dict, arm: str, lr: float, seed: int) -> runlib.Run:
    table = _part_arms(cfg, part)
    if part == "translation":
        return convergence.make_run(cfg["translation"], data[part], arm, lr, seed, cfg["translation"]["updates"],
                                    "mt", table, cfg["device"][part])
    return lm.make_run(cfg["lm"], data[part], arm, cfg["lm"]["depths"][0], lr, seed, table, cfg["device"][part])


def seeds(cfg: dict, part: str) -> list:
    """The seeds a part runs at each arm's best lr (the first one also across the grid)."""
    return (cfg.get("lm_seeds") or cfg["seeds"]) if part == "lm" else cfg["seeds"]


def trains(rec: dict, threshold: float) -> bool:
    return not curve_row(rec, (), threshold)["stuck"]


def plan(cfg: dict, data: dict, records: dict, thresholds: dict) -> list:
    """Every run the records call for: each arm's starting grid (first seed), doubled while the arm still trains at
    its largest lr (up to max_lr); once its grid is closed, the other seeds at its best lr."""
    out, max_lr = [], cfg["max_lr"] * (1 + 1e-9)
    for part in (p for p in PARTS if cfg.get(p)):
        start, seed = cfg["lrs"] if part == "translation" else cfg["lm_lrs"], seeds(cfg, part)[0]
        if not start:
            continue
        for arm in _part_arms(cfg, part):
            grid = list(start)
            got = [records.get(_run(cfg, part, data, arm, lr, seed).id) for lr in grid]
            while got[-1] is not None and trains(got[-1], thresholds[part]) and grid[-1] * 2 <= max_lr:
                grid.append(grid[-1] * 2)
                got.append(records.get(_run(cfg, part, data, arm, grid[-1], seed).id))
            out += [_run(cfg, part, data, arm, lr, seed) for lr in grid]
            if all(g is not None for g in got):
                b = common.best_lr(dict(zip(grid, got)))
                if b is not None:
                    out += [_run(cfg, part, data, arm, b, s) for s in seeds(cfg, part)[1:]]
    # the order they run in: every arm at the studies' two lrs first, then outwards, so that a study cut short
    # has whole columns of the grid; second seeds last
    first = {x: i for i, x in enumerate(sorted({r.meta["lr"] for r in out}, key=lambda x: abs(math.log(x / 7e-4))))}
    return sorted(out, key=lambda r: (r.meta["seed"] != cfg["seeds"][0], first[r.meta["lr"]]))


def lr_range(by_lr: dict, threshold: float, at: float, ok=None):
    """The contiguous span of lrs around AT where the runs train (or pass ``ok(record)``): (low, high), or None."""
    ok = ok or (lambda r: trains(r, threshold))
    lrs = sorted(by_lr)
    if at not in lrs or not (by_lr[at] and ok(by_lr[at])):
        return None
    i = j = lrs.index(at)
    while i > 0 and by_lr[lrs[i - 1]] and ok(by_lr[lrs[i - 1]]):
        i -= 1
    while j < len(lrs) - 1 and by_lr[lrs[j + 1]] and ok(by_lr[lrs[j + 1]]):
        j += 1
    return lrs[i], lrs[j]


TIGHT_BITS = 0.5  # the tighter "trains": best valid loss within this many bits of the method's own best


def tight_range(by_lr: dict, at: float):
    """The contiguous span of lrs around AT whose runs end within TIGHT_BITS of AT's best without diverging."""
    if not by_lr.get(at):
        return None
    limit = best(by_lr[at]["valid_curve"])[1] + TIGHT_BITS
    return lr_range(by_lr, math.inf, at, lambda r: r["status"] == "ok" and r["valid_curve"] and
                    best(r["valid_curve"])[1] <= limit)


def pair_ratio(t: dict, o: dict, every: int) -> dict:
    """T-Fixup's run T against a method's run O: common.to_best, and the ratio's step (EVERY / O's updates)."""
    o_upd, o_loss = best(o["valid_curve"])
    u, ratio = common.to_best(t["valid_curve"], o["valid_curve"])
    return {"method_best_valid": round(o_loss, 4), "method_updates": o_upd, "tfixup_updates": u, "ratio": ratio,
            "step": round(every / o_upd, 4) if o_upd else None}


def summarise(cfg: dict, records: dict, levels: dict, data: dict, margin: float, planned: int) -> dict:
    parts = {}
    for part in (p for p in PARTS if cfg.get(p)):
        threshold = levels[part]["train_fit"] - margin
        table = _part_arms(cfg, part)
        recs = {k: v for k, v in records.items() if k.startswith("mt-" if part == "translation" else "L")}
        every, seed, half_budget = cfg[part]["valid_every"], seeds(cfg, part)[0], cfg[part]["updates"] // 2
        per_arm = {}
        for arm in table:
            first = {float(r["lr"]): r for r in recs.values() if r["method"] == arm and r["seed"] == seed}
            b = common.best_lr(first)
            rows = [{**curve_row(first[x], ("id", "lr", "seed", "status", "wall_s"), threshold),
                     "trains": trains(first[x], threshold)} for x in sorted(first)]
            at_best = [r for r in recs.values() if r["method"] == arm and float(r["lr"]) == b]
            bests = [best(r["valid_curve"])[1] for r in at_best if r["valid_curve"]]
            top = max(first, default=None)
            # closed: the largest lr run no longer trains, or doubling it would pass max_lr; while open, the
            # best lr (and so T-Fixup's ratio against it) may still move up
            closed = top is not None and (not trains(first[top], threshold) or top * 2 > cfg["max_lr"] * (1 + 1e-9))
            per_arm[arm] = {"label": table[arm].label, "schedule": table[arm].schedule, "grid": rows, "best_lr": b,
                            "lr_range": lr_range(first, threshold, b), "largest_lr_run": top, "grid_closed": closed,
                            "lr_range_tight": tight_range(first, b),
                            "best_lr_seeds": sorted(r["seed"] for r in at_best),
                            "best_valid_at_best_lr": [round(x, 4) for x in bests],
                            "best_valid_mean": round(statistics.mean(bests), 4) if bests else None}
        # T-Fixup at its best lr against each method at its best lr, seed by seed
        ref = next((a.name for a in table.values() if a.method == "tfixup"), None)
        versus = {}
        if ref and per_arm[ref]["best_lr"] is not None:
            for arm, m in per_arm.items():
                if arm == ref or m["best_lr"] is None:
                    continue
                pairs = []
                for s in seeds(cfg, part):
                    t = recs.get(_run(cfg, part, data, ref, per_arm[ref]["best_lr"], s).id)
                    o = recs.get(_run(cfg, part, data, arm, m["best_lr"], s).id)
                    if not (t and o and o["valid_curve"] and t["status"] == "ok"):
                        continue
                    # the same pair with both runs stopped at half the budget: how much the ratio moves with it
                    half = truncated({"t": t, "o": o}, half_budget)
                    pairs.append({"seed": s, **pair_ratio(t, o, every), "method_still_improving": still_improving(o),
                                  "devices": [_device(t), _device(o)], "half_budget": half_budget,
                                  "ratio_at_half_budget": pair_ratio(half["t"], half["o"], every)["ratio"]
                                  if half["o"]["valid_curve"] else None})
                got = [p["ratio"] for p in pairs if p["ratio"] is not None]
                versus[arm] = {"pairs": pairs, "reached": len(got), "seeds": len(pairs),
                               "ratio_mean": round(statistics.mean(got), 3) if got else None,
                               "ratio_min": min(got, default=None), "ratio_max": max(got, default=None),
                               "step_max": max((p["step"] for p in pairs if p["step"]), default=None)}
        used = collections.Counter(_device(r) for r in recs.values())
        parts[part] = {"device": ", ".join(sorted(used)) or cfg["device"][part], "runs_per_device": dict(used),
                       "unigram_level": levels[part], "stuck_threshold": round(threshold, 4), "methods": per_arm,
                       "tfixup_arm": ref, "versus": versus, "data": common.data_description(data[part]),
                       "config": cfg[part]}
    return {"benchmark": "lr", "mode": cfg["mode"], "command": common.command_line(), "machine": common.machine(),
            "threads": 1, "device": cfg["device"], "data": "; ".join(p["data"] for p in parts.values()),
            "config": {k: v for k, v in cfg.items() if k not in PARTS}, "margin_bits": margin, "tight_bits": TIGHT_BITS,
            "complete": len(records) >= planned and planned > 0, "runs_recorded": len(records), "runs_planned": planned,
            "parts": parts, "records": records}


def _device(rec: dict) -> str:
    """Where a run trained: its record's device (older records: from its command)."""
    return rec.get("device") or ("cpu" if " --cpu" in rec["command"] else "cuda")


def _lr(x) -> str:
    return "-" if x is None else f"{x:g}"


def report(res: dict) -> str:
    text = runlib.report_head("Every method at its own best learning rate", res, res["runs_planned"], (
        f"Each arm on its better schedule (a method trained with warmup: the matched warmup; T-Fixup: none; DyT, "
        f"Derf and Pre-LN also without warmup); the grid doubles an arm's lr while it still trains, up to "
        f"{res['config']['max_lr']:g}. A run **trains** when its best valid loss is at least "
        f"{res['margin_bits']} bit below the unigram level and it did not diverge; **within {TIGHT_BITS} bit**: "
        f"the lrs around the best whose best valid loss is within {TIGHT_BITS} bit of the method's own best (a "
        f"tighter test: a run can leave the unigram stage and still trail far behind). Ratio: updates for "
        f"T-Fixup (at its best lr) to reach the method's best valid loss (at the method's best lr) / the "
        f"method's updates, per seed; its step is valid_every / the method's updates. **Still improving**: the "
        f"method's run had its best valid loss at its last validation, so the ratio is a bound for this budget, "
        f"not the ratio of two finished runs; beside it, the ratio with both runs stopped at half the budget. "
        f"**(open)**: the method still trains at the largest lr run so far, so its best lr, its range (+) and "
        f"the ratio against it may still move.\n\n"))
    for part, p in res["parts"].items():
        c = p["config"]
        size = f"{c['embed']}-{c['ffn']}-{c['heads']}, " + (
            f"{c['layers']}+{c['layers']}" if part == "translation" else str(c['depths'][0])) + " layers"
        text += (f"## {'Translation (the convergence setting)' if part == 'translation' else 'Language model'}: "
                 f"{size}, {c['updates']} updates, W = {c['warmup']}, valid every {c['valid_every']} updates\n\n"
                 f"Data: {p['data']}. Unigram level {p['unigram_level']['train_fit']} bits; a run trains below "
                 f"{p['stuck_threshold']}. Runs on: " + (", ".join(
                     f"{d} ({n} runs)" for d, n in sorted(p.get("runs_per_device", {}).items())) or p["device"])
                 + " (each record names its device).\n\n")
        rows = []
        for arm, m in p["methods"].items():
            rng, tight = m["lr_range"], m.get("lr_range_tight")
            rows.append([m["label"], _lr(m["best_lr"]) + ("" if m["grid_closed"] else " (open)"),
                         (f"{_lr(rng[0])} - {_lr(rng[1])}" + ("" if m["grid_closed"] else "+")) if rng else "none",
                         f"{_lr(tight[0])} - {_lr(tight[1])}" if tight else "-",
                         _lr(m["largest_lr_run"]), ", ".join(f"{x:.3f}" for x in m["best_valid_at_best_lr"]) or "-"]
                        + [p["versus"].get(arm, {}).get("ratio_mean") if arm != p["tfixup_arm"] else "-",
                           *_per_seed(p["versus"].get(arm))])
        text += common.md_table(["method", "best lr", "trains at", f"within {TIGHT_BITS} bit of its best",
                                 "largest lr run", "best valid at best lr (per seed)", "T-Fixup's ratio (mean)",
                                 "per seed (ratio, step)", "still improving; ratio at half the budget (per seed)"],
                                rows) + "\n\n"
        grid_lrs = sorted({g["lr"] for m in p["methods"].values() for g in m["grid"]})
        text += "Best valid loss (bits) per lr, first seed (STUCK: not below the level; NaN: diverged):\n\n"
        text += common.md_table(["method"] + [_lr(x) for x in grid_lrs], [
            [m["label"]] + [_cell(next((g for g in m["grid"] if g["lr"] == x), None)) for x in grid_lrs]
            for m in p["methods"].values()]) + "\n\n"
    return text


def _cell(g):
    if g is None:
        return "-"
    return "NaN" if g["status"] == "nan" else f"{g['best_valid']:.3f}" + ("" if g["trains"] else " STUCK")


def _per_seed(v) -> list:
    """A method's comparison V seed by seed, 's1: ...; s2: ...': the ratio (step) and the devices where they differ;
    whether it was still improving and the ratio at half the budget ("-" without any pair)."""
    if not (v and v["pairs"]):
        return ["-", "-"]
    ratios = [(f"{p['ratio']:.3f} ({p['step']:.3f})" if p["ratio"] is not None else "not reached")
              + (f" [T-Fixup on {p['devices'][0]}, the method on {p['devices'][1]}]"
                 if len(set(p.get("devices", []))) > 1 else "") for p in v["pairs"]]
    halves = [("yes" if p.get("method_still_improving") else "no") + ", "
              + ("-" if p.get("ratio_at_half_budget") is None else f"{p['ratio_at_half_budget']:.3f}")
              + f" at {p.get('half_budget')}" for p in v["pairs"]]
    return ["; ".join(f"s{p['seed']}: {c}" for p, c in zip(v["pairs"], cells)) for cells in (ratios, halves)]


def plot(res: dict, path: pathlib.Path) -> None:
    n = max(1, len(res["parts"]))  # one empty panel without any part
    fig, axes = common.panel_grid(n, n, 6.2, 4.4)
    for ax, (part, p) in zip(axes, res["parts"].items()):
        arms = study_arms(part)
        for arm, m in p["methods"].items():
            pts = [(g["lr"], g["best_valid"]) for g in m["grid"] if g["status"] == "ok" and g["best_valid"] is not None
                   and math.isfinite(g["best_valid"])]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.3, color=arms[arm].color, label=m["label"])
            nan = [g["lr"] for g in m["grid"] if g["status"] == "nan"]
            if nan:
                ax.scatter(nan, [p["unigram_level"]["train_fit"] + 0.3] * len(nan), marker="x", s=30,
                           color=arms[arm].color)
        common.level_lines(ax, p["unigram_level"]["train_fit"], p["stuck_threshold"], "trains below this")
        ax.set_xscale("log", base=2)
        ticks = sorted({g["lr"] for m in p["methods"].values() for g in m["grid"]})
        ax.set_xticks(ticks, [_lr(x) for x in ticks], fontsize=7)
        ax.minorticks_off()
        common.finish_axes(ax, "peak learning rate", "best valid loss (bits)", (
            "translation, 6+6" if part == "translation" else f"LM, {p['config']['depths'][0]} layers")
            + f" on {p['device']} (x: diverged)", legend=dict(fontsize=6.5))
    common.save_titled_figure(path, fig, "Best valid loss against the learning rate")


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "lr.{json,md,png}, lr/runs/")
    runlib.add_training_options(p, 2, ())
    p.add_argument("--lm-data", help="an existing language-model data-bin (default: prepared once, harness.bench.lm)")
    p.add_argument("--device", nargs="+", default=["cpu"], metavar="[PART=]DEVICE",
                   help=f"where the runs train: {' or '.join(common.DEVICES)} (cuda: the first GPU) for every part, "
                        f"or per part, e.g. translation=cuda lm=cpu (default cpu)")
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    p.add_argument("--rounds", type=int, default=8, help="rounds of growing the grid at most (default 8)")
    return p


def devices(given: list) -> dict:
    """part -> device from --device's words: DEVICE for every part, or PART=DEVICE."""
    out = {}
    for word in given:
        part, _, dev = word.rpartition("=")
        if dev not in common.DEVICES or (part and part not in PARTS):
            sys.exit(f"error: --device {word}: give {' or '.join(common.DEVICES)}, or PART=DEVICE with PART one of "
                     f"{', '.join(PARTS)} (e.g. --device translation=cuda lm=cpu)")
        out.update({part: dev} if part else {p: dev for p in PARTS})
    return {p: out.get(p, "cpu") for p in PARTS}


def make_config(args) -> dict:
    cfg = dict(MODES[args.mode], mode=args.mode, device=devices(args.device))
    for part in PARTS:  # a part not asked for, or without a setting in this mode, is None
        on = part in args.parts and cfg.get(part)
        cfg[part] = dict(cfg[part], dropout=args.dropout, decay_period=args.decay_period) if on else None
    return cfg


def main(argv=None):
    args = parser().parse_args(argv)
    cfg = make_config(args)
    data, levels, t, c = {}, {}, cfg.get("translation"), cfg.get("lm")
    if t:
        data["translation"] = common.prepare_data(t["valid_lines"], t["test_lines"], args.data, args.data_root)
        levels["translation"] = unigram_level(data["translation"], "de", "en")
    if c:
        data["lm"] = lm.prepare_data(c["train_lines"], c["valid_lines"], args.lm_data, args.data_root)
        levels["lm"] = lm_unigram_level(data["lm"])
    thresholds = {k: v["train_fit"] - args.margin for k, v in levels.items()}
    store = pathlib.Path(args.out) / ("lr" + args.tag) / "runs"
    for round_ in range(args.rounds):
        runs = plan(cfg, data, runlib.load_records(store), thresholds)
        res = runlib.run_study("lr" + args.tag, args.out, runs,
                               lambda recs: summarise(cfg, recs, levels, data, args.margin, len(runs)),
                               plot, report, "best valid loss against lr", args.jobs, args.threads,
                               report_only=args.report_only, only=args.only, quiet=True)
        if args.report_only or args.only or len(plan(cfg, data, runlib.load_records(store), thresholds)) == len(runs):
            break
        common.log(f"round {round_ + 1}: the grid grows ({len(runs)} runs planned so far)")
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
