"""T-Fixup for a decoder-only language model on real English text: 6 and 24 layers, without warmup.

Data: Multi30k's English side, Moses-tokenized and lowercased, words seen twice in train (``prepare_data``), one
stream cut into blocks of ``tokens_per_sample`` tokens. Arms (``study_arms``): each method with a language model on
its paper's schedule, no warmup or the matched warmup, and Post-LN without warmup, the paper's question; the same
width, lr, batch, budget, dropout, seed and evaluation for all. Valid loss in bits per token (perplexity 2^loss); a
run whose best is not ``--margin`` bits below the unigram level (harness/bench/unigram.py) is **stuck**. Headline,
per depth: the updates each arm needs to reach the best valid perplexity of the warmup baseline (Post-LN + matched
warmup), over the baseline's own; the same against the better warmup arm, the reference where Post-LN does not
train. Resumable: runs are recorded under OUT/lm/runs/.

    python -m harness.bench.lm --smoke --out /tmp/lm          # < 1 min, for the tests
    python -m harness.bench.lm --out results/bench --jobs 1    # the study (~30 min of one core)
"""

import gzip
import os
import pathlib
import shutil
import subprocess
import sys

from harness import manifest
from tfixup import atomic, methods
from harness.bench import common, convergence, runs as runlib
from harness.bench.unigram import lm_unigram_level

BASELINE = "postln_matched"
CORPUS = "multi30k"


def study_arms() -> dict:
    """arm name -> common.Arm: each method with a language model on its paper's schedule (warmup ones on the
    matched warmup, dashed in the figure), and Post-LN without warmup."""
    out = []
    for name in (n for n, m in methods.METHODS.items() if m.lm_arch):
        kinds = ["matched" if methods.method(name).warmup else "nowarmup"]
        if name == "postln":  # right after its warmup baseline: the arms an interrupted study must not miss
            kinds.append("nowarmup")
        out += [common.arm(name, k, linestyle="-" if k == "nowarmup" else "--") for k in kinds]
    return common.arm_table(out)


ARMS = study_arms()

MODES = {
    "smoke": dict(embed=32, ffn=64, heads=2, depths=[2], updates=8, valid_every=4, warmup=4, lr=1e-3,
                  max_tokens=256, tokens_per_sample=32, train_lines=300, valid_lines=50, arms=["tfixup", BASELINE]),
    # CPU width; 400 updates leave the unigram stage (a 6-layer T-Fixup run was 1.3 bits below it by
    # update 80; the report's "stuck" column says for every run) and keep a 24-layer run near 6 min of one
    # core (~0.85 s per update; 6 layers ~0.3 s); W = a quarter of the budget, as in the convergence study
    "default": dict(embed=128, ffn=512, heads=4, depths=[6, 24], updates=400, valid_every=25, warmup=100, lr=1e-3,
                    max_tokens=1024, tokens_per_sample=64, train_lines=0, valid_lines=0, arms=None),
}


def _tokenize(lines):
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang="en")
    return [tok.tokenize(line.strip(), escape=False, return_str=True).lower() for line in lines]


def _read_lines(path: pathlib.Path, limit: int) -> list:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()[:limit or None]


