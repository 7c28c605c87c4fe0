"""Shared fixtures: where the real data is, and small fairseq models built through fairseq's own parser."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
USER_DIR = REPO / "fairseq_tfixup"

# Every Python process of the suite (this one, pytest-xdist's workers and each script's subprocesses, which inherit
# PYTHONPATH) skips the two fairseq modules that import scikit-learn and scipy: tests/lean_fairseq/sitecustomize.py
LEAN_FAIRSEQ = pathlib.Path(__file__).resolve().parent / "lean_fairseq"
if str(LEAN_FAIRSEQ) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LEAN_FAIRSEQ), os.environ.get("PYTHONPATH")]))
if "lean_fairseq" not in sys.modules:
    import importlib.util

    _spec = importlib.util.spec_from_file_location("lean_fairseq", LEAN_FAIRSEQ / "sitecustomize.py")
    sys.modules["lean_fairseq"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["lean_fairseq"])


# A tiny model and run for the shell scripts' tests (scripts/train.sh reads these as --set values);
# everything else is the experiment's config.
TINY_RUN = {
    "MAX_EPOCH": "0", "MAX_UPDATE": "10", "SAVE_INTERVAL_UPDATES": "5", "MAX_TOKENS": "1000",
    "EMBED_DIM": "32", "FFN_DIM": "64", "HEADS": "2", "ENCODER_LAYERS": "1", "DECODER_LAYERS": "1",
    "DROPOUT": "0.1", "LR": "2e-3", "LOG_INTERVAL": "1", "AVG_CANDIDATES": "1", "OMP_NUM_THREADS": "1",
    # an untrained model's hypotheses run to evaluate.sh's length cap: 20 tokens keep generation to seconds
    "MAX_LEN_A": "0", "MAX_LEN_B": "20",
}


def run_script(*cmd, env=None, config=None, **kw):
    """A command with TINY_RUN (or CONFIG) and ENV over the environment; its CompletedProcess."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          env={**os.environ, **(TINY_RUN if config is None else config), **(env or {})}, **kw)


def fairseq_command(tool: str, *args) -> str:
    """``fairseq-TOOL ARGS`` (train, generate, preprocess, eval_lm) run by its own entry point
    (fairseq_cli.TOOL.cli_main, what the console script calls) in this process, where fairseq is imported
    already (a process per command paid fairseq's import again: ~4 s of CPU); its log and output. What it
    raises propagates: a refusal is the plugin's ``Refused``, which the console prints as one line
    (tfixup/errors.py; tests/test_one_line_refusals.py runs the console script itself)."""
    import importlib
    import sys
    from unittest import mock

    from harness import fairseq_log

    main = importlib.import_module(f"fairseq_cli.{tool}").cli_main
    argv = [f"fairseq-{tool.replace('_', '-')}", *(str(a) for a in args)]
    with fairseq_log.captured() as log_text, mock.patch.object(sys, "argv", argv):
        main()
    return log_text.getvalue()


@pytest.fixture
def fairseq_train_here(monkeypatch):
    """A study's fairseq-train runs (harness.bench.runs.run_logged) made in this process by fairseq-train's
    own entry point (fairseq_command), their log written where the study reads it: a study's smoke without a
    fairseq import per run. One run at a time (--jobs 1). A run's own process is tested by
    tests/test_bench_studies.py (a study stopped with its run, the plateau smoke through train.sh)."""
    import traceback

    from harness.bench import runs as runlib

    def run_logged(cmd, log, env):
        assert str(cmd[0]) == "fairseq-train", cmd
        try:
            text, rc = fairseq_command("train", *cmd[1:]), 0
        except (Exception, SystemExit):  # as the console script would end: its traceback, a failed exit
            text, rc = traceback.format_exc(), 1
        pathlib.Path(log).write_text(text)
        return rc

    monkeypatch.setattr(runlib, "run_logged", run_logged)


def last_error(proc, *words):
    """The run failed and its last stderr line is one error naming WORDS."""
    assert proc.returncode != 0, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), proc.stderr[-3000:]
    return last


