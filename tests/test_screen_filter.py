"""What the scripts show of a live training (scripts/pipeline-lib.sh's ``quiet``): each line as
it comes, not in blocks at the end (mawk, Debian's awk, reads pipes in blocks unless told not
to), with an ETA from MAX_UPDATE or, for epoch-bounded runs, from MAX_EPOCH."""

import pathlib
import select
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
LINE = ('2026-11-22 12:10:32 | INFO | train_inner | {"epoch": 6, "update": 5.726, "loss": "5.251", '
        '"ups": "0.88", "num_updates": "710"}')


def quiet(*args):
    return ["bash", "-c", f'. scripts/lib.sh; . scripts/pipeline-lib.sh; quiet {" ".join(args)}']


def test_a_line_is_shown_before_the_stream_ends():
    proc = subprocess.Popen(quiet("0", "8"), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(LINE + "\n")
        proc.stdin.flush()
        t0 = time.time()
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "no line 10 s after it was written: the filter buffers its input"
        shown = proc.stdout.readline()
        assert time.time() - t0 < 10 and shown.startswith(LINE)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_eta_from_max_epoch_and_from_max_update():
    run = lambda *a: subprocess.run(quiet(*a), cwd=REPO, input=LINE + "\n", capture_output=True, text=True).stdout
    # 710 updates are 5.726 epochs: 8 epochs are ~992 updates, 282 left at 0.88/s
    assert run("0", "8").rstrip().endswith("| update 710 of ~992, ETA 5 min")
    assert run("1000", "0").rstrip().endswith("| update 710 of 1000, ETA 5 min")
    assert run("0", "0").rstrip() == LINE
