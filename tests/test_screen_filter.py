"""What the scripts show of a live training (scripts/pipeline-lib.sh's ``quiet``, which runs
harness/fairseq_log.py's): each line as it comes, not in blocks at the end (a reader of a pipe that
buffers shows progress minutes late), progress as short readable lines (not fairseq's JSON) with an
ETA from MAX_UPDATE or, for epoch-bounded runs, from MAX_EPOCH; the model's structure and fairseq's
data-loader notes only in the log."""

import os
import pathlib
import select
import subprocess

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
        # the input stays open: a filter that buffers shows nothing until it ends (a generous wait for a
        # loaded machine; a buffering filter fails it however long it is)
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no line 120 s after it was written, the input still open: the filter buffers its input"
        shown = proc.stdout.readline()
        assert shown.startswith("2026-11-22 12:10:32 | epoch 6 | update 710")
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)


def test_eta_from_max_epoch_and_from_max_update():
    run = lambda *a: subprocess.run(quiet(*a), cwd=REPO, input=LINE + "\n", capture_output=True, text=True).stdout
    # 710 updates are 5.726 epochs: 8 epochs are ~992 updates, 282 left at 0.88/s
    shown = "2026-11-22 12:10:32 | epoch 6 | update 710{} | loss 5.251 | 0.88 updates/s{}\n"
    assert run("0", "8") == shown.format(" of ~992", " | ETA 5 min")
    assert run("1000", "0") == shown.format(" of 1000", " | ETA 5 min")
    assert run("0", "0") == shown.format("", "")



def test_eta_is_at_the_mean_rate_since_the_runs_start_not_the_last_intervals():
    """Beside other jobs one interval's rate swings many-fold; the ETA follows the run's mean rate."""
    lines = [f'2026-11-22 12:{m:02d}:00 | INFO | train_inner | {{"epoch": 1, "ups": "{ups}", "num_updates": "{n}"}}'
             for m, (n, ups) in enumerate([(100, "1.0"), (200, "1.0"), (300, "0.1"), (400, "10.0")])]
    shown = subprocess.run(quiet("1300", "0"), cwd=REPO, input="\n".join(lines) + "\n", capture_output=True,
                           text=True).stdout.splitlines()
    # mean rates: 1, 1, 300 / 1200 s, 400 / 1210 s (the last interval's rates: 1, 1, 0.1, 10)
    etas = [int(line.rsplit("ETA ", 1)[1].split()[0]) for line in shown]
    assert etas == [round(1200 / 60), round(1100 / 60), round(1000 / (300 / 1200) / 60), round(900 / (400 / 1210) / 60)]


# what fairseq-train writes at its start and in an epoch (JSON log format; simple for one line)
TRAIN_LOG = """2026-11-24 04:32:47 | INFO | fairseq_cli.train | TFixupTransformerModel(
  (encoder): TFixupTransformerEncoder(
    (embed_tokens): Embedding(816, 32, padding_idx=1)
  )
)
2026-11-24 04:32:47 | INFO | fairseq_cli.train | model: TFixupTransformerModel
2026-11-24 04:32:48 | INFO | fairseq.tasks.fairseq_task | can_reuse_epoch_itr = True
2026-11-24 04:32:48 | INFO | fairseq.data.iterators | grouped total_num_itrs = 15
2026-11-24 04:32:49 | INFO | train_inner | {"epoch": 1, "update": 0.667, "loss": "9.741", "nll_loss": "9.733", \
"ppl": "851.18", "wps": "27939.8", "ups": "19.88", "wpb": "1393.2", "bsz": "72.8", "num_updates": "10", \
"lr": "0.000499376", "gnorm": "0.619", "train_wall": "1", "wall": "2"}
2026-11-24 04:32:49 | INFO | valid | {"epoch": 1, "valid_loss": "9.43", "valid_nll_loss": "9.399", "valid_bleu": "0.5", \
"valid_num_updates": "15", "valid_best_loss": "9.43"}
2026-11-24 04:32:49 | INFO | train | {"epoch": 1, "train_loss": "9.695", "train_ups": "15.85", "train_num_updates": "15", \
"train_lr": "0.000499065"}
2026-11-24 04:32:50 | INFO | train_inner | epoch 002:     5 / 15 loss=9.516, nll_loss=9.481, ups=14.28, num_updates=20, \
lr=0.000498755, gnorm=0.617
2026-11-24 04:32:50 | INFO | fairseq_cli.train | done training in 1.9 seconds
""".replace("\\\n", "")


def test_progress_lines_are_short_and_the_model_dump_stays_in_the_log():
    shown = subprocess.run(quiet("30", "0"), cwd=REPO, input=TRAIN_LOG, capture_output=True, text=True).stdout
    assert shown.splitlines() == [
        "2026-11-24 04:32:47 | INFO | fairseq_cli.train | model: TFixupTransformerModel",
        "2026-11-24 04:32:49 | epoch 1 | update 10 of 30 | loss 9.741 | lr 0.000499376 | 19.88 updates/s | ETA 0 min",
        "2026-11-24 04:32:49 | epoch 1 valid: loss 9.43, BLEU 0.5 (best loss 9.43)",
        "2026-11-24 04:32:49 | epoch 1 done: train loss 9.695, 15 updates, 15.85 updates/s",
        "2026-11-24 04:32:50 | epoch 2 | update 20 of 30 | loss 9.516 | lr 0.000498755 | 14.28 updates/s | ETA 0 min",
        "2026-11-24 04:32:50 | INFO | fairseq_cli.train | done training in 1.9 seconds"]
    everything = subprocess.run(quiet("30", "0"), cwd=REPO, input=TRAIN_LOG, capture_output=True, text=True,
                                env={**os.environ, "QUIET": "0"}).stdout
    assert everything == TRAIN_LOG