# ---------------------------------------------------------------- the order files are handed to workers

# scripts/test.sh hands whole files to its workers in collection order (--dist loadfile --no-loadscope-reorder),
# each to the first free worker: the longest first keeps both busy to the end. A file's cost is the sum of its
# tests' seconds (setup, call and teardown) in the last run that ran each, kept in pytest's cache (TEST_SECONDS;
# a test not timed yet counts as its file's median). Files none of whose tests were timed (all of them, in a clean
# clone) come after, ranked by the made-once fixtures they use (made_once below: a data-bin, the main job, the
# trained run), which are the long builds: such files first, each next one starting a build that no earlier
# file starts, so that the workers make them side by side rather than one waiting on the other's lock; then
# the rest by their number of tests.
TEST_SECONDS = "tfixup/test-seconds"
MADE_ONCE = set()


def made_once(fn):
    """A session fixture whose folder is made once per test run (shared_across_workers): the ordering
    above knows it by name."""
    MADE_ONCE.add(fn.__name__)
    return pytest.fixture(scope="session")(fn)


def file_order(files: dict, seconds: dict) -> list:
    """FILES (name -> (its test ids, the made-once fixtures they use)) in the order to hand them out, with
    SECONDS (test id -> seconds) as said above."""
    import statistics

    cost = {}
    for name, (tests, _) in files.items():
        known = [seconds[t] for t in tests if t in seconds]
        if known:
            cost[name] = sum(seconds.get(t, statistics.median(known)) for t in tests)
    timed = sorted(cost, key=lambda f: -cost[f])
    rest = sorted((f for f in files if f not in cost), key=lambda f: (not files[f][1], -len(files[f][0]), f))
    started = set().union(*(files[f][1] for f in timed))
    while rest:  # the first file that starts a build not started yet, else the next in line
        f = next((f for f in rest if files[f][1] - started), rest[0])
        rest.remove(f)
        started |= files[f][1]
        timed.append(f)
    return timed


def _cached_seconds(config) -> dict:
    return config.cache.get(TEST_SECONDS, {}) if getattr(config, "cache", None) is not None else {}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent with -p no:xdist
def pytest_configure_node(node):
    """pytest-xdist, in the controller: every worker orders by the same record (one read of the cache), so
    that all collect the same order."""
    node.workerinput[TEST_SECONDS] = _cached_seconds(node.config)


def pytest_collection_modifyitems(config, items):
    files = {}
    for item in items:
        tests, fixtures = files.get(item.path.name, ([], frozenset()))
        files[item.path.name] = ([*tests, item.nodeid], fixtures | (MADE_ONCE & set(item.fixturenames)))
    worker = getattr(config, "workerinput", None)
    seconds = worker.get(TEST_SECONDS, {}) if worker is not None else _cached_seconds(config)
    rank = {name: i for i, name in enumerate(file_order(files, seconds))}
    items.sort(key=lambda item: rank[item.path.name])  # stable: files stay whole, in their own order


_took = {}


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown (under xdist: in the controller, from every worker's reports)."""
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    """The tests timed in this run into the cache, beside those it did not run."""
    config = session.config
    if getattr(config, "cache", None) is None or hasattr(config, "workerinput") or not _took:
        return
    config.cache.set(TEST_SECONDS, {**config.cache.get(TEST_SECONDS, {}),
                                    **{t: round(s, 2) for t, s in _took.items()}})


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """../shared/data (or $TFIXUP_SHARED_DATA). Skips when absent, except in CI, where it must be there."""
    path = pathlib.Path(os.environ.get("TFIXUP_SHARED_DATA", REPO.parent / "shared" / "data"))
    if not (path / "iwslt14-de-en").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"shared data not found at {path}")
        pytest.skip(f"shared data not found at {path} (set TFIXUP_SHARED_DATA)")
    return path


