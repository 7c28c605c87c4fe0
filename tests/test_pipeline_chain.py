"""The IWSLT'14 De-En chain on the real shared sample, tiny config, CPU:
prepare -> train (killed mid-run, rerun resumes from checkpoint_last.pt) ->
average (K chosen on valid) -> generate on a slice of the real test set ->
score -> report row. Plus the 2-process training path."""

import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch

from conftest import REPO, TRAINED_ENV, TRAINED_EXPERIMENT, group_left, group_members, kill_group
from tfixup import checkpoints

SCRIPTS = REPO / "scripts"
EXPERIMENT = TRAINED_EXPERIMENT
TINY = TRAINED_ENV  # the trained run's settings (conftest)


def env(**extra):
    return {**os.environ, **TINY, **extra}


def run(*cmd, extra_env=None, check=True):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env(**(extra_env or {})))
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def data(iwslt_bin):
    """The shared prepare-iwslt14.sh data-bin (conftest.iwslt_bin: 200 valid, 60 test sentences)."""
    return iwslt_bin


@pytest.fixture(scope="module")
def trained(trained_run, tmp_path_factory):
    """The session's trained run (conftest.trained_run: train.sh killed with SIGKILL at its update-10
    checkpoint, the same command rerun to 30), copied: this module evaluates it in its folder."""
    out = tmp_path_factory.mktemp("chain") / "run"
    shutil.copytree(trained_run[0], out, symlinks=True)
    return (out, *trained_run[1:])


