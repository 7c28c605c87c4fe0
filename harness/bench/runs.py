"""Resumable benchmark runs, a few at a time.

A study is a list of ``Run`` specs; each finished run leaves one record, ``STORE/<run id>.json`` (committed under
results/), and a rerun runs only what no record of the same command covers. A run is one ``fairseq-train`` process
logging to ``WORK/<run id>/train.log``. Ctrl-C or SIGTERM stops every child process group and records none of the
interrupted runs. Several commands may share one study (e.g. ``--only`` lists on two cores): a run is claimed with a
lock (WORK/.locks/<run id>.lock), and the report is rewritten under one lock from every record on disk.
"""

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import pathlib
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

from harness.bench import common
from harness import fairseq_log
from harness.proc import stop_tree
from tfixup import atomic


@dataclasses.dataclass
class Run:
    id: str          # file-name-safe, unique within the study
    meta: dict       # what varies (method, lr, seed, depth, ...): copied into the record
    args: list       # fairseq-train arguments after the data dir (no --save-dir)
    data: str        # the data-bin

    def command(self, save_dir: pathlib.Path) -> list:
        return ["fairseq-train", self.data, "--save-dir", str(save_dir)] + [str(a) for a in self.args]

    def key(self, args: list = None) -> str:
        """What makes two runs the same: the command without its output folder or --user-dir, the data named by its
        folder (a record made from another checkout or with the data elsewhere still counts)."""
        args = [str(a) for a in (self.args if args is None else args)]
        if "--user-dir" in args:
            i = args.index("--user-dir")
            del args[i:i + 2]
        return hashlib.sha256(json.dumps([pathlib.Path(self.data).name] + args).encode()).hexdigest()[:16]

    def recorded_by(self, record: dict) -> bool:
        """RECORD is this run's, made on either device: the same command, or the same but for ``--cpu`` (a study
        resumed on a GPU keeps its CPU records, and the other way round; each record says its device)."""
        args = [str(a) for a in self.args]
        if "--cpu" in args:
            other = [a for a in args if a != "--cpu"]
        else:  # where tfixup/methods.py train_args puts it: just before --user-dir
            i = args.index("--user-dir") if "--user-dir" in args else len(args)
            other = args[:i] + ["--cpu"] + args[i:]
        return record.get("key") in (self.key(), self.key(other))


def work_dir(study: str) -> pathlib.Path:
    """Scratch space of a study's runs: $TFIXUP_BENCH_WORK/STUDY, by default <repo>/work/bench/STUDY (git-ignored)."""
    return pathlib.Path(os.environ.get("TFIXUP_BENCH_WORK", common.REPO / "work" / "bench")) / study


_live = set()            # Popen objects of running children
_live_lock = threading.Lock()
_stopping = threading.Event()


def _stop_children(*_):
    _stopping.set()
    with _live_lock:
        live = list(_live)
    for p in live:
        stop_tree(p.pid)


def run_logged(cmd: list, log: pathlib.Path, env: dict) -> int:
    """Run cmd with its output in log, in its own process group (stopped with the study); its exit code."""
    if _stopping.is_set():
        return -signal.SIGTERM  # the study is stopping: start nothing new
    with open(log, "w") as logf:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=logf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        with _live_lock:
            _live.add(proc)
        if _stopping.is_set():  # the study began to stop while this child was starting
            stop_tree(proc.pid)
        try:
            return proc.wait()
        finally:
            with _live_lock:
                _live.discard(proc)