def shared_across_workers(tmp_path_factory, name: str, make) -> pathlib.Path:
    """A folder made once per test run by ``make(path)``, even with pytest-xdist's workers
    (scripts/test.sh runs the suite on every core): the first worker makes it under a lock
    in the run's common temp folder, the others wait for it and reuse it."""
    from filelock import FileLock  # a dependency of torch

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # every worker's basetemp is a child of the run's
    out = root / name
    with FileLock(str(out) + ".lock"):
        if not (out / ".made").exists():
            shutil.rmtree(out, ignore_errors=True)  # what a failed attempt left
            make(out)
            (out / ".made").touch()
    return out


@made_once
def iwslt_bin(shared_data, tmp_path_factory) -> pathlib.Path:
    """The real IWSLT'14 De-En sample binarised by scripts/prepare-iwslt14.sh (the first 6000 train pairs,
    200 valid, 60 test), made once per test run and shared by every test file that trains on real data.
    The whole 18.6k-pair sample takes longer to prepare, on the first worker's critical path, and the tests
    train for at most about one epoch of 6000."""
    import subprocess

    def make(root):
        subprocess.run(
            ["bash", str(REPO / "scripts" / "prepare-iwslt14.sh"), "--out", str(root / "bin"),
             "--shared", str(shared_data), "--train-lines", "6000", "--valid-lines", "200", "--test-lines", "60"],
            check=True, capture_output=True, text=True,
        )

    return shared_across_workers(tmp_path_factory, "iwslt", make) / "bin"


# The trained run: conftest's tiny run a little larger (checkpoints to average, BLEU above zero), the IWSLT
# config on the shared data-bin, 30 updates
TRAINED_EXPERIMENT = "iwslt14_de_en_tfixup"
TRAINED_ENV = {**TINY_RUN, "MAX_UPDATE": "30", "SAVE_INTERVAL_UPDATES": "10", "MAX_TOKENS": "1500", "EMBED_DIM": "64",
               "FFN_DIM": "128", "ENCODER_LAYERS": "2", "DECODER_LAYERS": "2", "LOG_INTERVAL": "10",
               "AVG_CANDIDATES": "1 3"}


@made_once
def trained_run(iwslt_bin, tmp_path_factory):
    """`bash scripts/train.sh --cpu iwslt14_de_en_tfixup` on the shared data-bin (TRAINED_ENV), killed with
    SIGKILL once its update-10 checkpoint is saved, then the same command rerun, which resumes and ends at
    update 30: the session's one trained run, made once for every worker (tests/test_pipeline_chain.py checks the
    kill and the resume, and evaluates a copy; tests/test_cli.py reads its valid curve). Read only:
    a test that writes copies it first. (run folder, the killed run's log, the rerun's stdout, its stderr)."""
    def make(root):
        out = root / "run"
        cmd = ["bash", str(REPO / "scripts" / "train.sh"), "--cpu", TRAINED_EXPERIMENT, str(iwslt_bin), str(out)]
        # the killed run's budget is out of reach (MAX_UPDATE 100000), so that no machine finishes it between
        # two looks at its log
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **TRAINED_ENV, "MAX_UPDATE": "100000"})
        log = out / "train.log"
        deadline = time.monotonic() + 600  # generous, for a loaded machine: this waits, it times nothing
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                # "Saved checkpoint" is logged once checkpoint_1_10.pt and its copy checkpoint_last.pt are complete
                text = log.read_text() if log.exists() else ""
                if "checkpoint_1_10.pt" in text and "Saved checkpoint" in text:
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the crash
            proc.wait()
        (root / "first_run.log").write_text(log.read_text())
        second = run_script(*cmd, config=TRAINED_ENV)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        (root / "rerun.out").write_text(second.stdout)
        (root / "rerun.err").write_text(second.stderr)

    root = shared_across_workers(tmp_path_factory, "trained_run", make)
    return (root / "run", *((root / name).read_text() for name in ("first_run.log", "rerun.out", "rerun.err")))


