"""train.sh's run ledger, OUT/train_runs.tsv: one line per train.sh call, START END WORLD DEVICE OUTCOME (tab-separated;
epoch seconds, processes, device name, and 0, the exit code of a failed run, "interrupted" for SIGTERM/SIGINT or
"killed"), read for the report's device-hours.

    python3 -m harness.run_ledger open OUT WORLD DEVICE   # a run starts: OUT/train_run.open
    python3 -m harness.run_ledger close OUT OUTCOME       # it ended: its line, and the open record goes
    python3 -m harness.run_ledger book-killed OUT         # (next run) book what earlier runs could not
    python3 -m harness.run_ledger saved OUT               # what the run kept, for train.sh's messages

A run killed outright (SIGKILL, the OOM killer, a power cut) cannot book itself: its start stays in train_run.open,
and the next run books it as "killed", ending at train.log's last write. A run that could not append its line (a full
disk) renames train_run.open to train_run.open.END.OUTCOME instead (a rename needs no free space): the next run books
it as it ended.
"""

import argparse
import glob
import os
import sys
import time

from harness import fairseq_log
from tfixup import atomic

OPEN = "train_run.open"
LEDGER = "train_runs.tsv"


def rows(out) -> list:
    """The ledger's rows, one per train.sh call: [START, END, WORLD, DEVICE, OUTCOME]; none without the file."""
    path = os.path.join(out, LEDGER)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip() and line[0].isdigit()]


def _opened(path: str) -> list:
    """START WORLD DEVICE of an open record (the device is the rest of the line)."""
    with open(path, encoding="utf-8") as f:
        fields = f.readline().split(None, 2)
    return [field.strip() for field in fields] + [""] * (3 - len(fields))


def _append(out: str, row: list) -> None:
    with open(os.path.join(out, LEDGER), "a", encoding="utf-8") as f:
        f.write("\t".join(str(x) for x in row) + "\n")


def _when(seconds: str) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(seconds))) if seconds.isdigit() else seconds


def open_run(out: str, world: str, device: str) -> None:
    atomic.write_text(os.path.join(out, OPEN), f"{int(time.time())} {world} {device}\n")


def close_run(out: str, outcome: str) -> None:
    """Book the open run with OUTCOME; on a failed append (a full disk) keep it in the open record's name instead."""
    opened = os.path.join(out, OPEN)
    end = int(time.time())
    if not os.path.isfile(opened):
        print(f"warning: {opened} is gone (removed while the run trained): this run ({outcome}) is not booked "
              f"in {out}/{LEDGER}", file=sys.stderr)
        return
    start, world, device = _opened(opened)
    try:
        _append(out, [start, end, world, device, outcome])
    except OSError:
        try:
            os.replace(opened, f"{opened}.{end}.{outcome}")
        except OSError:
            pass
        return
    os.remove(opened)


def saved(out: str) -> str:
    """What the run has kept: checkpoint_last.pt and its update (train.log's last save line)."""
    last = f"{out}/checkpoints/checkpoint_last.pt"
    if not os.path.isfile(last):
        return "no checkpoint saved yet"
    try:
        with open(os.path.join(out, "train.log"), encoding="utf-8", errors="replace") as f:
            update = fairseq_log.last_saved_update(f.read())
    except OSError:
        update = ""
    return f"kept {last}" + (f" (update {update})" if update else "")


def book_killed(out: str) -> str:
    """Book the runs earlier calls could not (renamed records as they ended, an open one as killed); the line that
    says so for a killed run, else ""."""
    prefix = os.path.join(out, OPEN) + "."
    for path in filter(os.path.isfile, sorted(glob.glob(glob.escape(prefix) + "*.*"))):
        start, world, device = _opened(path)
        end, _, outcome = path[len(prefix):].partition(".")
        _append(out, [start, end, world, device, outcome])
        os.remove(path)
    opened = os.path.join(out, OPEN)
    if not os.path.isfile(opened):
        return ""
    start, world, device = _opened(opened)
    try:
        end = str(int(os.stat(os.path.join(out, "train.log")).st_mtime))
    except OSError:
        end = start
    _append(out, [start, end, world, device, "killed"])
    os.remove(opened)
    return (f"the run started {_when(start)} was killed outright (kill -9, out of memory, power cut) at its last "
            f"log line, {_when(end)}: booked as killed in {out}/{LEDGER}; {saved(out)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.run_ledger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("open", help="a run starts: OUT/train_run.open (now, WORLD, DEVICE)")
    p.add_argument("out"), p.add_argument("world"), p.add_argument("device")
    p = sub.add_parser("close", help="the open run ended with OUTCOME: its line in OUT/train_runs.tsv")
    p.add_argument("out"), p.add_argument("outcome")
    p = sub.add_parser("book-killed", help="book what earlier runs on OUT could not; print the line for a killed one")
    p.add_argument("out")
    p = sub.add_parser("saved", help="print what the run on OUT has kept (checkpoint_last.pt and its update)")
    p.add_argument("out")
    args = parser.parse_args(argv)
    try:
        if args.command == "open":
            open_run(args.out, args.world, args.device)
        elif args.command == "close":
            close_run(args.out, args.outcome)
        elif args.command == "book-killed":
            line = book_killed(args.out)
            if line:
                print(line)
        else:
            print(saved(args.out))
    except OSError as e:
        print(f"error: run ledger of {args.out}: {e.strerror or e} ({e.filename or args.out}): free space or fix "
              f"the permissions there, then rerun the same command", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