def train(run: Run, work: pathlib.Path, threads: int = 1) -> dict:
    """One fairseq-train run; returns its record (curves, status, wall time, command)."""
    rundir = work / run.id
    if rundir.exists():
        shutil.rmtree(rundir)  # a half-done run from an interrupted start: begin again
    rundir.mkdir(parents=True)
    cmd = run.command(rundir / "checkpoints")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    t0 = time.time()
    rc = run_logged(cmd, rundir / "train.log", env)
    wall = time.time() - t0
    text = (rundir / "train.log").read_text(errors="replace")
    parsed = fairseq_log.parse_train_log(text)
    status = run_status(text, parsed, rc)
    # fairseq's own rate over each log interval (no start-up, no validation)
    spu = [1 / r["ups"] for r in parsed["train"] if isinstance(r.get("ups"), float) and r["ups"] > 0]
    record = {"id": run.id, **run.meta, "status": status, "returncode": rc, "wall_s": round(wall, 1),
              "key": run.key(), "command": " ".join(shlex.quote(c) for c in cmd),
              "valid_curve": [(int(r["valid_num_updates"]), r["valid_loss"]) for r in parsed["valid"]],
              "train_curve": [(int(r["num_updates"]), r["loss"]) for r in parsed["train"]],
              "s_per_update": round(statistics.median(spu), 3) if spu else None,
              # where it trained: fairseq's --cpu, else the first GPU (its name)
              "device": "cpu" if "--cpu" in cmd else (common.cuda_device() or "cuda")}
    if status != "ok":
        record["error_tail"] = text.strip().splitlines()[-5:]
    shutil.rmtree(rundir / "checkpoints", ignore_errors=True)
    return record


# statuses of a run that failed to run (the harness, a tool, the machine): no result to keep (a divergence, "nan", is)
FAILED = ("error", "eval-error")
_NAN = ("FloatingPointError", "gradients are Nan/Inf", "Minimum loss scale reached")


def run_status(text: str, parsed: dict, returncode: int) -> str:
    """"ok", "nan" (fairseq stopped on a non-finite loss/gradient, or logged one) or "error"."""
    losses = [r.get("loss") for r in parsed["train"]] + [r.get("valid_loss") for r in parsed["valid"]]
    if any(s in text for s in _NAN) or any(isinstance(v, float) and not math.isfinite(v) for v in losses):
        return "nan"
    return "ok" if returncode == 0 else "error"


def _progress(run_dir: pathlib.Path) -> str:
    """'update N' from the last fairseq log line of a running run (RUN_DIR/train.log)."""
    try:
        with open(run_dir / "train.log", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4000))
            tail = f.read().decode(errors="replace")
    except OSError:
        return "starting"
    updates = fairseq_log.last_value(tail, "num_updates", kinds=("train_inner",))
    return "starting" if updates == "?" else f"update {float(updates):.0f}"


def read_record(path: pathlib.Path):
    """The run record at PATH; None where there is none or it is unreadable (said in a line)."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        common.log(f"ignoring unreadable run record {path}: {e}")
        return None


def load_records(store: pathlib.Path) -> dict:
    """id -> record, for every record in the store."""
    recs = (read_record(f) for f in sorted(pathlib.Path(store).glob("*.json")))
    return {rec["id"]: rec for rec in recs if rec is not None}


def _terminate(signum, frame):
    _stop_children()
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def locked(path: pathlib.Path, wait: bool = True):
    """Hold an exclusive flock on PATH (released when the block ends or the process dies); yields False, without
    waiting, when ``wait`` is off and another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
        else:
            yield True  # closing the file releases the lock


