"""harness.proc, the one process-tree stopper: the whole tree gets the signal, and what ignores it is
killed after the grace period."""

import signal
import subprocess
import time

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
