"""The main job's record, made by the job itself, and its publication into results/main-job/.

    python3 -m harness.main_job record RUN --marks T0 T1 T2 T3 --busy B --threads N --data DIR [-- ARGS]
    python3 -m harness.main_job publish RUN [--to results/main-job]
    python3 -m harness.main_job timing FILE T0 [KEY=VALUE ...]

record (scripts/quickstart.sh's last step): RUN/main-job.json, with each step's time (T0..T3: the epoch seconds at
which the job started and its install, prepare and train steps ended), the machine, the results and the first
install's time (.venv/install-time.json). publish: into results/main-job/ (replaced whole), with a README.md, and the
suite's time (work/test-suite.json) when measured at the same commit. timing: scripts/install.sh's and
scripts/test.sh's own wall time into FILE.
"""

import argparse
import datetime
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from importlib import metadata

from harness import config, translate
from tfixup import atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = "main-job.json"
SUITE = ROOT / "work" / "test-suite.json"
# what publish copies from a run (its name there -> its name in results/main-job/)
PUBLISHED = {RECORD: "record.json", "summary.txt": "summary.txt", "learning-curve.png": "learning-curve.png",
             "report.md": "report.md", "eval/results.json": "results.json", "eval/averaging.json": "averaging.json",
             "config.resolved.json": "config.resolved.json", "train_command.sh": "train_command.sh"}


class JobError(Exception):
    pass


def job_command(run, args, env=None) -> str:
    """The main job's command as typed: the overrides it had in its environment (config keys, and the variables
    quickstart.sh reads), ENV's last (in its order), then `bash scripts/quickstart.sh ARGS` (--dry-run dropped)."""
    env = env or {}
    keys = [*sorted(config.read_record(run)["values"]), "BPE_MERGES", "WORK_DIR", "TFIXUP_SHARED_DATA"]
    shown = {**{k: os.environ[k] for k in keys if k in os.environ and k not in env}, **env}
    words = [f"{k}={shlex.quote(v)}" for k, v in shown.items()]
    words += ["bash", shlex.quote(translate.shown_path(ROOT / "scripts" / "quickstart.sh"))]
    return " ".join(words + [shlex.quote(a) for a in args if a != "--dry-run"])


def _first(path: str, key: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), "")
    except OSError:
        return ""


def _version(*names) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return ""


def machine(busy=None, threads=None) -> dict:
    mem = _first("/proc/meminfo", "MemTotal").split()
    return {"cpu": _first("/proc/cpuinfo", "model name") or os.uname().machine, "cores": os.cpu_count(),
            "memory_gib": round(int(mem[0]) / 2 ** 20, 1) if mem else None, "busy_cores_at_start": busy,
            "torch_threads": threads, "python": sys.version.split()[0], "torch": _version("torch"),
            "fairseq": _version("fairseq-fixed", "fairseq")}


def commit() -> dict:
    """HEAD of the checkout and whether tracked files differ from it (None outside a git checkout)."""
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted_changes": None}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _read(path):
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record(run, marks, busy, threads, data, args) -> dict:
    """RUN/main-job.json, written atomically from the run's results and the job's step marks."""
    run = pathlib.Path(run)
    res = _read(run / "eval" / "results.json")
    if res is None:
        raise JobError(f"no {run / 'eval' / 'results.json'}: the run is not evaluated (scripts/evaluate.sh)")
    cfg, end = res["config"], time.time()
    t0, installed, prepared, trained = marks
    rec = {"what": "the main job (scripts/quickstart.sh), recorded by the job at its end",
           "command": job_command(run, args), **commit(), "date": _iso(t0), "ended": _iso(end),
           "machine": machine(busy, threads),
           "times": {"install_s": None if "--no-install" in args else round(installed - t0, 1),
                     "prepare_s": round(prepared - installed, 1), "train_s": round(trained - prepared, 1),
                     "evaluate_s": round(end - trained, 1), "total_s": round(end - t0, 1)},
           "first_install": _read(pathlib.Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "install-time.json"),
           "train": {"updates": res["num_updates"], "epochs": int(cfg["MAX_EPOCH"]),
                     "segments": res.get("train_segments"),
                     "wall_s_all_segments": round(3600 * (res.get("train_wall_hours") or 0), 1)},
           "results": {"test_bleu": res["bleu_tok"], "sacrebleu": res["bleu_detok"],
                       "sacrebleu_signature": res["sacrebleu_signature"],
                       "k": ((res.get("averaging") or {}).get("chosen") or {}).get("k"),
                       "test_sentences": res["sentences"], "beam": res["beam"], "lenpen": res["lenpen"]},
           "data": {"data_bin": str(data), "dataset": cfg.get("DATASET")},
           "experiment": res["experiment"], "row": res.get("row"), "config": cfg}
    atomic.write_json(run / RECORD, rec)
    return rec