def run_all(runs: list, store: pathlib.Path, execute, work: pathlib.Path, jobs: int = 2, on_record=None,
            heartbeat_s: float = 60.0, run_dir=None) -> dict:
    """Run what the store lacks with ``execute(run) -> record``, ``jobs`` at a time; write each record, then call
    ``on_record(records so far)``. Returns id -> record. ``run_dir(id)``: where progress lines read train.log."""
    run_dir = run_dir or (lambda rid: work / rid)
    store = pathlib.Path(store)
    records = {k: v for k, v in load_records(store).items() if k in {r.id for r in runs}}
    todo = [r for r in runs if r.id not in records or not r.recorded_by(records[r.id])]
    for r in (r for r in todo if r.id in records):
        common.log(f"{r.id}: recorded with another command; running it again")
        del records[r.id]
    common.log(f"{len(runs) - len(todo)} of {len(runs)} runs already recorded in {store}; "
               f"{len(todo)} to run, {jobs} at a time")
    if not todo:
        return records
    _stopping.clear()  # a stop of an earlier call in this process is not this one's
    old_term = signal.signal(signal.SIGTERM, _terminate)
    t0, done = time.time(), 0

    def claimed(r):
        """Run R unless another command holds it or recorded it meanwhile (None: left to that one)."""
        with locked(work / ".locks" / f"{r.id}.lock", wait=False) as mine:
            if not mine:
                common.log(f"{r.id}: running in another command; left to it")
                return None
            rec = read_record(store / f"{r.id}.json")  # this run's record only, not the whole store's
            if rec is not None and r.recorded_by(rec):
                common.log(f"{r.id}: recorded by another command meanwhile")
                return None
            return execute(r)

    pool = concurrent.futures.ThreadPoolExecutor(jobs)
    futures = {pool.submit(claimed, r): r for r in todo}
    pending = set(futures)
    try:
        while pending:
            finished, pending = concurrent.futures.wait(pending, timeout=heartbeat_s,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in finished:
                r = futures[fut]
                if _stopping.is_set():
                    continue
                try:
                    rec = fut.result()
                except Exception as e:  # a bug or a full disk in one run: say so, keep the others going
                    common.log(f"{r.id}: failed to run ({type(e).__name__}: {e}); not recorded")
                    continue
                if rec is None:
                    continue
                if rec.get("status") in FAILED:  # not a result: the next start tries it again
                    tail = " | ".join(rec.get("error_tail", [])[-2:])
                    common.log(f"{r.id}: {rec['status']} ({rec.get('stage', 'the run')}: {tail}); not recorded")
                    continue
                atomic.write_json(store / f"{r.id}.json", rec)
                records[r.id] = rec
                done += 1
                eta = (time.time() - t0) / done * (len(todo) - done)
                wall = rec.get("wall_s", rec.get("train_wall_s", 0))
                common.log(f"done {r.id}: {rec['status']}, {wall:.0f} s "
                           f"({done}/{len(todo)}; about {eta / 60:.0f} min left)")
                if on_record:
                    on_record(records)
            running = [futures[f].id for f in pending if f.running()]
            if running and not finished:  # a progress line when nothing else was said for a while
                common.log("running: " + ", ".join(f"{i} ({_progress(run_dir(i))})" for i in running))
    except KeyboardInterrupt:
        _stop_children()
        common.log("interrupted: finished runs are recorded; rerun the same command to do the rest")
        raise SystemExit(130)
    finally:
        # queued runs must not start (leaving a `with ThreadPoolExecutor` would run them all)
        pool.shutdown(wait=True, cancel_futures=True)
        signal.signal(signal.SIGTERM, old_term)
    return records


def report_head(title: str, res: dict, n_runs: int, setting: str) -> str:
    """A study report's header (command, machine, date, data), PARTIAL until every run is in, then SETTING."""
    text = common.header_md(title, res)
    if res["runs_recorded"] < n_runs:
        text += f"**PARTIAL: {res['runs_recorded']} of {n_runs} runs recorded so far.**\n\n"
    return text + setting


def add_training_options(p, jobs: int, overrides) -> None:
    """A training study's options: --jobs, --margin (stuck), --dropout, --decay-period, and OVERRIDES'."""
    p.add_argument("--jobs", type=int, default=jobs, help=f"runs at a time (default {jobs}, one thread each)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="bits below the unigram level a run must reach to count as not stuck (default 1)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--decay-period", type=int, default=4000, help="P of the no-warmup schedule (default 4000)")
    add_overrides(p, overrides)


def add_overrides(p, overrides) -> None:
    """An option per mode setting in OVERRIDES: a name (an int), or name -> type, or name -> [type] (a list)."""
    for k in overrides:
        kind = overrides[k] if isinstance(overrides, dict) else int
        many = isinstance(kind, list)
        p.add_argument("--" + k.replace("_", "-"), type=kind[0] if many else kind, nargs="+" if many else None,
                       help=f"override the mode's {k}")


def add_device_option(p) -> None:
    """--device: where the study's runs train (common.DEVICES)."""
    p.add_argument("--device", choices=common.DEVICES, default="cpu",
                   help="where the runs train: cpu (fairseq's --cpu, --threads each; default) or cuda (the first "
                        "GPU, --jobs runs sharing it); a run recorded on either device counts, its record says which")


def with_overrides(cfg: dict, args, keys) -> dict:
    """``cfg`` with the command line's value for each of ``keys`` that it gives (argparse dest names)."""
    return {**cfg, **{k: getattr(args, k) for k in keys if getattr(args, k) is not None}}


def iwslt_setup(study, argv):
    """(args, cfg, data, unigram level, every run) of an IWSLT'14 study's command line."""
    from harness.bench.unigram import unigram_level
    args = study.parser().parse_args(argv)
    cfg = study.make_config(args)
    data = common.prepare_data(cfg["valid_lines"], cfg["test_lines"], args.data, args.data_root)
    level = unigram_level(data, "de", "en")
    common.log(f"unigram level of valid: {level['train_fit']} bits (fit on train), {level['oracle']} (fit on valid)")
    runs = study.make_runs(cfg, data)
    cfg["n_runs"] = len(runs)
    return args, cfg, data, level, runs


def default_plan(study, data, mode: str = "default") -> list:
    """A study's runs with its command line's defaults (its module's ``parser``, ``make_config``, ``make_runs``)."""
    args = study.parser().parse_args(["--data", str(data), "--out", "-"] + (["--smoke"] if mode == "smoke" else []))
    return study.make_runs(study.make_config(args), pathlib.Path(data))


def study_parser(description: str, outputs: str, **data):
    """common.benchmark_parser (DATA: its data and data_root) plus the options of a study made of recorded runs."""
    p = common.benchmark_parser(description, outputs, **data)
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the report from the runs recorded so far and run nothing")
    p.add_argument("--only", nargs="+", metavar="RUN_ID",
                   help="run just these runs now (ids as in the report, e.g. main-tfixup-lr0.001-s1); the report "
                        "still covers every recorded run")
    return p


# a study rewrites its outputs after a recorded run at most this often (and at the end): runs of minutes update the
# report as they finish; quick ones (a smoke, a test) draw the figure once, not per run
REWRITE_EVERY_S = 60.0


def run_study(stem: str, out: pathlib.Path, runs: list, summarise, plot, report, caption: str, jobs: int,
              threads: int = 1, execute=None, todo: list = None, report_only: bool = False,
              only: list = None, run_dir=None, quiet: bool = False) -> dict:
    """A study: run what OUT/STEM/runs/ lacks (of ``todo``, default all; those in ``only``; none if ``report_only``)
    with ``execute(run, work)`` (default ``train``), rewriting OUT/STEM.{json,md,png} from ``summarise(records)``
    after a recorded run (every REWRITE_EVERY_S at most), at the end and when stopped; print the report, return it."""
    if only:
        unknown = sorted(set(only) - {r.id for r in runs})
        if unknown:
            sys.exit(f"error: --only: no run {', '.join(unknown)} in this study; its ids: "
                     f"{' '.join(r.id for r in runs[:6])}{' ...' if len(runs) > 6 else ''}")
        todo = [r for r in (todo if todo is not None else runs) if r.id in only]
    if report_only:
        todo = []
    out, work, ids = pathlib.Path(out), work_dir(stem), {r.id for r in runs}
    store = out / stem / "runs"
    added = []  # runs recorded by this command
    written = [time.monotonic()]  # when the outputs were last written

    def current():
        return summarise({k: v for k, v in load_records(store).items() if k in ids})

    def write():
        with locked(out / stem / ".report.lock"):  # every record on disk now, one writer at a time
            res = current()
            common.write_outputs(out, stem, res, plot, report(res), caption)
        written[0] = time.monotonic()
        return res

    def recorded(_):
        added.append(1)
        if time.monotonic() - written[0] >= REWRITE_EVERY_S:
            write()

    one = execute or (lambda r, w: train(r, w, threads))
    try:
        run_all(todo if todo is not None else runs, store, lambda r: one(r, work), work=work, jobs=jobs,
                on_record=recorded, run_dir=run_dir)
    except SystemExit:  # stopped: the outputs show every run recorded before it
        if added:
            write()
        raise
    # the report changes only with its runs: a command that recorded nothing leaves the committed report
    # (its date, machine and command) as it is, unless asked to rewrite it or it is not there yet
    if added or report_only or not (out / f"{stem}.md").exists():
        res = write()
    else:
        res = current()
        common.log(f"no new runs: {out / stem}.{{json,md,png}} left as they are (--report-only rewrites them)")
    if not quiet:
        print(report(res))
    return res
