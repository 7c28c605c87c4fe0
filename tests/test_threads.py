"""The thread count of a training (scripts/lib.sh set_threads, called by quickstart.sh and train.sh):
one per core, shared with the fairseq-train processes already running, at least 1; OMP_NUM_THREADS as
the user set it wins; one line says the choice."""

import os
import stat
import subprocess

import pytest

from conftest import REPO

# `ps -e -o stat=,args=` of a busy machine: two trainings (a console script, and python -m), a torchrun
# parent (its workers are the trainings), an editor on a file named fairseq-train.log, a stopped training
OTHERS = ["Rl /venv/bin/python3 /venv/bin/fairseq-train data-bin/x --arch transformer",
          "Sl python -m fairseq_cli.train data-bin/y", "S python /venv/bin/torchrun --nproc-per-node 2 /venv/bin/fairseq-train d",
          "S+ vim fairseq-train.log", "S bash scripts/train.sh --cpu exp data out",
          "Tl /venv/bin/python3 /venv/bin/fairseq-train data-bin/z"]


def set_threads(tmp_path, cores, running, procs="", omp=None):
    """set_threads with `nproc` and `ps` answering CORES and the processes RUNNING."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    lines = "".join(f"echo '{line}'\n" for line in running)
    for name, body in (("nproc", f"echo {cores}\n"), ("ps", lines)):
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TFIXUP_THREADS")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    proc = subprocess.run(["bash", "-c", f'. scripts/lib.sh; set_threads {procs}; echo "$OMP_NUM_THREADS"; '
                           f'set_threads {procs}'], cwd=REPO, env=env, capture_output=True, text=True)
    return proc


@pytest.mark.parametrize("cores, running, procs, want", [
    (4, [], "", 4),               # alone: every core
    (4, OTHERS[:1], "", 2),       # one other training: half each
    (12, OTHERS, "", 4),          # two trainings counted (a script named like it, an editor, torchrun's parent, a stopped one not)
    (12, OTHERS, "2", 3),         # this job's 2 processes share too
    (2, OTHERS, "", 1),           # more trainings than cores: at least 1
])
def test_one_thread_per_core_shared_with_running_trainings(tmp_path, cores, running, procs, want):
    proc = set_threads(tmp_path, cores, running, procs)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(want)
    # one line, and none from a second call (a script started by one that chose)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"torch threads: {want} per process" in lines[0], proc.stderr


def test_omp_num_threads_set_by_the_user_wins(tmp_path):
    proc = set_threads(tmp_path, 8, OTHERS, omp="3")
    assert proc.stdout.strip() == "3" and "torch threads: 3 per process (OMP_NUM_THREADS as set)" in proc.stderr
    proc = set_threads(tmp_path, 8, [], omp="many")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: OMP_NUM_THREADS must be a whole number of threads (1 or more), got 'many'"]


def test_the_main_job_says_its_thread_count(cpu_main_job):
    work, _, _ = cpu_main_job
    stderr = (work.parent / "stderr").read_text()
    # the fixture sets OMP_NUM_THREADS=1: said once, by quickstart.sh, not again by train.sh
    assert stderr.count("torch threads: ") == 1 and "torch threads: 1 per process (OMP_NUM_THREADS as set)" in stderr


# ---------------------------------------------------------------- the cores free now (harness/cpu_load.py)


def test_threads_not_more_than_the_cores_free_now():
    from harness import cpu_load

    assert cpu_load.threads(2, 0.1, 2) == (2, "")  # an idle machine: what set_threads chose
    assert cpu_load.threads(1, 0.3, 2) == (1, "")
    n, line = cpu_load.threads(2, 1.6, 2)  # other work takes one and a half cores: one thread, and a line
    assert n == 1 and line.startswith("the machine is oversubscribed: about 1.6 of its 2 cores are busy")
    n, line = cpu_load.threads(2, 1.8, 2, chosen_by_user=True)  # OMP_NUM_THREADS as set: kept, and said
    assert n == 2 and "takes 2 thread(s) (OMP_NUM_THREADS as set)" in line and "\n" not in line


def test_busy_cores_from_two_samples_of_proc_stat(monkeypatch):
    from harness import cpu_load

    samples = iter([[100, 0, 50, 800, 50, 0, 0, 0], [160, 0, 90, 900, 50, 0, 0, 0]])  # 100 busy of 200 ticks
    monkeypatch.setattr(cpu_load, "_times", lambda stat: next(samples))
    assert cpu_load.busy_cores(interval=0, cores=4) == 2.0


def test_a_training_says_once_when_the_machine_becomes_oversubscribed(monkeypatch):
    """The main job took 2 threads on an idle 2-core machine; other jobs started and it fell to 0.02 updates/s
    with nothing said (a rerun with 1 thread ran 5x faster). Its progress lines now say so, once."""
    from harness import cpu_load, fairseq_log

    assert cpu_load.busy_later(2.1, 2, 2) == ""  # this training alone
    assert cpu_load.busy_later(6.0, 2, 1) == ""  # 1 thread: fewer would not help
    assert cpu_load.busy_later(4.0, 2, 2).startswith("the machine is oversubscribed now: load 4.0 on 2 cores")
    loads = iter([1.9, 4.5, 5.0])
    monkeypatch.setattr(fairseq_log.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(fairseq_log.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    screen = fairseq_log.Screen(max_update=100)
    shown = [screen.show('2026-11-28 10:00:00 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "9", '
                         f'"num_updates": "{n}", "ups": "1.0"}}') for n in (10, 20, 30)]
    assert "\n" not in shown[0] and shown[1].count("\n") == 1 and "\n" not in shown[2]
    assert shown[1].split("\n")[1].startswith("the machine is oversubscribed now: load 4.5")
