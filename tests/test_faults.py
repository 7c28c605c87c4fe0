"""Fault injection on the real IWSLT'14 sample: corrupt inputs, a tool killed
mid-way, stale data, SIGTERM, a corrupt checkpoint_last.pt, a NaN run, a config outside
configs/. Each asserts the exit code, the one-line message (the last line on stderr), and
that nothing half-made is left on disk or reused. Inputs are corrupted in a temp copy of
the shared folder, never in ../shared."""

import json
import lzma
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import time

import pytest

from conftest import REPO, TINY_RUN as TINY, group_left, kill_group, last_error, run_script as run
from harness import recover

SCRIPTS = REPO / "scripts"
EXPERIMENT = "iwslt14_de_en_tfixup"
SMALL = ["--train-lines", "2000", "--valid-lines", "100", "--test-lines", "30"]


def leftovers(folder: pathlib.Path):
    return sorted(str(p) for p in folder.rglob("*") if ".tmp" in p.name or ".old." in p.name)


def prepare(shared, out, *extra, env=None):
    return run("bash", SCRIPTS / "prepare-iwslt14.sh", "--shared", shared, "--out", out, *SMALL, *extra, env=env)


@pytest.fixture
def shared_copy(shared_data, tmp_path):
    """A writable copy of the IWSLT'14 sample (3 MB) to corrupt."""
    copy = tmp_path / "shared"
    shutil.copytree(shared_data / "iwslt14-de-en", copy / "iwslt14-de-en")
    for p in copy.rglob("*"):
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return copy


def rewrite_xz(path: pathlib.Path, keep_lines: int):
    """A valid .xz holding only the first KEEP_LINES lines (a truncated file, cleanly compressed)."""
    lines = lzma.decompress(path.read_bytes()).decode("utf-8").splitlines(keepends=True)
    path.write_bytes(lzma.compress("".join(lines[:keep_lines]).encode("utf-8")))


def test_truncated_train_xz(shared_copy, tmp_path):
    """Case 1: a truncated train.de.xz made 5,194 German vs 18,611 English sentences, 'ready'."""
    f = shared_copy / "iwslt14-de-en/train-sample/train.de.xz"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    out = tmp_path / "data" / "bin"
    proc = prepare(shared_copy, out)
    last_error(proc, "train.de.xz", "nothing published")
    assert not out.exists() and leftovers(tmp_path / "data") == []


def test_truncated_bpe_code(shared_copy, tmp_path):
    """Case 1: a BPE code cut to 5,229 of 10,001 lines gave 9% <unk> on test, 'ready'."""
    rewrite_xz(shared_copy / "iwslt14-de-en/fairseq-prepared/code.xz", 5229)
    out = tmp_path / "data" / "bin"
    proc = prepare(shared_copy, out)
    last_error(proc, "BPE codes incomplete", "code.xz", "5228 merges, expected 10000")
    assert not out.exists() and leftovers(tmp_path / "data") == []


def test_corrupt_test_xml(shared_copy, tmp_path):
    """Case 1: a corrupt test XML gave 5,621 of 6,750 raw test lines, 'ready'."""
    rewrite_xz(shared_copy / "iwslt14-de-en/orig/IWSLT14.TED.tst2011.de-en.en.xml.xz", 400)
    out = tmp_path / "data" / "bin"
    proc = prepare(shared_copy, out)
    last_error(proc, "test.raw.en", "expected 6750")
    assert not out.exists() and leftovers(tmp_path / "data") == []


def test_subword_nmt_killed_then_rebuilt_and_stale_data_rebuilt(shared_data, tmp_path):
    """Case 1: subword-nmt killed mid-way (as by the OOM killer) gave 6,336 vs 18,611 sentences,
    'ready', and the rerun said 'exists, skipping'. Case 2: other --test-lines reused stale data."""
    real = shutil.which("subword-nmt")
    assert real
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "subword-nmt").write_text(f"#!/bin/sh\nhead -n 300 | {real} \"$@\"\nkill -KILL $$\n")
    (shim / "subword-nmt").chmod(0o755)
    out = tmp_path / "data" / "bin"
    killed = prepare(shared_data, out, env={"PATH": f"{shim}:{os.environ['PATH']}"})
    last_error(killed, "apply BPE", "train.de.xz", "exit 137")
    assert not out.exists() and leftovers(tmp_path / "data") == []

    ok = prepare(shared_data, out)  # the rerun builds everything, reusing nothing
    assert ok.returncode == 0, ok.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["sentences"] == {"train": 2000, "valid": 100, "test": 30}
    assert manifest["bpe_merges"] == 10000 and len(manifest["inputs"]) == 17
    assert all(len(i["sha256"]) == 64 for i in manifest["inputs"])
    assert len((out / "test.raw.en").read_text().splitlines()) == 30
    assert "up to date, skipping" in prepare(shared_data, out).stderr

    bigger = run("bash", SCRIPTS / "prepare-iwslt14.sh", "--shared", shared_data, "--out", out,
                 "--train-lines", "2000", "--valid-lines", "100", "--test-lines", "45")
    assert bigger.returncode == 0, bigger.stderr[-3000:]
    assert "parameters differ" in bigger.stderr and "rebuilding" in bigger.stderr
    assert len((out / "test.raw.en").read_text().splitlines()) == 45
    assert json.loads((out / "manifest.json").read_text())["sentences"]["test"] == 45
    assert leftovers(tmp_path / "data") == []


# ---- training and evaluation faults, on one small data-bin ----

@pytest.fixture(scope="module")
def data(iwslt_bin):
    """The shared prepare-iwslt14.sh data-bin (conftest.iwslt_bin: 200 valid, 60 test sentences)."""
    return iwslt_bin


