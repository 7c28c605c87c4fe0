"""harness.proc, the one process-tree stopper: the whole tree gets the signal, and what ignores it is
killed after the grace period."""

import signal
import subprocess
import time

from harness import proc


def test_stop_tree_signals_every_descendant_and_kills_what_ignores_it():
    # a shell with two children: one ends on TERM, one ignores it
    top = subprocess.Popen(["bash", "-c", "sleep 60 & bash -c 'trap \"\" TERM; sleep 60' & wait"])
    deadline = time.monotonic() + 10
    while len(proc.tree_pids(top.pid)) < 3 and time.monotonic() < deadline:  # bash, sleep, the sleep that ignores TERM
        time.sleep(0.05)
    tree = proc.tree_pids(top.pid)
    assert len(tree) >= 3 and tree[0] == top.pid
    t0 = time.monotonic()
    proc.stop_tree(top.pid, signal.SIGTERM, grace_s=1.0)
    assert time.monotonic() - t0 < 5
    top.wait(timeout=5)
    assert not [p for p in tree if p in proc._parents()]
