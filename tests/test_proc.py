"""harness.proc, the one process-tree stopper: the whole tree gets the signal, and what ignores it is
killed after the grace period."""

import os
import signal
import subprocess
import sys
import time

from conftest import group_left, kill_group
from harness import proc


def test_stop_tree_signals_every_descendant_and_kills_what_ignores_it():
    # a shell with two children: one ends on TERM, one ignores it
    top = subprocess.Popen(["bash", "-c", "sleep 60 & bash -c 'trap \"\" TERM; sleep 60' & wait"])
    # bash, sleep, the sleep that ignores TERM (a generous wait for a loaded machine)
    deadline = time.monotonic() + 120
    while len(proc.tree_pids(top.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = proc.tree_pids(top.pid)
    assert len(tree) >= 3 and tree[0] == top.pid
    proc.stop_tree(top.pid, signal.SIGTERM, grace_s=1.0)
    # stop_tree returns once the grace period is over and what was left is killed: the whole tree is
    # gone (a 60 s sleep would still run) once the kernel has reaped it
    top.wait(timeout=120)
    deadline = time.monotonic() + 120
    while [p for p in tree if p in proc._parents()] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in tree if p in proc._parents()]



def test_stop_command_stops_several_trees_at_once():
    """`python -m harness.proc stop PID...` (train.sh's ranks on exit): every tree gets SIGTERM and what
    ignores it is killed after TFIXUP_STOP_SECONDS."""
    # each: a shell and a sleep that ignores TERM
    tops = [subprocess.Popen(["bash", "-c", "bash -c 'trap \"\" TERM; sleep 600' & wait"]) for _ in range(2)]
    deadline = time.monotonic() + 120
    while any(len(proc.tree_pids(t.pid)) < 2 for t in tops) and time.monotonic() < deadline:
        time.sleep(0.05)
    trees = [p for t in tops for p in proc.tree_pids(t.pid)]
    assert len(trees) >= 4
    subprocess.run([sys.executable, "-m", "harness.proc", "stop", *(str(t.pid) for t in tops)], check=True,
                   env={**os.environ, "TFIXUP_STOP_SECONDS": "1"})
    for t in tops:
        t.wait(timeout=120)
    deadline = time.monotonic() + 120
    while [p for p in trees if p in proc._parents()] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in trees if p in proc._parents()]

def _supervised(tmp_path):
    """`python -m harness.proc supervise -- bash ...` (what scripts/lib.sh's supervise execs) over a
    shell with a background child and a foreground one that ignores SIGINT, in a group of its own,
    once both children run. Its grace period (300 s) is longer than the tests wait: they see the signal
    itself stop the tree, not the kill after the grace period."""
    import os
    import sys

    ready = tmp_path / "ready"
    script = f"sleep 300 & bash -c 'trap \"\" INT; touch {ready}; sleep 300'; wait"
    top = subprocess.Popen([sys.executable, "-m", "harness.proc", "supervise", "--", "bash", "-c", script],
                           start_new_session=True, env={**os.environ, "TFIXUP_STOP_SECONDS": "300"})
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists() and top.poll() is None
    return top


def test_supervisor_stops_the_whole_tree_on_sigterm_or_sigint(tmp_path):
    """A signal to the supervisor's PID reaches every process below it as SIGTERM (a background child
    of a shell ignores SIGINT), without waiting out the grace period; it exits 128 + the signal."""
    import os

    for sig in (signal.SIGTERM, signal.SIGINT):
        top = _supervised(tmp_path)
        try:
            os.kill(top.pid, sig)
            assert top.wait(timeout=60) == 128 + sig
            assert not group_left(top.pid)
        finally:
            kill_group(top.pid)
        (tmp_path / "ready").unlink()


def test_supervisor_killed_outright_takes_its_tree_down(tmp_path):
    """kill -9 of the supervisor: no handler runs, its guard sees the pipe close and kills the tree."""
    import os

    top = _supervised(tmp_path)
    try:
        os.kill(top.pid, signal.SIGKILL)
        top.wait()
        assert not group_left(top.pid)
    finally:
        kill_group(top.pid)


def test_supervisor_passes_its_workers_exit_status():
    import sys

    done = subprocess.run([sys.executable, "-m", "harness.proc", "supervise", "--", "bash", "-c",
                           'echo "$TFIXUP_SUPERVISOR $PPID"; exit 7'], capture_output=True, text=True)
    supervisor, parent = done.stdout.split()
    assert done.returncode == 7 and supervisor == parent