def prepare_data(train_lines: int = 0, valid_lines: int = 0, data: str = None, root: str = None,
                 shared: pathlib.Path = None) -> pathlib.Path:
    """The LM data-bin of ``shared``/multi30k (default ../shared/data or $TFIXUP_SHARED_DATA), made once under
    ``root`` (default <repo>/work/data-bin) with a manifest.json of its inputs (sha256), parameters and line
    counts; a folder with another manifest is rebuilt. ``data``: an existing LM data-bin, used as is."""
    if data:
        path = pathlib.Path(data)
        if not (path / "dict.txt").is_file() or not (path / "valid.idx").is_file():
            common.die(f"--data {path}: not a language-model data-bin (no dict.txt, valid.idx): "
                       "leave --data out to prepare one")
        return path
    source = pathlib.Path(shared or common.shared_data_dir()) / CORPUS
    inputs = {"train": source / "train.en.gz", "valid": source / "val.en.gz"}
    for f in inputs.values():
        if not f.is_file():
            common.die(f"{f} not found (set TFIXUP_SHARED_DATA to the folder holding {CORPUS}/)")
    root = pathlib.Path(root) if root else common.REPO / "work" / "data-bin"
    path = root / f"lm-{CORPUS}-en-t{train_lines}-v{valid_lines}"
    params = {"corpus": f"{CORPUS} English", "train": str(inputs["train"].resolve()),
              "valid": str(inputs["valid"].resolve()), "train_lines": train_lines, "valid_lines": valid_lines,
              "tokenizer": "sacremoses en, lowercased", "vocabulary": "train words seen >= 2 times",
              "made_by": "harness/bench/lm.py prepare_data"}
    state = manifest.status(str(path), params)
    if state == "current":
        return path
    if state == "foreign":
        common.die(f"{path} exists without a complete manifest.json (half-made?): remove it, then rerun")
    if shutil.which("fairseq-preprocess") is None:
        common.die("fairseq-preprocess not found: run this with the project's environment active "
                   "(. .venv/bin/activate; bash scripts/install.sh makes it)")
    common.log(f"preparing {path} ({state})")

    def build(out):  # in the empty folder OUT; its tokenized text is removed once binarised
        text, counts = out / "text", {}
        text.mkdir()
        for split, f in inputs.items():
            lines = _tokenize(_read_lines(f, train_lines if split == "train" else valid_lines))
            (text / f"{split}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            counts[split] = len(lines)
        proc = subprocess.run(
            ["fairseq-preprocess", "--only-source", "--trainpref", str(text / "train.txt"),
             "--validpref", str(text / "valid.txt"), "--destdir", str(out), "--thresholdsrc", "2",
             "--workers", "1"], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode != 0:
            common.die(f"fairseq-preprocess failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        shutil.rmtree(text)
        (out / "preprocess.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        m = manifest.build(params, counts, [str(f) for f in inputs.values()], "harness/bench/lm.py", folder=str(out))
        # one side, so not manifest.build's two-language check: the rates as fairseq-preprocess reported them
        m["unk_rate_percent"] = manifest.unk_rates(proc.stdout + proc.stderr, counts)
        atomic.write_json(out / manifest.NAME, m)

    # made in a temp folder and moved into place, replacing a stale one; a failure leaves nothing
    atomic.write_folder(path, build)
    return path


# the settings of a mode that the command line overrides (runs.add_overrides)
OVERRIDES = {**dict.fromkeys(("updates", "warmup", "embed", "ffn", "heads", "max_tokens", "valid_every"), int),
             "lr": float, "depths": [int]}


def make_run(cfg: dict, data, arm: str, depth: int, lr: float, seed: int, arms: dict = None,
             device: str = "cpu") -> "runlib.Run":
    """One run of ARM (of ``arms``, default this study's) with DEPTH layers at LR, valid loss every ``valid_every``
    updates, nothing saved; its id is LDEPTH-ARM-lrLR-sSEED."""
    a = (arms or ARMS)[arm]
    recipe = methods.Recipe(
        a.method, cfg["embed"], cfg["ffn"], cfg["heads"], 0, depth, lr=lr, schedule=a.schedule,
        warmup=cfg["warmup"], decay_period=cfg["decay_period"], max_tokens=cfg["max_tokens"],
        max_update=cfg["updates"], dropout=cfg["dropout"], seed=seed, task="language_modeling",
        tokens_per_sample=cfg["tokens_per_sample"], sample_break_mode="none")
    args = common.train_args(recipe, device) + common.valid_args(cfg["valid_every"])
    return runlib.Run(f"L{depth}-{arm}-lr{lr:g}-s{seed}", dict(
        method=arm, depth=depth, lr=lr, seed=seed, updates=cfg["updates"]), args, str(data))


def make_runs(cfg: dict, data: pathlib.Path) -> list:
    """Per depth (shallow first), every arm (``arms`` None: all): the same recipe but the method and schedule."""
    return [make_run(cfg, data, arm, depth, cfg["lr"], cfg["seed"], device=cfg.get("device", "cpu"))
            for depth in cfg["depths"] for arm in cfg["arms"] or list(ARMS)]


HEADLINE_KEYS = ("best_ppl", "best_at", "updates_to_baseline_best", "ratio_to_baseline",
                 "updates_to_better_warmup_best", "ratio_to_better_warmup", "stuck", "status")


def summarise(cfg: dict, records: dict, level: dict, data: pathlib.Path, margin: float) -> dict:
    threshold = level["train_fit"] - margin
    rows = []
    for rec in records.values():
        row = convergence.curve_row(rec, ("id", "method", "depth", "lr", "seed", "updates", "status", "wall_s"),
                                    threshold)
        rows.append({**row, "schedule": ARMS[rec["method"]].schedule, "s_per_update": rec.get("s_per_update"),
                     "best_ppl": round(2 ** row["best_valid"], 2) if row["best_valid"] is not None else None})
    headline = {}
    for depth in cfg["depths"]:
        here = {r["method"]: r for r in rows if r["depth"] == depth}
        base = records.get(f"L{depth}-{BASELINE}-lr{cfg['lr']:g}-s{cfg['seed']}")
        # the better warmup arm (the lowest best valid loss of the arms on the matched warmup): the reference
        # where Post-LN's own warmup run does not train
        warm = [r for r in here.values() if r["schedule"] == "matched" and r["best_valid"] is not None]
        better = min(warm, key=lambda r: r["best_valid"]) if warm else None
        for r in here.values():
            curve, ok = records[r["id"]]["valid_curve"], r["status"] == "ok"
            for key, ref in (("baseline", base), ("better_warmup", better and records[better["id"]])):
                r[f"updates_to_{key}_best"], r[f"ratio_to_{key}"] = common.to_best(
                    curve, ref["valid_curve"]) if ref and ok else (None, None)
        if here:
            b = here.get(BASELINE) or {}
            headline[f"{depth} layers"] = {
                "baseline_best_ppl": b.get("best_ppl"), "baseline_best_at": b.get("best_at"),
                "better_warmup": better and better["method"], "better_warmup_best_ppl": better and better["best_ppl"],
                "arms": {m: {k: here[m][k] for k in HEADLINE_KEYS} for m in ARMS if m in here}}
    return {**common.study_result("lm", cfg, data, records, unigram_level=level, stuck_threshold=round(threshold, 4),
                                  margin_bits=margin), "headline": headline,
            "rows": sorted(rows, key=lambda r: (r["depth"], list(ARMS).index(r["method"]))), "records": records}


def report(res: dict) -> str:
    cfg, lv = res["config"], res["unigram_level"]
    text = runlib.report_head("T-Fixup for a decoder-only language model, without warmup", res, cfg["n_runs"], (
        f"Decoder-only LM {cfg['embed']}-{cfg['ffn']}-{cfg['heads']}, {' and '.join(map(str, cfg['depths']))} "
        f"layers, tied input/output embedding, blocks of {cfg['tokens_per_sample']} tokens, {cfg['max_tokens']} "
        f"tokens per update, {cfg['updates']} updates, dropout {cfg['dropout']}, Adam (0.9, 0.98), wd 1e-4, no "
        f"clipping, peak lr {cfg['lr']:g} for every arm, seed {cfg['seed']}. Schedules: **no warmup** "
        f"lr*sqrt(P/(P+t)), P = {cfg['decay_period']} (T-Fixup's); **matched warmup** (inverse_sqrt_matched) "
        f"linear from 1e-7 over W = {cfg['warmup']} updates onto the same curve, then that curve: after update W "
        f"every arm has the same rate. Valid loss: cross-entropy in bits per token, perplexity = 2^loss, every "
        f"{cfg['valid_every']} updates on all {lv['valid_tokens']} valid tokens.\n\n"
        f"**Unigram level** of this valid set (computed from the data, harness/bench/unigram.py): "
        f"{lv['train_fit']} bits = perplexity **{lv['train_fit_ppl']}** for the unigram model fit on train "
        f"({lv['oracle']} bits = {lv['oracle_ppl']} for the best unigram model fit on valid itself). A run is "
        f"**stuck** when its best valid loss is not at least {res['margin_bits']} bit below {lv['train_fit']}, "
        f"i.e. above {res['stuck_threshold']} bits (perplexity {2 ** res['stuck_threshold']:.1f}).\n\n"))
    text += common.mean_lr_text([("no warmup", "nowarmup", cfg["warmup"], cfg["decay_period"]),
                                 ("matched warmup", "matched", cfg["warmup"], cfg["decay_period"])],
                                cfg["updates"], cfg["lr"])
    if res["headline"]:
        text += ("## Headline: updates to reach the warmup baseline's best valid perplexity\n\n"
                 f"Baseline: {ARMS[BASELINE].label}. Ratio: an arm's updates to the baseline's best / the updates "
                 "the baseline needs for it. The same against the better warmup arm at that depth (the arm on the "
                 "matched warmup with the lower best valid loss).\n\n")
        rows = []
        for depth, h in res["headline"].items():
            for m, a in h["arms"].items():
                reached, better = a["updates_to_baseline_best"], a["updates_to_better_warmup_best"]
                if reached is None:
                    reached = "not reached" if h["baseline_best_ppl"] is not None else "no baseline run yet"
                rows.append([depth, ARMS[m].label, a["best_ppl"], a["best_at"], reached, a["ratio_to_baseline"],
                             ARMS[h["better_warmup"]].label if h["better_warmup"] else None,
                             better if better is not None else "not reached", a["ratio_to_better_warmup"],
                             "STUCK" if a["stuck"] else "no", a["status"]])
        text += common.md_table(["depth", "arm", "best valid ppl", "at update", "updates to the baseline's best",
                                 "ratio", "better warmup arm", "updates to its best", "ratio to it", "stuck",
                                 "status"], rows) + "\n\n"
        at = [d for d, h in res["headline"].items() if h["arms"].get(BASELINE, {}).get("stuck")]
        if at:
            text += (f"At {' and '.join(at)} the baseline itself is **stuck** at the unigram stage: there the "
                     "updates to its best measure how soon an arm gets past word frequencies, not a speed-up "
                     "over a baseline that trains.\n\n")
    return text + "## Every run\n\n" + common.md_table(
        ["depth", "arm", "status", "best valid (bits)", "best ppl", "at update", "final valid (bits)", "stuck",
         "s/update", "wall s"],
        [[r["depth"], ARMS[r["method"]].label, r["status"], r["best_valid"], r["best_ppl"], r["best_at"],
          r["final_valid"], "STUCK" if r["stuck"] else "no", r["s_per_update"], r["wall_s"]]
         for r in res["rows"]]) + "\n"


def plot(res: dict, path: pathlib.Path) -> None:
    depths = res["config"]["depths"]
    fig, axes = common.panel_grid(len(depths), len(depths), 5.6, 4.3)
    ppl = 2 ** res["unigram_level"]["train_fit"]
    for ax, depth in zip(axes, depths):
        for arm in ARMS.values():
            rec = next((r for r in res["records"].values() if r["method"] == arm.name and r["depth"] == depth), None)
            if rec and rec["valid_curve"]:
                u, l = zip(*rec["valid_curve"])
                ax.plot(u, [min(2 ** x, 1e5) for x in l], color=arm.color, lw=1.3, ls=arm.linestyle, label=arm.label)
        common.level_lines(ax, ppl, level_label=f"unigram level ({ppl:.0f})")
        ax.set_yscale("log")
        common.finish_axes(ax, "updates", "valid perplexity", f"{depth} layers", grid=dict(which="both"),
                           legend=dict(fontsize=7))
    common.save_titled_figure(path, fig, "Decoder-only LM on Multi30k English, {embed}-{ffn}-{heads}, lr {lr:g}"
                              .format(**res["config"]))


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "lm.{json,md,png}, lm/runs/",
                            data="an existing language-model data-bin", data_root="<repo>/work/data-bin")
    runlib.add_training_options(p, 1, OVERRIDES)
    runlib.add_device_option(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--methods", nargs="+", choices=list(ARMS),
                   help="run now only these arms (the report covers the whole study)")
    return p


def make_config(args) -> dict:
    return runlib.with_overrides(dict(MODES[args.mode], mode=args.mode, dropout=args.dropout,
                                      decay_period=args.decay_period, seed=args.seed, device=args.device), args,
                                 OVERRIDES)


def plan(data, mode: str = "default") -> list:
    return runlib.default_plan(sys.modules[__name__], data, mode)


def main(argv=None):
    args = parser().parse_args(argv)
    cfg = make_config(args)
    data = prepare_data(cfg["train_lines"], cfg["valid_lines"], args.data, args.data_root)
    level = lm_unigram_level(data)
    common.log(f"unigram level of valid: {level['train_fit']} bits, perplexity {level['train_fit_ppl']} "
               f"(fit on train); {level['oracle']} bits, perplexity {level['oracle_ppl']} (fit on valid)")
    all_runs = make_runs(cfg, data)
    cfg["n_runs"] = len(all_runs)
    runlib.run_study("lm" + args.tag, args.out, all_runs, lambda recs: summarise(cfg, recs, level, data, args.margin),
                     plot, report, "valid perplexity curves", args.jobs, args.threads,
                     todo=convergence.selected(all_runs, args.methods), report_only=args.report_only, only=args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