# The CPU main job made tiny: its config with a 1+1-layer 32-dim model, 2 epochs of 1000 pairs (with 1000
# BPE merges: 8000 on 1000 pairs leave 3 % of the valid words <unk>, which prepare refuses)
TINY_MAIN_ENV = {"BPE_MERGES": "1000", "EMBED_DIM": "32", "FFN_DIM": "64", "HEADS": "2", "ENCODER_LAYERS": "1",
                 "DECODER_LAYERS": "1", "MAX_EPOCH": "2", "MAX_TOKENS": "2048", "AVG_CANDIDATES": "1 2",
                 "LOG_INTERVAL": "10", "MAX_LEN_A": "0", "MAX_LEN_B": "20"}  # an untrained model's hypotheses run to the cap
TINY_MAIN_ARGS = ["--no-install", "--train-lines", "1000", "--valid-lines", "40", "--test-lines", "20"]


def group_members(pgid: int) -> list:
    """The live (not zombie) processes of process group PGID, as 'pid name' (from ps): what a test that
    stops a script waits to see end."""
    out = subprocess.run(["ps", "-e", "-o", "pgid=,pid=,stat=,comm="], capture_output=True, text=True,
                         check=True).stdout
    rows = (line.split(None, 3) for line in out.splitlines())
    return [f"{pid} {name}" for group, pid, stat, name in rows if int(group) == pgid and not stat.startswith("Z")]


def group_left(pgid: int, within_s: float = 60) -> list:
    """group_members(PGID) once none are left, or those left after WITHIN_S seconds (generous: a killed
    process may take a moment to end on a loaded machine; this never times anything)."""
    deadline = time.monotonic() + within_s
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_group(pgid: int) -> None:
    """SIGKILL to whatever is left of process group PGID (what a test that failed midway left running)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def untracked_and_ignored() -> set:
    """The repo's untracked and ignored files (what a run may have left in the checkout)."""
    import subprocess

    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {line[3:] for line in out if "__pycache__" not in line and not line.startswith(" M")}