def publish(run, to) -> pathlib.Path:
    """RUN's record and outputs into the folder TO, replaced whole; its README.md from the record."""
    run, to = pathlib.Path(run), pathlib.Path(to)
    rec = _read(run / RECORD)
    if rec is None:
        raise JobError(f"no record {run / RECORD}: the job writes it at its end; rerun its command to finish it, "
                       "then publish")
    suite = _read(SUITE)
    rec["suite"] = suite if suite and suite.get("commit") == rec["commit"] else None

    def write(tmp):
        for src, name in PUBLISHED.items():
            if name != "record.json" and (run / src).is_file():
                shutil.copyfile(run / src, tmp / name)
        (tmp / "record.json").write_text(json.dumps(rec, indent=2) + "\n")
        (tmp / "README.md").write_text(page(rec))
    return atomic.write_folder(to, write)


def duration(s) -> str:
    s = int(round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s < 3600 else f"{s / 3600:.1f} h"


def _machine_line(rec) -> str:
    m = rec["machine"]
    busy = "" if m.get("busy_cores_at_start") is None else f", {m['busy_cores_at_start']:.1f} busy at the start"
    return f"{m['cpu']}, {m['cores']} cores ({m['memory_gib']} GiB{busy})"


def _install_and_suite(rec) -> str:
    """The first install's time and the test suite's, where the record has them; "" when neither."""
    first, s = rec.get("first_install"), rec.get("suite")
    how = {"built": ", fairseq's build included", "cached": ", fairseq's wheel from pip's cache of an earlier build"}
    how = how.get((first or {}).get("fairseq_wheel"), "")
    return " ".join(x for x in (
        first and (f"The first install of its environment (`bash scripts/install.sh`{how}) took "
                   f"{duration(first['wall_s'])} ({first['date'][:10]})."),
        s and (f"The test suite (`bash scripts/test.sh`) at the same commit took {duration(s['wall_s'])} on "
               f"{s['machine']['cores']} cores ({'passed' if s.get('passed') else 'with failures'}).")) if x)


def page(rec) -> str:
    """results/main-job/README.md: the record, as a page."""
    t, r, c = rec["times"], rec["results"], rec["config"]
    epochs = f"{rec['train']['epochs']} epochs, " if rec["train"]["epochs"] else ""
    steps = [("install (`scripts/install.sh`; seconds when already done)", t["install_s"]),
             ("prepare (tokenize, BPE, binarize; skipped when already done)", t["prepare_s"]),
             (f"train ({epochs}{rec['train']['updates']} updates)", t["train_s"]),
             ("evaluate (K chosen on valid, beam search on test), report, summary", t["evaluate_s"])]
    rows = [f"| {what} | {'skipped (--no-install)' if s is None else duration(s)} |" for what, s in steps]
    resumed = "" if (rec["train"].get("segments") or 1) <= 1 else (
        f" Training was resumed: {rec['train']['segments']} segments, {duration(rec['train']['wall_s_all_segments'])}"
        " in all; the times above are of the last command only.")
    changes = " (with uncommitted changes)" if rec.get("uncommitted_changes") else ""
    return "\n".join([
        "# The CPU main job, as it recorded itself", "",
        "Written by `python -m harness.main_job publish RUN` from the job's own record ([record.json](record.json));",
        "a run of the job replaces this folder, and `python -m harness.docs write` README's numbers.", "",
        f"    {rec['command']}", "",
        f"- commit {rec['commit']}{changes}, {rec['date']} to {rec['ended']}",
        f"- machine: {_machine_line(rec)}; torch {rec['machine']['torch']}, fairseq {rec['machine']['fairseq']}, "
        f"Python {rec['machine']['python']}, {rec['machine']['torch_threads']} torch thread(s)",
        f"- data: {rec['data']['dataset']} ({rec['data']['data_bin']}), prepared by the job",
        f"- model: {rec.get('row') or rec['experiment']}, {c['EMBED_DIM']}-{c['FFN_DIM']}-{c['HEADS']}, "
        f"{c['ENCODER_LAYERS']}+{c['DECODER_LAYERS']} layers, lr {c['LR']}, {c['MAX_TOKENS']} tokens per update; "
        "resolved configuration: [config.resolved.json](config.resolved.json), "
        "command: [train_command.sh](train_command.sh)", "",
        "| step | time |", "|---|---|", *rows, f"| **total** | **{duration(t['total_s'])}** |", "",
        f"Result: **test BLEU {r['test_bleu']:.2f}** tokenized, **sacreBLEU {r['sacrebleu']:.2f}** "
        f"(`{r['sacrebleu_signature']}`) on {r['test_sentences']} test sentences, beam {r['beam']}, the average of the "
        f"last K = {r['k']} checkpoint(s) (K chosen on valid).{resumed}",
        _install_and_suite(rec) or "The first install's time and the suite's were not recorded beside this run.", "",
        "What the job printed at its end: [summary.txt](summary.txt); report: [report.md](report.md); all results: "
        "[results.json](results.json).", "", "![learning curve](learning-curve.png)", ""])


def readme_block(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """README's lines on the main job's time and results (harness/docs.py's generated block "main-job")."""
    rec = _read(results / "main-job" / "record.json")
    link = os.path.relpath(results / "main-job" / "README.md", doc_dir)
    if rec is None:
        return (f"No run of the job has recorded itself yet: [results/main-job]({link}) holds an earlier run, "
                "measured by hand, of an older commit.")
    t, r = rec["times"], rec["results"]
    steps = ", ".join(f"{k[:-2]} {duration(v)}" for k, v in t.items() if k != "total_s" and v is not None)
    return " ".join(x for x in (
        f"Measured by the job itself at commit {(rec['commit'] or '?')[:7]} ({rec['date'][:10]}) on "
        f"{_machine_line(rec)}: **{duration(t['total_s'])}** in all ({steps}), "
        f"test BLEU **{r['test_bleu']:.2f}** (sacreBLEU {r['sacrebleu']:.2f}) ([the run]({link})).",
        _install_and_suite(rec)) if x)


def process_cpu(path, cpu_s: float) -> dict:
    """The suite's CPU seconds by kind of Python process, from the lines they wrote at exit (PATH); ``rest_cpu_s``:
    CPU_S less theirs (shell tools, and processes that ended without Python's exit: killed, or os._exit)."""
    out = {k: {"count": 0, "cpu_s": 0.0} for k in ("pytest", "torch_fairseq", "torch_only", "other_python")}
    for p in map(json.loads, pathlib.Path(path).read_text().splitlines()):
        v = out["pytest" if p["pytest"] else "other_python" if not p["torch"] else
                "torch_fairseq" if p["fairseq"] else "torch_only"]
        v["count"], v["cpu_s"] = v["count"] + 1, v["cpu_s"] + p["cpu_s"]
    for v in out.values():
        v["cpu_s"] = round(v["cpu_s"], 1)
    return {**out, "rest_cpu_s": round(cpu_s - sum(v["cpu_s"] for v in out.values()), 1)}


def timing(path, t0: float, fields, processes=None) -> dict:
    """FILE: a script's own wall time (from T0), date, commit and machine, written atomically; PROCESSES: the
    suite's accounts of its processes (process_cpu)."""
    rec = {"wall_s": round(time.time() - t0, 1), "date": _iso(t0), **commit(), "machine": machine()}
    for kv in fields:
        k, _, v = kv.partition("=")
        rec[k] = json.loads(v) if v in ("true", "false") or v.lstrip("-").replace(".", "", 1).isdigit() else v
    if processes and os.path.isfile(processes):
        rec["processes"] = process_cpu(processes, rec.get("cpu_s", 0.0))
    atomic.write_json(path, rec)
    return rec


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python3 -m harness.main_job", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="the job's record, RUN/main-job.json (quickstart.sh's last step)")
    r.add_argument("run")
    r.add_argument("--marks", nargs=4, type=float, required=True, metavar=("START", "INSTALLED", "PREPARED", "TRAINED"))
    r.add_argument("--busy", type=float, help="cores busy with other work when the job started (harness.cpu_load)")
    r.add_argument("--threads", type=int)
    r.add_argument("--data", required=True)
    u = sub.add_parser("publish", help="a finished job's record and outputs into results/main-job/")
    u.add_argument("run")
    u.add_argument("--to", default=str(ROOT / "results" / "main-job"))
    t = sub.add_parser("timing", help="a script's own wall time into FILE (install.sh, test.sh)")
    t.add_argument("file")
    t.add_argument("start", type=float)
    t.add_argument("fields", nargs="*", metavar="KEY=VALUE")
    t.add_argument("--processes", help="the suite's accounts of its Python processes (scripts/test.sh)")
    a = p.parse_args(argv)
    try:
        if a.command == "record":
            rec = record(a.run, a.marks, a.busy, a.threads, a.data, args)
            print(f"[{time.strftime('%H:%M:%S')}] the job's record: {pathlib.Path(a.run) / RECORD} "
                  f"({duration(rec['times']['total_s'])} in all); into results/main-job/: "
                  f"python3 -m harness.main_job publish {shlex.quote(a.run)}", file=sys.stderr)
        elif a.command == "publish":
            to = publish(a.run, a.to)
            print(f"published {a.run} into {to}; then: python -m harness.docs write (README's numbers)")
        else:
            timing(a.file, a.start, a.fields, a.processes)
    except (JobError, OSError, config.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
