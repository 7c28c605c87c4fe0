"""What the benchmarks share: the real data, fairseq-train runs, logs, atomic outputs. Every training run is
``fairseq-train --user-dir fairseq_tfixup`` in a subprocess, read back from its JSON log, so that a benchmark
measures exactly what a user runs."""

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import logging
import math
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import time

# fairseq-free: a study's own process only launches fairseq-train runs and reads their logs, without
# paying fairseq's ~6 s import
from harness import manifest
from tfixup import atomic, methods

REPO = pathlib.Path(__file__).resolve().parents[2]


def shared_data_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TFIXUP_SHARED_DATA", REPO.parent / "shared" / "data"))


def die(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare_data(valid_lines: int, test_lines: int, data: str = None, root: str = None) -> pathlib.Path:
    """A data-bin of the real IWSLT'14 De-En sample (full train sample, the first VALID_LINES/TEST_LINES of
    fairseq's valid/test): DATA as is, else built once by scripts/prepare-iwslt14.sh under ROOT (<repo>/data-bin)."""
    if data:
        path = pathlib.Path(data)
        if not (path / "dict.de.txt").is_file():
            die(f"--data {path}: not a fairseq data-bin of IWSLT'14 de-en (no dict.de.txt)")
        return path
    root = pathlib.Path(root) if root else REPO / "data-bin"
    path = root / f"bench-iwslt14-de-en-v{valid_lines}-t{test_lines}"
    if not (path / "dict.de.txt").is_file():
        if not (shared_data_dir() / "iwslt14-de-en").is_dir():
            die(f"shared data not found at {shared_data_dir()} (set TFIXUP_SHARED_DATA)")
        log(f"preparing {path}")
        proc = subprocess.run(["bash", str(REPO / "scripts" / "prepare-iwslt14.sh"), "--out", str(path),
                               "--shared", str(shared_data_dir()), "--valid-lines", str(valid_lines),
                               "--test-lines", str(test_lines)], capture_output=True, text=True)
        if proc.returncode != 0:
            die(f"prepare-iwslt14.sh failed: {proc.stderr.strip().splitlines()[-1:]}")
    return path


def data_counts(path: pathlib.Path) -> dict:
    """Sentence pairs per split (harness/manifest.py: the data-bin's manifest, else fairseq's reader)."""
    return manifest.sentence_counts(path, "de", "en")


def data_description(path) -> str:
    """One line naming a study's data and its sentence counts: the HuggingFace study's export (meta.json), the LM
    data-bin of harness/bench/lm.py (its manifest), else an IWSLT'14 data-bin (harness/manifest.py)."""
    path = pathlib.Path(path)
    if (path / "meta.json").is_file():
        meta = json.loads((path / "meta.json").read_text())
        merges = (meta.get("parameters") or {}).get("bpe_merges", 8000)
        return (f"Multi30k De-En ({', '.join(f'{k} {v}' for k, v in meta['sentences'].items())} sentence pairs; test "
                f"= test_2016_flickr), Moses-tokenized, lowercased, {merges} joint BPE merges, dictionaries de "
                f"{meta['vocab']['de']} / en {meta['vocab']['en']} (the quality study's data-bin, exported by "
                f"`python -m harness.bench.hf export`); LM and BERT: its English side")
    if (path / "dict.txt").is_file():  # one side: a language model's (harness/bench/lm.py prepare_data)
        m = manifest.read(str(path)) or {}
        counts, files = m.get("sentences", {}), m.get("params", {})
        train, valid = ("/".join(pathlib.Path(files.get(k, "?")).parts[-2:]) for k in ("train", "valid"))
        unk = next((v for k, v in m.get("unk_rate_percent", {}).items() if k.startswith("valid.")), None)
        return (f"Multi30k English side, {train} ({counts.get('train')} lines) to train, {valid} "
                f"({counts.get('valid')} lines) to validate; Moses-tokenized, lowercased, words seen >= 2 times in "
                f"train ({unk}% of valid tokens <unk>)")
    parts = ", ".join(f"{k} {v}" for k, v in data_counts(path).items())
    return (f"IWSLT'14 De-En real sample ({parts} sentence pairs): train = 18.6k-pair train sample, "
            f"valid/test = first lines of fairseq's valid/test; BPE 10k (fairseq recipe)")


# One metric for every study: a curve is [(update, value), ...] (valid loss, lower is better; valid BLEU, higher);
# a point whose value is None or not finite (a diverged run's NaN) is no measurement and is skipped.


def _finite(curve) -> list:
    return [(u, v) for u, v in curve if v is not None and math.isfinite(v)]


def best(curve, higher: bool = False) -> tuple:
    """(update, value) of CURVE's lowest finite value (``higher``: highest), the first on a tie; else (None, None)."""
    pts = _finite(curve)
    return (max if higher else min)(pts, key=lambda p: p[1]) if pts else (None, None)


def best_lr(by_lr: dict):
    """The lr of the lowest best valid loss among the runs (records) that finished without diverging, or None."""
    ok = {lr: best(r.get("valid_curve") or [])[1] for lr, r in by_lr.items() if r and r.get("status") == "ok"}
    ok = {lr: v for lr, v in ok.items() if v is not None}
    return min(ok, key=ok.get) if ok else None


def reach(curve, target, higher: bool = False):
    """The first update whose finite value is <= TARGET (``higher``: >=); None if none is, or without TARGET."""
    if target is None:
        return None
    return next((u for u, v in _finite(curve) if (v >= target if higher else v <= target)), None)


def to_best(curve, base, higher: bool = False, digits: int = 3) -> tuple:
    """(updates, ratio): when CURVE first reaches BASE's best, and that / when BASE did (DIGITS); None if not there."""
    b_upd, b_best = best(base, higher)
    u = reach(curve, b_best, higher)
    return u, (round(u / b_upd, digits) if u is not None and b_upd else None)


def recipe(cfg: dict, method: str, **kw) -> "methods.Recipe":
    """A study's recipe for ``method``: its config's size, warmup W (default 4000) and tokens per update, and ``kw``."""
    return methods.Recipe(method, cfg["embed"], cfg["ffn"], cfg["heads"], cfg["layers"], cfg["layers"],
                          **{"warmup": cfg.get("warmup", 4000), "max_tokens": cfg["max_tokens"], **kw})


DEVICES = ("cpu", "cuda")  # where a study's runs train: fairseq's --cpu, or its default, the first GPU


def train_args(r, device: str = "cpu") -> list:
    """A study run's fairseq-train arguments (tfixup/methods.py) on DEVICE: JSON log lines, no data-loader process."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose {' or '.join(DEVICES)}")
    return methods.train_args(r, cpu=device == "cpu", log_format="json", num_workers=0)


def valid_args(every) -> list:
    """fairseq-train's flags of a run that validates (and logs) every EVERY updates and saves nothing."""
    return ["--validate-interval-updates", every, "--validate-interval", 100000, "--save-interval", 100000,
            "--no-save", "--log-interval", every]


# A schedule's suffix in an arm's name, its words in an arm's label and its line in a figure (fairseq's
# inverse_sqrt dashed, T-Fixup's curve solid, P = W dotted). warmup, matched and nowarmup are
# tfixup/methods.py's SCHEDULES; nowarmup_w is nowarmup with P = W, T-Fixup on nearly the warmup baseline's curve.
SUFFIX = {"warmup": "_warmup", "matched": "_matched", "nowarmup": "", "nowarmup_w": "_pw"}
SCHEDULE_LABEL = {"warmup": " + warmup", "matched": " + matched warmup", "nowarmup": ", no warmup",
                  "nowarmup_w": ", no warmup, P = W"}
LINESTYLE = {"warmup": "--", "matched": "-", "nowarmup": "-", "nowarmup_w": ":"}
POSTLN_NO_WARMUP_COLOR = "C2"  # Post-LN without warmup, where a study runs Post-LN both ways (``arm_table``)


@dataclasses.dataclass(frozen=True)
class Arm:
    """What a study trains (a method of tfixup/methods.py on a schedule) and how its records and figures name it."""
    name: str  # in run ids and in the records (their "method")
    method: str  # its row in tfixup/methods.py METHODS
    schedule: str  # a key of SUFFIX
    label: str
    color: str
    linestyle: str
    group: str = "main"  # the convergence study's: "main", or "fig3c" for the arms of the paper's Fig. 3c


def arm(method: str, schedule: str, name: str = "", label: str = "", linestyle: str = "", group: str = "main") -> Arm:
    """METHOD on SCHEDULE, named, labelled and drawn after its row of tfixup/methods.py and SCHEDULE unless given."""
    row = methods.method(method)
    return Arm(name or method + SUFFIX[schedule], method, schedule, label or row.label + SCHEDULE_LABEL[schedule],
               row.color, linestyle or LINESTYLE[schedule], group)


def arm_table(arms) -> dict:
    """name -> arm, in order; where Post-LN runs with and without warmup, Post-LN without has a color of its own."""
    arms = list(arms)
    postln = {a.schedule for a in arms if a.method == "postln"}
    both = "nowarmup" in postln and len(postln) > 1
    return {a.name: dataclasses.replace(a, color=POSTLN_NO_WARMUP_COLOR)
            if both and a.method == "postln" and a.schedule == "nowarmup" else a for a in arms}


def machine() -> dict:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": importlib.metadata.version("torch"), "fairseq": fairseq_version(), "cuda": cuda_device(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def cuda_device():
    """The first CUDA GPU's name, or None; torch (~2 s to import) only where an NVIDIA driver is or it is loaded."""
    if "torch" not in sys.modules and not any(
            os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/nvidiactl")) and not shutil.which("nvidia-smi"):
        return None
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def fairseq_version() -> str:
    """The installed fairseq's version, from its package metadata (importing fairseq takes ~6 s)."""
    for dist in ("fairseq-fixed", "fairseq"):  # Python >= 3.11 needs the fixed fork (README)
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import fairseq
        return fairseq.__version__
    except ImportError:  # a machine that runs only the fairseq-free studies (harness/bench/hf.py)
        return None


def command_line() -> str:
    return f"python -m harness.bench.{pathlib.Path(sys.argv[0]).stem} " + " ".join(map(shlex.quote, sys.argv[1:]))


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use: a study's process pays for it only to draw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def panel_grid(n: int, max_cols: int, width: float, height: float) -> tuple:
    """(figure, axes): N panels of WIDTH x HEIGHT inches in rows of at most MAX_COLS, the grid's spare cells hidden."""
    ncols = min(max_cols, n)
    nrows = -(-n // ncols)
    fig, grid = pyplot().subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in grid.flatten()[n:]:
        ax.set_visible(False)
    return fig, grid.flatten()[:n]


def finish_axes(ax, xlabel: str, ylabel: str = None, title: str = None, title_size: float = 9, grid: dict = None,
                legend: dict = None) -> None:
    """A panel's axis labels, title, grid and legend (font size 8 unless LEGEND says)."""
    if title is not None:
        ax.set_title(title, fontsize=title_size)
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, **(grid or {}))
    ax.legend(**{"fontsize": 8, **(legend or {})})


def level_lines(ax, level: float, threshold: float = None, threshold_label: str = "",
                level_label: str = "unigram level") -> None:
    """The unigram level (dashed) and, given, the threshold of a run that trains (dotted), in gray."""
    ax.axhline(level, color="gray", ls="--", lw=1, label=level_label)
    if threshold is not None:
        ax.axhline(threshold, color="gray", ls=":", lw=1, label=threshold_label)


def save_titled_figure(path, fig, title: str) -> None:
    """FIG with TITLE over its panels, laid out, written atomically to PATH."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic.save_figure(path, fig)


def md_table(headers: list, rows: list) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def versus_methods_md(per_method: dict, intro: str, headers: list, cells) -> str:
    """The section on T-Fixup against every method: INTRO, then a table of HEADERS with a row per group of runs (a key
    of PER_METHOD) and method: the key, the method's label and ``cells(method, entry)``; "" without any."""
    if not per_method:
        return ""
    rows = [[k, methods.method(name).label, *cells(name, v)] for k, group in per_method.items()
            for name, v in group.items()]
    return ("## T-Fixup against every method, on each of its schedules and on its better one\n\n" + intro
            + md_table(headers, rows) + "\n\n")


def study_result(benchmark: str, cfg: dict, data, records: dict, names: dict = None, n_runs: int = None,
                 **measures) -> dict:
    """The head of a study's .json: study, mode, command, machine, data (a data-bin; with NAMES, corpus -> data-bin)
    and settings, then MEASURES and whether all N_RUNS runs (default: the config's n_runs) are recorded."""
    if names:
        described = {"data": "; ".join(f"{names[c]}: {p} ({data_counts(pathlib.Path(p))})" for c, p in data.items())}
    else:
        described = {"data": data_description(data), "data_counts": data_counts(data)}
    n_runs = cfg["n_runs"] if n_runs is None else n_runs
    return {"benchmark": benchmark, "mode": cfg["mode"], "command": command_line(), "machine": machine(), "threads": 1,
            **described, "config": cfg, **measures, "complete": len(records) == n_runs, "runs_recorded": len(records)}


def header_md(title: str, meta: dict) -> str:
    m = meta["machine"]
    return (f"# {title}\n\n- command: `{meta['command']}`\n"
            f"- machine: {m['cpu']} ({m['cores']} cores, shared), {m['platform']}; torch {m['torch']}, "
            f"fairseq {m['fairseq']}; threads per run: {meta.get('threads', 1)}\n"
            f"- date: {m['date_utc']}\n- data: {meta['data']}\n- mode: {meta['mode']}\n\n")


def benchmark_parser(description: str, outputs: str, threads_help: str = "torch threads per run (default 1)",
                     quick: bool = False, data: str = "an existing data-bin (IWSLT'14 de-en)",
                     data_root: str = "<repo>/data-bin"):
    """Every benchmark's options: --smoke (and --quick), --out, --data, --data-root, --threads, --tag."""
    p = argparse.ArgumentParser(description=description)
    g = p.add_mutually_exclusive_group()
    if quick:
        g.add_argument("--quick", dest="mode", action="store_const", const="quick", help="~3 min")
    g.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="<1 min, for the tests")
    p.set_defaults(mode="default")
    p.add_argument("--out", required=True, help=f"output folder ({outputs})")
    p.add_argument("--data", help=f"{data}; default: prepared once under --data-root")
    p.add_argument("--data-root", help=f"where to prepare data (default {data_root})")
    p.add_argument("--threads", type=int, default=1, help=threads_help)
    p.add_argument("--tag", default="", help="suffix of the output file names")
    return p


def write_outputs(out: pathlib.Path, stem: str, result: dict, plot, report_text: str, caption: str) -> None:
    """STEM.json, STEM.png and STEM.md (the report with the figure), each written atomically."""
    atomic.write_json(out / f"{stem}.json", result)
    plot(result, out / f"{stem}.png")
    atomic.write_text(out / f"{stem}.md", report_text + f"\n![{caption}]({stem}.png)\n")


def mean_lr_text(schedules: list, updates: int, lr: float, budget: str = "") -> str:
    """A report's sentence on each schedule's mean lr over UPDATES (tfixup/schedules.py) as a fraction of the peak LR,
    and what a warmup gives up against no warmup in peak-lr updates. SCHEDULES: (label, kind, W, P) each."""
    from tfixup.schedules import mean_lr

    cells, full = [], None
    for label, kind, warmup, period in schedules:
        frac = mean_lr(kind, lr, updates, warmup, period) / lr
        if kind == "nowarmup" and full is None:
            full = frac
        gives_up = "" if kind == "nowarmup" or full is None else \
            f" ({(full - frac) * updates:.0f} peak-lr updates fewer than no warmup)"
        cells.append(f"{label} {frac:.2f}{gives_up}")
    return (f"**Mean lr over the {budget or f'{updates}-update'} budget**, as a fraction of the peak lr "
            f"{lr:g} (tfixup/schedules.py): " + "; ".join(cells) + ".\n\n")


def run_env(threads) -> dict:
    """The environment of a run's own process (``python -m harness.bench.STUDY one``): THREADS threads, unbuffered,
    nothing fetched from a hub (models are built from configs), this checkout importable."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore",
                PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

