"""The one process-tree stopper: a process and every process below it get a signal, and whatever
still runs after a grace period is killed.

Used by the studies' runner (harness/bench/runs.py, on SIGTERM/SIGINT to a study) and by the shell
drivers (scripts/lib.sh's supervise: ``python3 -m harness.proc PID TERM``), so that stopping a
study or a script stops its fairseq-train, fairseq-generate and tokenizer processes too.
"""

import os
import signal
import sys
import time
from typing import Dict, List, Tuple

GRACE_S = float(os.environ.get("TFIXUP_STOP_SECONDS", "10"))


def _live() -> Dict[int, Tuple[int, int, str]]:
    """pid -> (parent pid, process group, name) of every live (not zombie) process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)  # the name in (...) may hold spaces
        state, ppid, pgid = rest.split()[:3]
        if state != "Z":
            out[int(entry)] = (int(ppid), int(pgid), name)
    return out


def _parents() -> Dict[int, int]:
    """pid -> parent pid of every live process."""
    return {pid: ppid for pid, (ppid, _, _) in _live().items()}


def group_members(pgid: int) -> List[str]:
    """The live processes of process group PGID, as 'pid name'."""
    return [f"{pid} {name}" for pid, (_, group, name) in _live().items() if group == pgid]


def tree_pids(root: int) -> List[int]:
    """ROOT and all its live descendants, parents first."""
    parents = _parents()
    tree, i = ([root] if root in parents else []), 0
    while i < len(tree):
        tree += [p for p, pp in parents.items() if pp == tree[i]]
        i += 1
    return tree


def stop_tree(root: int, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> None:
    """Send SIG to ROOT's tree; SIGKILL what is left of it after GRACE_S seconds."""
    pids = tree_pids(root)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        live = _parents()
        pids = [p for p in pids if p in live]
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python3 -m harness.proc PID SIGNAL (e.g. TERM)", file=sys.stderr)
        return 2
    stop_tree(int(argv[0]), getattr(signal, "SIG" + argv[1].upper().removeprefix("SIG")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