def train(data, out, *extra, env=None, experiment=EXPERIMENT):
    return run("bash", SCRIPTS / "train.sh", "--cpu", *extra, experiment, data, out, env=env)


def without_manifest(data, tmp_path):
    """A copy of the data-bin as made before manifests existed."""
    old = tmp_path / "no-manifest"
    shutil.copytree(data, old)
    (old / "manifest.json").unlink()
    return old


def test_train_refuses_incomplete_manifest(data, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    m = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**m, "complete": False}))
    proc = train(bad, tmp_path / "run")
    last_error(proc, "says the data is incomplete", "rebuild it")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sigterm_stops_training_tree_and_books_interrupted(data, tmp_path):
    """Case 4: SIGTERM did not stop training (the trap waited for fairseq-train | tee),
    then booked rc 143 for a run that completed."""
    out = tmp_path / "run"
    err = open(tmp_path / "stderr", "w")
    proc = subprocess.Popen(["bash", str(SCRIPTS / "train.sh"), "--cpu", EXPERIMENT, str(data), str(out)],
                            stdout=subprocess.DEVNULL, stderr=err, text=True,
                            env={**os.environ, **TINY, "MAX_UPDATE": "100000"}, start_new_session=True)
    log = out / "train.log"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if log.exists() and re.search(r"num_updates=\d+", log.read_text()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        # stopped, not finished: its 100000 updates would take hours (a generous wait for a loaded machine,
        # beyond the stopper's grace period, TFIXUP_STOP_SECONDS)
        rc = proc.wait(timeout=300)
        left = group_left(proc.pid)
        assert not left, f"still running in the stopped run's process group: {left}"  # fairseq-train, tee
    finally:
        kill_group(proc.pid)
    assert rc == 143 and "done training" not in log.read_text(), rc
    assert (out / "train_runs.tsv").read_text().splitlines()[-1].split("\t")[-1] == "interrupted"
    assert not (out / "train_run.open").exists() and leftovers(out) == []


def test_corrupt_checkpoint_last_names_intact_one_and_its_command_works(data, tmp_path):
    """Case 5: a corrupt checkpoint_last.pt gave 'rerun the same command to resume' forever.
    Its first training run, on a data-bin made before manifests, also shows what train.sh prints."""
    data = without_manifest(data, tmp_path)
    out = tmp_path / "run"
    first = train(data, out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "no manifest.json (made before manifests)" in first.stderr  # used, with a warning
    # what is shown has fairseq's useful lines, not the config dump, its start-up bookkeeping, hydra's
    # deprecation warnings or the tensorboardX notice; the log keeps everything
    shown = first.stdout + first.stderr
    assert "num. shared model params" in shown and "done training" in shown and "dictionary: " not in shown
    assert "'_name'" not in shown and "Warning" not in shown and "tensorboardX" not in shown, shown[:3000]
    log = (out / "train.log").read_text()
    assert "'_name'" in log and "UserWarning" in log and "dictionary: " in log
    ckpts = out / "checkpoints"
    assert (ckpts / "checkpoint_1_10.pt").exists()
    last = ckpts / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:5000])
    more = {"MAX_UPDATE": "15"}
    proc = train(data, out, env=more)
    line = last_error(proc, "checkpoint_last.pt is corrupt", "checkpoint_1_10.pt (10 updates)", "resume from it with: ")
    command = line.split("resume from it with: ", 1)[1]
    assert command.startswith("mv ") and "train.sh" in command
    resumed = subprocess.run(command, shell=True, capture_output=True, text=True,
                             env={**os.environ, **TINY, **more})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "(update 10)" in resumed.stderr
    from tfixup import checkpoints

    assert recover.num_updates(last) == 15
    assert (ckpts / "checkpoint_last.pt.corrupt").exists()


def test_nan_run_one_line_with_update_loss_lr_and_advice(data, tmp_path):
    """Case 6: NaN ended in fairseq's NanDetector crashing, the last line StopIteration."""
    out = tmp_path / "run"
    proc = train(data, out, env={"LR": "1e3", "MAX_UPDATE": "40", "SAVE_INTERVAL_UPDATES": "0"})
    line = last_error(proc, "training diverged", "after update", "loss ", "lr ", "lower LR", "DECAY_PERIOD", "fp16")
    assert "rerun the same command" not in line
    assert "interrupted" not in (out / "train_runs.tsv").read_text()


def test_config_outside_configs_is_the_one_recorded_and_results_are_readable(data, tmp_path):
    """Case 9: evaluate.sh looked a config path up by name in configs/ (another beam in
    results.json); results.json/averaging.json are not 0600."""
    conf = tmp_path / "elsewhere" / "my_tfixup.conf"
    conf.parent.mkdir()
    conf.write_text("BASE=iwslt14\nBEAM=2\nLENPEN=0.7\n")
    out = tmp_path / "run"
    proc = train(data, out, experiment=conf, env={"MAX_UPDATE": "5", "SAVE_INTERVAL_UPDATES": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = run("bash", SCRIPTS / "evaluate.sh", "--cpu", conf, data, out,
             env={"PROGRESS_SECONDS": "1", "MAX_UPDATE": "5", "SAVE_INTERVAL_UPDATES": "0"})
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert re.search(r"translated \d+ / 60 sentences", ev.stderr)
    res = json.loads((out / "eval" / "results.json").read_text())
    assert res["beam"] == 2 and res["lenpen"] == 0.7 and res["config_file"] == str(conf)
    assert "--beam 2 " in (out / "eval" / "generate-test.cmd").read_text()
    for name in ("results.json", "averaging.json"):
        assert stat.S_IMODE((out / "eval" / name).stat().st_mode) & 0o044 == 0o044, name
    assert leftovers(out) == []
