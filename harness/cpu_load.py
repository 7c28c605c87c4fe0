"""How busy the machine is now, for the main job's thread count (scripts/quickstart.sh).

    python3 -m harness.cpu_load threads N [--chosen-by-user]

prints the threads a training should take (N, or fewer when fewer cores are free now) and the cores busy now (for
the main job's record; none without /proc/stat), and on a second line what to tell the user when the machine is
oversubscribed: set_threads (scripts/lib.sh) counts the trainings running, but other work takes cores too, and a
training whose threads outnumber the free cores runs many times slower. The work is the cores' worth of CPU time
spent neither idle nor waiting on I/O over half a second (/proc/stat)."""

import argparse
import os
import sys
import time


def _times(stat: str) -> list:
    with open(stat) as f:
        fields = f.readline().split()
    if fields[:1] != ["cpu"]:
        raise ValueError(f"{stat}: no 'cpu' line first")
    return [int(x) for x in fields[1:]]


def busy_cores(interval: float = 0.5, stat: str = "/proc/stat", cores: int = None) -> float:
    """Cores' worth of CPU time the machine spent working (not idle, not waiting on I/O) over INTERVAL s."""
    a = _times(stat)
    time.sleep(interval)
    b = _times(stat)
    total, idle = sum(b) - sum(a), sum(b[3:5]) - sum(a[3:5])  # idle, iowait
    return (cores or os.cpu_count() or 1) * (total - idle) / total if total > 0 else 0.0


def threads(wanted: int, busy: float, cores: int, chosen_by_user: bool = False) -> tuple:
    """(threads, a line or "") for a training that would take WANTED threads with BUSY of CORES in use."""
    n = wanted if chosen_by_user else min(wanted, max(1, int(cores - busy + 0.5)))
    if busy + n <= cores + 0.5:
        return n, ""
    what = "OMP_NUM_THREADS as set" if chosen_by_user else "the fewest"
    return n, (f"the machine is oversubscribed: about {busy:.1f} of its {cores} cores are busy with other work now, "
               f"and this training takes {n} thread(s) ({what}); it will run slower than on an idle machine "
               "(its ETA shows how much); stopping it keeps its checkpoint, and the same command resumes later")


def busy_later(load: float, cores: int, threads: int) -> str:
    """A line for a running training of THREADS threads when the machine's 1-minute load (its runnable threads,
    this training's included) outnumbers its cores by more than half a core, else "": fewer threads would run it
    faster, and the thread count is chosen when a training starts (harness/fairseq_log.py shows it once)."""
    if threads <= 1 or load <= cores + 0.5:
        return ""
    return (f"the machine is oversubscribed now: load {load:.1f} on {cores} cores, and this training takes {threads} "
            "threads, which slows it many-fold; stop it (Ctrl-C: its checkpoint is kept) and run the same command "
            "again: it resumes with the threads free then")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.cpu_load", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("threads", help="the threads to take now, and a second line when the machine is busy")
    t.add_argument("wanted", type=int)
    t.add_argument("--chosen-by-user", action="store_true", help="keep WANTED (OMP_NUM_THREADS as set); only say")
    a = p.parse_args(argv)
    cores = os.cpu_count() or 1
    try:
        busy = busy_cores(cores=cores)
    except (OSError, ValueError, IndexError):  # no /proc/stat (not Linux): keep the count, say nothing
        print(a.wanted)
        return 0
    n, line = threads(a.wanted, busy, cores, a.chosen_by_user)
    print(f"{n} {busy:.2f}" + (f"\n{line}" if line else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