@made_once
def cpu_main_job(shared_data, tmp_path_factory):
    """`bash scripts/quickstart.sh --cpu` to its end, made tiny (TINY_MAIN_ENV, TINY_MAIN_ARGS) with --work in a
    temp folder, once per test run: (work folder, its stdout, the checkout's untracked files before and after)."""
    import subprocess

    def make(root):
        before = untracked_and_ignored()
        env = {**os.environ, **TINY_MAIN_ENV, "TFIXUP_SHARED_DATA": str(shared_data), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(["bash", "scripts/quickstart.sh", "--cpu", "--work", str(root / "qs"), *TINY_MAIN_ARGS],
                              cwd=REPO, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        (root / "stdout").write_text(proc.stdout)
        (root / "stderr").write_text(proc.stderr)
        (root / "untracked").write_text("\n".join(sorted(before ^ untracked_and_ignored())))

    root = shared_across_workers(tmp_path_factory, "cpu_main_job", make)
    return root / "qs", (root / "stdout").read_text(), (root / "untracked").read_text().split()


@pytest.fixture(scope="session")
def main_job_bin(cpu_main_job) -> pathlib.Path:
    """The tiny main job's data-bin: real Multi30k De-En pairs (1000 to train) with 1000 BPE merges, a
    vocabulary of about 800 words, where a tiny model's update is a few times cheaper than on the IWSLT
    sample's 10k."""
    work, _, _ = cpu_main_job
    (data,) = (work / "data-bin").iterdir()
    return data


def write_dicts(path: pathlib.Path, size: int = 500, joined: bool = False) -> pathlib.Path:
    """fairseq dictionaries dict.de.txt/dict.en.txt of `size` made-up symbols (identical when joined)."""
    path.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        prefix = "w" if joined else lang
        (path / f"dict.{lang}.txt").write_text("".join(f"{prefix}{i} {size - i}\n" for i in range(size)))
    return path


def build_model(data_dir, arch, *flags, seed=1):
    """Build a translation model the way fairseq-train does (fairseq_tfixup.diagnostics.models)."""
    from fairseq_tfixup.diagnostics.models import build_from_flags

    args, task, model, _ = build_from_flags(data_dir, ["-s", "de", "-t", "en", "--arch", arch, *flags], seed=seed)
    return model, task, args


@pytest.fixture(scope="session")
def dict_dir(tmp_path_factory):
    return write_dicts(tmp_path_factory.mktemp("dicts"))


@pytest.fixture(scope="session")
def joined_dict_dir(tmp_path_factory):
    return write_dicts(tmp_path_factory.mktemp("joined_dicts"), joined=True)


# ---------------------------------------------------------------- configs and table scripts

TABLE_SCRIPTS = ["table1.sh", "table2.sh", "table3.sh", "fig4b.sh"]


def parse_train_command(argv):
    """fairseq's own parse of a ``fairseq-train ...`` command line (the plugin loaded by --user-dir)."""
    from fairseq import options

    assert argv[0] == "fairseq-train"
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv[1:])


def script_experiments(script):
    """The EXPERIMENTS a table script runs."""
    import re

    return re.search(r"EXPERIMENTS=\((.*?)\)", (REPO / "scripts" / script).read_text(), re.S).group(1).split()


def table_experiments():
    return [name for script in TABLE_SCRIPTS for name in script_experiments(script)]


def check_method_flags(args, values):
    """``args`` (fairseq-train's parsed namespace) trains the config's METHOD as its row in tfixup/methods.py
    says (arch, optimizer, Pre-LN flags, warmup or not), at the config's depth."""
    from tfixup import methods

    m = methods.method(values["METHOD"])
    scheduler = {"auto": "inverse_sqrt" if m.warmup else "inverse_sqrt_nowarmup", "warmup": "inverse_sqrt",
                 "nowarmup": "inverse_sqrt_nowarmup", "matched": "inverse_sqrt_matched"}[values["SCHEDULE"]]
    pre_ln = "--encoder-normalize-before" in m.flags
    assert (args.arch, args.optimizer, args.lr_scheduler) == (values["ARCH"] or m.arch, m.optimizer, scheduler), \
        values["METHOD"]
    assert args.encoder_normalize_before == args.decoder_normalize_before == pre_ln, values["METHOD"]
    assert (args.encoder_layers, args.decoder_layers) == (int(values["ENCODER_LAYERS"]), int(values["DECODER_LAYERS"]))
    if scheduler == "inverse_sqrt":
        assert args.warmup_updates == int(values["WARMUP_UPDATES"]) > 0
    else:
        assert args.warmup_updates == 0 and args.decay_period == int(values["DECAY_PERIOD"])

def save_tiny_checkpoint(path: pathlib.Path, data_dir, dims=(16, 32, 2, 1, 1), updates: int = 3) -> dict:
    """A real checkpoint as fairseq-train 0.12 saves one (cfg as plain containers holding the model's
    Namespace, model weights, optimizer history) of a tiny T-Fixup model on DATA_DIR's dictionaries,
    without training: the state is returned too."""
    import torch
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from fairseq_tfixup.diagnostics.models import build_from_flags
    from tfixup import methods

    args, _, model, _ = build_from_flags(data_dir, ["-s", "de", "-t", "en", *methods.model_flags("tfixup"),
                                                 *methods.dims_flags(*dims), "--optimizer", "adam", "--lr", "1e-3",
                                                 "--lr-scheduler", "inverse_sqrt_nowarmup"])
    state = {"args": None, "model": model.state_dict(), "extra_state": {}, "last_optimizer_state": None,
             "cfg": OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                    "lr_scheduler_state": {"best": None}, "num_updates": updates}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(path, data dir, state): save_tiny_checkpoint on 40-symbol made-up dictionaries."""
    root = tmp_path_factory.mktemp("tiny_checkpoint")
    data = write_dicts(root / "data", size=40)
    state = save_tiny_checkpoint(root / "real.pt", data)
    return root / "real.pt", data, state