def test_rerun_resumes_from_checkpoint_last(trained_run):
    out, first_run, second_stdout, second_stderr = trained_run
    # the rerun loaded checkpoint_last.pt at update 10 or later and finished at the configured 30
    m = re.search(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", second_stdout)
    assert m, second_stdout[-3000:]
    assert int(m.group(1)) >= 10
    updates = [int(u) for u in re.findall(r"num_updates (\d+)", second_stdout)]
    assert updates and min(updates) > int(m.group(1)) and max(updates) == 30
    state = checkpoints.load(out / "checkpoints" / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 30
    # both runs are on the books (for device-hours): the killed one, booked by the rerun, then the rerun
    runs = [line.split("\t") for line in (out / "train_runs.tsv").read_text().splitlines()]
    assert [r[4] for r in runs] == ["killed", "0"]
    assert int(runs[0][0]) <= int(runs[0][1]) <= int(runs[1][0]) and not (out / "train_run.open").exists()
    assert json.loads((out / "config.resolved.json").read_text())["values"]["MAX_UPDATE"] == "30"
    # and the rerun says so (it was only in train_runs.tsv): the killed run, what it kept, where it resumes
    killed = re.search(r"was killed outright .*booked as killed in \S+train_runs.tsv; kept \S+checkpoint_last.pt "
                       r"\(update (\d+)\)", second_stderr)
    assert killed and f"resuming from {out}/checkpoints/checkpoint_last.pt (update {killed.group(1)})" in second_stderr, \
        second_stderr[-3000:]


def test_chain_average_generate_score_report(trained, data):
    out, _, _, _ = trained
    # output to files, not pipes, and its own process group, which must be empty when it ends (a
    # progress loop beside the translation once ran on, and kept callers' pipes open)
    with open(out.parent / "eval.out", "w") as stdout, open(out.parent / "eval.err", "w") as stderr:
        proc = subprocess.Popen(["bash", str(SCRIPTS / "evaluate.sh"), "--cpu", EXPERIMENT, str(data), str(out)],
                                stdout=stdout, stderr=stderr, env=env(PROGRESS_SECONDS="987"), start_new_session=True)
        proc.wait()
    assert proc.returncode == 0, (out.parent / "eval.err").read_text()[-3000:]
    left = group_left(proc.pid)
    assert not left, f"evaluate.sh left processes running: {left}"
    assert re.search(r"translated 60 / 60 sentences", (out.parent / "eval.err").read_text())  # the last count
    ev = out / "eval"
    for name in ("averaged.pt", "averaging.json", "generate-test.txt", "results.json"):
        assert (ev / name).is_file(), name
    assert not list(ev.glob("*.tmp")) and not list(ev.glob(".tmp*"))

    choice = json.loads((ev / "averaging.json").read_text())
    assert [t["k"] for t in choice["tried"]] == [1, 3]
    assert choice["chosen"]["valid_loss"] == min(t["valid_loss"] for t in choice["tried"])
    # the averaged weights are the mean of the chosen checkpoints
    chosen = [checkpoints.load(out / "checkpoints" / c)["model"]
              for c in choice["chosen"]["checkpoints"]]
    avg = checkpoints.load(ev / "averaged.pt")["model"]
    name = "encoder.layers.0.fc1.weight"
    torch.testing.assert_close(avg[name], sum(c[name] for c in chosen) / len(chosen))

    res = json.loads((ev / "results.json").read_text())
    assert res["sentences"] == 60 and res["num_updates"] == 30
    assert math.isfinite(res["bleu_tok"]) and math.isfinite(res["bleu_detok"]) and res["bleu_tok"] >= 0
    assert res["detok_reference"] == "raw test set text"
    assert res["sacrebleu_signature"].startswith("nrefs:1|case:lc|")
    assert res["bleu"] == res["bleu_tok"] and res["paper_bleu"] == 35.5
    # the result describes the run that happened: its resolved config and exact command
    assert res["config"]["MAX_UPDATE"] == "30" and res["config"]["EMBED_DIM"] == "64"
    assert res["train_commands"] == (out / "train_command.sh").read_text().splitlines()
    # and what it was evaluated on: this data-bin, its dictionaries those it trained on
    assert res["data"]["path"] == str(data.resolve()) and res["train_data"]["path"] == str(data.resolve())
    assert res["data"]["dictionaries"] == res["train_data"]["dictionaries"]
    assert sorted(res["data"]["dictionaries"]) == ["dict.de.txt", "dict.en.txt"]
    assert len(res["data"]["manifest_sha256"]) == 64
    assert f"evaluating on {data.resolve()} (the data-bin the run trained on)" in (out.parent / "eval.err").read_text()

    # report.sh reads RUNS/EXPERIMENT/eval/results.json: point a runs folder at our run
    runs = out.parent / "runs"
    runs.mkdir(exist_ok=True)
    if not (runs / EXPERIMENT).exists():
        (runs / EXPERIMENT).symlink_to(out)
    report = run("bash", SCRIPTS / "report.sh", "--runs", runs, "--out", runs / "report.md", EXPERIMENT)
    row = [line for line in report.stdout.splitlines() if line.startswith("| Table 1: IWSLT'14 De-En small")]
    assert len(row) == 1
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", row[0].strip("|"))]
    assert cells[1] == "35.5" and cells[2] == f"{res['bleu']:.2f}" and cells[5] == "30"
    assert res["sacrebleu_signature"].replace("|", "\\|") in row[0]  # escaped for Markdown tables
    assert (runs / "report.md").read_text() == report.stdout
    print(report.stdout)


def test_generate_failure_is_one_line_naming_its_log(trained, data):
    """fairseq-generate runs in the averaging's process (one fairseq import): its failure, here a
    subset the data-bin lacks, is still one line naming the log, and nothing half-made is left."""
    out, _, _, _ = trained
    ev = out / "eval"
    proc = run("bash", SCRIPTS / "evaluate.sh", "--cpu", "--subset", "nope", EXPERIMENT, data, out, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: fairseq-generate failed: ") and "nope" in last, proc.stderr[-3000:]
    assert last.endswith(f"see {ev}/generate-nope.log") and "Traceback" in (ev / "generate-nope.log").read_text()
    assert not (ev / "generate-nope.txt").exists() and not list(ev.glob("*.tmp"))


def _epoch_wpb(log_text):
    m = re.findall(r"\| train \| epoch \d+ \|.*?\| wpb ([0-9.]+)", log_text)
    assert m, log_text[-2000:]
    return float(m[-1])


def test_two_cpu_processes_both_train_and_double_the_batch(trained, data, tmp_path):
    """Two ranks against one process: the module's run (same config, data, seed and batch size) is
    the one-process reference."""
    small = {"MAX_UPDATE": "6", "SAVE_INTERVAL_UPDATES": "0", "LOG_INTERVAL": "1"}
    two = tmp_path / "two"
    port = str(29700 + os.getpid() % 200)
    run("bash", SCRIPTS / "train.sh", "--cpu", "--nproc", "2", "--per-process-batch", "--master-port", port,
        EXPERIMENT, data, two, "--", "--no-save", extra_env=small)
    # train.sh waits for every rank and fails if one does; fairseq logs only on rank 0,
    # so rank 1 shows its start and the others show its work
    rank0, rank1 = (two / "train.log").read_text(), (two / "train.rank1.log").read_text()
    single = (trained[0] / "train.log").read_text()
    assert "distributed init (rank 1)" in rank1 and "initialized host" in rank1
    assert "done training" in rank0 and "num_updates 6" in rank0
    # each rank reads half of the batches of an epoch ...
    per_epoch = lambda text: int(re.search(r"epoch 001: +\d+ / (\d+)", text).group(1))
    assert abs(2 * per_epoch(rank0) - per_epoch(single)) <= 2
    # ... and an update sums both ranks' batches: the words per batch double
    ratio = _epoch_wpb(rank0) / _epoch_wpb(single)
    assert 1.7 < ratio < 2.3, ratio


@pytest.mark.parametrize("phase", ["averaging", "translating"])
def test_kill_9_of_evaluate_leaves_nothing_running(phase, trained, data, tmp_path):
    """kill -9 of evaluate.sh left its progress loop, reparented to PID 1, logging "translated 0 / 50
    sentences" every 30 s forever (while averaging: polling every 0.5 s forever). Now every process of
    its group ends with it, in either phase."""
    import shutil

    import threading

    out = tmp_path / "run"
    shutil.copytree(trained[0] / "checkpoints", out / "checkpoints")
    for name in ("config.resolved.json", "train_command.sh"):
        shutil.copy(trained[0] / name, out / name)
    # translating: the translations' temp file is a FIFO, so the generate step blocks on opening it until this
    # test opens the other end: the job is held inside that step, whatever the machine's speed
    fifo = out / "eval" / "generate-test.txt.tmp"
    if phase == "translating":
        fifo.parent.mkdir()
        os.mkfifo(fifo)
    err = open(tmp_path / "stderr", "w")
    job = subprocess.Popen(["bash", str(SCRIPTS / "evaluate.sh"), "--cpu", EXPERIMENT, str(data), str(out)],
                           stdout=subprocess.DEVNULL, stderr=err, env=env(PROGRESS_SECONDS="1"), start_new_session=True)
    def averaging():  # the average step's process runs (its arguments: --ckpt-dir), for the seconds it averages
        for member in group_members(job.pid):
            try:
                if b"--ckpt-dir" in pathlib.Path(f"/proc/{member.split()[0]}/cmdline").read_bytes():
                    return True
            except OSError:
                pass
        return False

    opened = threading.Event()
    if phase == "translating":
        reader = []
        threading.Thread(target=lambda: (reader.append(os.open(fifo, os.O_RDONLY)), opened.set()), daemon=True).start()
    started = {"averaging": averaging, "translating": opened.is_set}[phase]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None and not started():
            time.sleep(0.05)
        assert job.poll() is None and started(), (tmp_path / "stderr").read_text()[-3000:]
        os.kill(job.pid, signal.SIGKILL)  # the script's own PID, outright
        job.wait()
        assert not group_left(job.pid)
    finally:
        kill_group(job.pid)
        if phase == "translating":
            if not opened.is_set():  # the job never opened it: open the writing end, which lets the reader go
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                opened.wait()
            os.close(reader[0])
