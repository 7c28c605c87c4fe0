"""The one process-tree stopper: a process and every process below it get a signal, and whatever
still runs after a grace period is killed.

Used by the studies' runner (harness/bench/runs.py, on SIGTERM/SIGINT to a study) and by the shell
drivers: ``python3 -m harness.proc supervise -- bash SCRIPT ARGS`` (scripts/lib.sh's supervise, which
execs it in the script's own process) runs the script's work as its child and stops that child's
whole tree on SIGTERM/SIGINT, so that stopping a script stops its fairseq-train, fairseq-generate and
tokenizer processes too; a guard kills the tree when the supervisor itself is killed outright.
``python3 -m harness.proc stop PID...`` stops those PIDs' trees the same way (train.sh's ranks on exit).
"""

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List

GRACE_S = float(os.environ.get("TFIXUP_STOP_SECONDS", "10"))


def _parents() -> Dict[int, int]:
    """pid -> parent pid of every live (not zombie) process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]  # after the name in (...), which may hold spaces
        if state != "Z":
            out[int(entry)] = int(ppid)
    return out


def tree_pids(root: int) -> List[int]:
    """ROOT and all its live descendants, parents first."""
    parents = _parents()
    tree, i = ([root] if root in parents else []), 0
    while i < len(tree):
        tree += [p for p, pp in parents.items() if pp == tree[i]]
        i += 1
    return tree


def stop_tree(root, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> None:
    """Send SIG to ROOT's tree (ROOT: a PID, or a list of them: their trees at once); SIGKILL what is
    left of it after GRACE_S seconds."""
    pids = [pid for r in ([root] if isinstance(root, int) else root) for pid in tree_pids(r)]
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


def _guard(worker: int) -> int:
    """Fork a guard of WORKER's tree; return the write end of its pipe. Closing it with a byte
    written says the worker has ended; closed without one (this process died, even by SIGKILL,
    which no handler sees: the kernel closes the pipe), the guard kills the worker's whole tree.
    Nothing polls: the guard sleeps in read() until then."""
    r, w = os.pipe()
    if os.fork():
        os.close(r)
        return w
    os.close(w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the supervisor stops the tree on these, not the guard
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # a caller reading the script's output must not wait for the guard
        os.dup2(null, fd)
    if not os.read(r, 1):  # EOF: the supervisor is gone and the worker may run on
        for pid in tree_pids(worker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os._exit(0)


def supervise(argv) -> int:
    """Run ARGV (a script's worker) as this process's child, with TFIXUP_SUPERVISOR=this PID, and
    return its exit status. SIGTERM, SIGINT or SIGHUP here: the worker's whole tree gets SIGTERM at
    once (a shell's background children ignore SIGINT, so SIGINT alone would not stop them), and
    this process exits 128 + the signal once the tree has ended (TFIXUP_STOP_SECONDS, then killed)."""
    stopping, child = [], []

    def stop(signum, _frame):
        if not stopping:
            stopping.append(signum)
            if child:
                stop_tree(child[0].pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    child.append(subprocess.Popen(argv, env={**os.environ, "TFIXUP_SUPERVISOR": str(os.getpid())}))
    guard = _guard(child[0].pid)
    if stopping:  # a signal came while the worker was being started
        stop_tree(child[0].pid, signal.SIGTERM)
    rc = child[0].wait()
    os.write(guard, b"x")
    os.close(guard)
    if stopping:
        return 128 + stopping[0]
    return rc if rc >= 0 else 128 - rc


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["supervise", "--"] and len(argv) > 2:
        return supervise(argv[2:])
    if argv[:1] != ["stop"] or not all(pid.isdigit() for pid in argv[1:]):
        print("usage: python3 -m harness.proc stop PID... | supervise -- CMD...", file=sys.stderr)
        return 2
    stop_tree([int(pid) for pid in argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
