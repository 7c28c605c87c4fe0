"""The second fault pass: a PREPARE that ran a script of its own, a failed start
that locked its run directory, two train.sh on one run, a train.sh killed outright, stale or changed
inputs reused, a space in --out, causes named wrongly (a bit flip, another model, a truncated .bin, a
full disk), evaluation on other data, and the smaller ones. Each asserts the one-line message (the last
line on stderr) or the exact recovery, and that nothing half-made or foreign is left or reused."""

import gzip
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import (REPO, TINY_RUN as TINY, group_left, group_members, kill_group, last_error, run_script as run,
                      write_dicts)

SCRIPTS = REPO / "scripts"
EXPERIMENT = "iwslt14_de_en_tfixup"


def train(data, out, *extra, env=None):
    return run("bash", SCRIPTS / "train.sh", "--cpu", *extra, EXPERIMENT, data, out, env=env)


# ---- case 3: PREPARE


def test_prepare_names_a_script_of_scripts_and_is_never_globbed(tmp_path):
    """PREPARE=../../../../tmp/evil.sh ran that script; a glob in it expanded (/etc/host* -> 3 words)."""
    evil = tmp_path / "evil.sh"
    marker = tmp_path / "ran"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\n")
    relative = os.path.relpath(evil, SCRIPTS)
    for prepare, words in ((relative, ("PREPARE must start with a script of scripts/", "prepare-iwslt14.sh")),
                           ("prepare-iwslt14.sh /etc/host*", ("PREPARE's arguments must be plain words", "/etc/host*"))):
        proc = run("bash", SCRIPTS / "table1.sh", "--only", EXPERIMENT, "--runs", tmp_path / "runs",
                   "--data-root", tmp_path / "data", env={"PREPARE": prepare})
        last_error(proc, "(PREPARE from the environment)", *words)
    assert not marker.exists() and not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
    # the table's own word lists are split on blanks, never globbed
    proc = run("bash", SCRIPTS / "table1.sh", "--dry-run", "--only", EXPERIMENT, "--iwslt-args", "--archive /etc/host*")
    assert proc.returncode == 0, proc.stderr
    assert "--archive /etc/host\\*" in proc.stdout and "/etc/hosts" not in proc.stdout


# ---- cases 4 and 5: a failed start, two train.sh on one run, kill -9


def pgroup_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def fake_fairseq_train(folder: pathlib.Path, body: str) -> dict:
    """An environment whose fairseq-train is BODY (a shell script): train.sh's own behaviour around
    its child, without fairseq's start-up."""
    folder.mkdir()
    (folder / "fairseq-train").write_text("#!/bin/sh\n" + body)
    (folder / "fairseq-train").chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_failed_start_then_lock_then_kill_9_takes_training_down(tmp_path, dict_dir):
    """Case 4: fairseq-train refusing a flag (exit 2) left the run bound to its settings: the rerun with
    good ones was refused. Case 5: a second train.sh on the same OUT_DIR raced the first (train.log
    interleaved, a false "killed" row), and kill -9 of train.sh left fairseq-train running. Also the
    booking of a run whose train_runs.tsv line cannot be written (a full disk: here /dev/full).
    fairseq-train is a stand-in that fails as fairseq's parser does (the message measured from
    fairseq-train 0.12) or stays up."""
    env = fake_fairseq_train(tmp_path / "bin", """case " $* " in *" --no-such-flag "*)
  echo "fairseq-train: error: unrecognized arguments: --no-such-flag" >&2; exit 2;; esac
echo "fairseq_cli.train | {'_name': None}"
exec sleep 300
""")
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_runs.tsv").symlink_to("/dev/full")
    # (after --: a config's EXTRA_TRAIN_ARGS is refused before fairseq-train starts, tests/test_allowlist.py)
    failed = run("bash", SCRIPTS / "train.sh", "--cpu", EXPERIMENT, dict_dir, out, "--", "--no-such-flag", env=env)
    last_error(failed, "fairseq-train refused its arguments (unrecognized arguments: --no-such-flag)", "EXTRA_TRAIN_ARGS")
    (booked,) = [p.name for p in out.glob("train_run.open.*")]  # the outcome kept in the name: exit 2
    assert booked.endswith(".2") and not (out / "train_run.open").exists()
    (out / "train_runs.tsv").unlink()

    # the rerun with other settings is accepted (no checkpoint yet), and holds the lock while it trains
    err = open(tmp_path / "a.err", "w")
    first = subprocess.Popen(["bash", str(SCRIPTS / "train.sh"), "--cpu", "--set", "LR=1e-3", EXPERIMENT,
                              str(dict_dir), str(out)], stdout=subprocess.DEVNULL, stderr=err,
                             env={**os.environ, **TINY, **env}, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and first.poll() is None:
            if (out / "train.log").exists() and "fairseq_cli.train" in (out / "train.log").read_text():
                break
            time.sleep(0.1)
        assert first.poll() is None, (tmp_path / "a.err").read_text()[-3000:]
        second = train(dict_dir, out, "--set", "LR=1e-3", env=env)
        last_error(second, f"{out} is in use by another scripts/train.sh (PID {first.pid};", f"kill {first.pid}")
        os.kill(first.pid, signal.SIGKILL)  # train.sh itself, outright
        first.wait()
        deadline = time.time() + 60  # generous, for a loaded machine: the wait ends when the group does
        while time.time() < deadline and pgroup_alive(first.pid):
            time.sleep(0.1)
        assert not pgroup_alive(first.pid), "fairseq-train outlived train.sh"
    finally:
        if pgroup_alive(first.pid):
            os.killpg(first.pid, signal.SIGKILL)
    record = json.loads((out / "config.resolved.json").read_text())
    assert record["values"]["LR"] == "1e-3" and record["values"]["EXTRA_TRAIN_ARGS"] == ""
    rows = [line.split("\t") for line in (out / "train_runs.tsv").read_text().splitlines()]
    assert [r[4] for r in rows] == ["2"]  # the failed start, booked by the rerun; no row from the refused one
    assert (out / "train_run.open").exists()  # the killed run: booked "killed" by the next one
    assert "in use by another" not in (out / "train.log").read_text()


@pytest.mark.parametrize("text, message", [
    ("LR=nan", "LR must be a finite number, got 'nan'"), ("LR=inf", "LR must be a finite number"),
    ("DROPOUT=2", "DROPOUT must be in [0, 1), got 2"), ("LABEL_SMOOTHING=1", "LABEL_SMOOTHING must be in [0, 1)"),
    ("AVG_CANDIDATES=1 $(touch X)", "AVG_CANDIDATES must be whole numbers >= 1"),
    ("ADAM_BETAS=(0.9,1.5)", "ADAM_BETAS must be two numbers in [0, 1)"), ("DATASET=../../x", "DATASET must be a plain name"),
])
def test_values_fairseq_cannot_use_are_refused_before_anything_is_written(text, message, tmp_path):
    proc = run("bash", SCRIPTS / "train.sh", "--cpu", "--set", text, EXPERIMENT, tmp_path, tmp_path / "run")
    last_error(proc, f"(--set {text.split('=')[0]})", message)
    assert not (tmp_path / "run").exists() and not (tmp_path / "X").exists()


def test_divergence_advice_is_a_command_that_is_accepted(tmp_path):
    """The divergence message's "lower LR (--set LR=...)" was refused by the run's record: now it is a
    command, in the same OUT_DIR while it holds no checkpoint, else in a new one."""
    from harness import config, recover

    out = tmp_path / "run"
    config.record(config.resolve(EXPERIMENT, {"LR": "1e-3"}, environ={}), [], out / config.RECORD)
    log = ("fairseq_cli.train | {'_name': None}\n2026-01-01 00:00:00 | INFO | train_inner | epoch 001:   3 / 9 loss=9.1, lr=0.001, num_updates=3\n"
           "FloatingPointError: gradients are Nan/Inf\n")
    argv = ["bash", "scripts/train.sh", "--cpu", "--set", "LR=1e-3", EXPERIMENT, "data", str(out), "--", "--x"]
    line = recover.train_failure(log, 1, str(out), argv)
    assert "training diverged" in line and "after update 3" in line and "rerun the same command" not in line
    command = line.split("e.g.: ", 1)[1].split(";")[0]
    assert command == f"bash scripts/train.sh --cpu --set LR=1e-3 {EXPERIMENT} data {out} --set LR=0.0005 -- --x"
    config.record(config.resolve(EXPERIMENT, {"LR": "0.0005"}, environ={}), [], out / config.RECORD)  # accepted
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")
    line = recover.train_failure(log, 1, str(out), argv)
    assert f"{out} --set" not in line and f"{out}-lr0.00025 --set LR=0.00025 -- --x" in line and "new OUT_DIR" in line


START = "fairseq_cli.train | {'_name': None}\n"


@pytest.mark.parametrize("log, rc, words", [
    # fairseq's own words for a MAX_TOKENS below every sentence (measured: train.sh --set MAX_TOKENS=1)
    (START + "Exception: The dataset is empty. This could indicate that all elements in the dataset have been skipped. "
             "Try increasing the max number of allowed tokens or using a larger dataset.\n", 1,
     ["no sentence pair fits in a batch of MAX_TOKENS tokens", "--set MAX_TOKENS=4096", "nothing was trained"]),
    ("scripts/train.sh: line 250: /usr/bin/setpriv: Argument list too long\n", 126,
     ["could not be started (Argument list too long)", "shorten EXTRA_TRAIN_ARGS"]),
    (START + "  File \"fairseq/logging/meters.py\", line 47, in smoothed_value\n"
             "TypeError: unsupported operand type(s) for /: 'str' and 'int'\n", 1,
     ["fairseq-train failed: TypeError: unsupported operand", "will fail the same way until its cause is fixed"]),
])
def test_rerun_advice_only_where_rerunning_is_the_fix(log, rc, words, tmp_path):
    """MAX_TOKENS=1, an argument list too long (exit 126) and a TypeError in fairseq's meters all ended
    with "rerun the same command to resume", which fails the same way."""
    from harness import config, recover

    out = tmp_path / "run"
    config.record(config.resolve(EXPERIMENT, {}, environ={}), [], out / config.RECORD)
    argv = ["bash", "scripts/train.sh", "--cpu", EXPERIMENT, "data", str(out)]
    line = recover.train_failure(log, rc, str(out), argv)
    assert all(w in line for w in words) and "rerun the same command" not in line, line
    killed = recover.train_failure(START, 137, str(out), argv)  # the OOM killer: resuming is the fix
    assert "killed (SIGKILL: out of memory?)" in killed and "rerun the same command to resume" in killed


def test_divergence_at_an_absurd_lr_goes_back_to_the_configs_own(tmp_path):
    """LR=1e9 diverged and was advised to try 5e8: the config's own LR is the fix there; halving stays
    the advice for an LR near it."""
    from harness import config, recover

    own = config.resolve(EXPERIMENT, environ={}).values["LR"]
    log = START + "FloatingPointError: gradients are Nan/Inf\n"
    for lr, retry in (("1e9", f"{float(own):g}"), (own, f"{float(own) / 2:g}")):
        out = tmp_path / f"run-{lr}"
        config.record(config.resolve(EXPERIMENT, {"LR": lr}, environ={}), [], out / config.RECORD)
        line = recover.train_failure(log, 1, str(out), ["bash", "scripts/train.sh", EXPERIMENT, "data", str(out)])
        assert line.split("e.g.: ", 1)[1].split(";")[0].endswith(f"--set LR={retry}"), line


# ---- cases 6, 7 and 10: data


def corpus(root: pathlib.Path, shared: pathlib.Path, lines: int = 300):
    """Real Multi30k De-En pairs as plain files: train = the first LINES, valid and test = 20 of them
    (no <unk>: with --tokenizer none --bpe-merges 0 every word is in the dictionaries)."""
    root.mkdir(parents=True)
    for lang in ("de", "en"):
        with gzip.open(shared / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        (root / f"train.{lang}").write_text("".join(text), encoding="utf-8")
        (root / f"valid.{lang}").write_text("".join(text[:20]), encoding="utf-8")
        (root / f"test.{lang}").write_text("".join(text[20:40]), encoding="utf-8")
    return root


def test_corpus_space_in_out_changed_input_lone_cr_stale_tmp_truncated_bin(shared_data, tmp_path):
    """Case 7: a space in --out lost the <unk> rates (the log regex) and named a deleted log. Case 6:
    a corpus file replaced at the same path was 'up to date, skipping'. Case 10: a lone \\r was blamed on
    'a truncated input', and kill -9 of prepare left OUT.tmp.PID. Case 8: a .bin truncated after
    publishing was found only by fairseq-train."""
    src = corpus(tmp_path / "corpus", shared_data)
    out = tmp_path / "data bin" / "m30k de-en"
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = pathlib.Path(f"{out}.tmp.{gone.pid}")  # as kill -9 of a prepare leaves it
    stale.mkdir(parents=True)
    prepare = ["bash", SCRIPTS / "prepare-corpus.sh", "--src", "de", "--tgt", "en", "--train", src / "train",
               "--valid", src / "valid", "--test", src / "test", "--tokenizer", "none", "--bpe-merges", "0", "--out", out]
    clean = (src / "test.de").read_text(encoding="utf-8")
    (src / "test.de").write_text(clean.replace(" ", " \r", 1), encoding="utf-8")
    bad = run(*prepare)
    last_error(bad, f"{src / 'test.de'} line 1 holds a carriage return", "sed", "nothing published")
    assert not out.exists() and not stale.exists() and not list(out.parent.glob("*.tmp.*"))
    (src / "test.de").write_text(clean, encoding="utf-8")

    ok = run(*prepare)
    assert ok.returncode == 0, ok.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["unk_rate_percent"]) == {f"{s}.{l}" for s in ("train", "valid", "test") for l in ("de", "en")}
    assert manifest["files"]["train.de-en.de.bin"] == (out / "train.de-en.de.bin").stat().st_size
    assert "up to date, skipping" in run(*prepare).stderr

    train_en = (src / "train.en").read_text(encoding="utf-8")  # new content at the same path
    (src / "train.en").write_text(train_en.replace(" ", "\rx ", 1), encoding="utf-8")
    changed = run(*prepare)
    assert f"an input changed since {out} was made ({src / 'train.en'}: sha256 differs" in changed.stderr
    last_error(changed, "train.en line 1 holds a carriage return")

    binary = out / "train.de-en.de.bin"
    binary.write_bytes(binary.read_bytes()[:100])
    proc = run("python3", "-m", "harness.manifest", "check", out)
    last_error(proc, f"{binary} is 100 bytes, but manifest.json says", "rebuild it")


def test_refused_data_keeps_its_preprocess_log(tmp_path):
    """Case 7: "see its log" named a log in the temp folder, already deleted."""
    from harness import manifest

    folder = tmp_path / "tmp bin"
    folder.mkdir()
    (folder / "preprocess.log").write_text("[de] /a b/text/train.de: 3 sents, 9 tokens, 0.0% replaced\n")
    (tmp_path / "in.de").write_text("x\n")
    kept = tmp_path / "out.preprocess.log"
    with pytest.raises(SystemExit) as e:
        manifest.main(["write", str(folder / "manifest.json"), "--params", "{}", "--counts", "train=3", "--inputs",
                       str(tmp_path / "in.de"), "--made-by", "t", "--preprocess-log", str(folder / "preprocess.log"),
                       "--keep-log", str(kept)])
    assert "reported 1 of 2 files in its log (kept: " in str(e.value) and str(kept) in str(e.value)
    assert kept.read_text().startswith("[de] /a b/text/train.de: 3 sents")
    assert not (folder / "manifest.json").exists()


# ---- case 8: causes named rightly


@pytest.fixture
def run_with(tmp_path, tiny_checkpoint):
    """An empty run folder (checkpoints/) and the tiny checkpoint's data-bin (its dictionaries)."""
    _, data, _ = tiny_checkpoint
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    return out, data


def flip_a_bit_in_a_tensor(path: pathlib.Path) -> None:
    import struct
    import zipfile

    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(raw))


def test_bit_flip_and_another_model_in_the_run_are_named_before_training(run_with, tiny_checkpoint):
    """A bit-flipped checkpoint_last.pt (same size) loaded, trained into NaN and was called a divergence
    ("lower LR"), leaving crash.pt; a checkpoint of another model was called bad data."""
    from tfixup import checkpoints

    out, data = run_with
    real, _, _ = tiny_checkpoint
    ckpts = out / "checkpoints"
    shutil.copy(real, ckpts / "checkpoint_1_3.pt")
    shutil.copy(real, ckpts / "checkpoint_last.pt")
    flip_a_bit_in_a_tensor(ckpts / "checkpoint_last.pt")
    assert checkpoints.load(ckpts / "checkpoint_last.pt")["optimizer_history"]  # torch alone loads it
    env = {"EMBED_DIM": "16", "FFN_DIM": "32"}
    proc = train(data, out, env=env)
    line = last_error(proc, "checkpoint_last.pt is corrupt (", "fails its CRC check", "checkpoint_1_3.pt (3 updates)",
                      "resume from it with: mv ")
    assert "diverged" not in line and not (ckpts / "crash.pt").exists() and not (out / "train.log").exists()

    other = out.parent / "other"  # another run's checkpoint copied into a new run folder
    (other / "checkpoints").mkdir(parents=True)
    shutil.copy(real, other / "checkpoints" / "checkpoint_last.pt")
    proc = train(data, other, env={"EMBED_DIM": "32"})  # the checkpoint's model is 16-dim
    last_error(proc, "checkpoint_last.pt holds another model than this run trains (encoder_embed_dim 16, not 32",
               "use a new OUT_DIR")
    assert not (other / "train.log").exists()


def test_load_failures_of_fairseq_train_name_dictionary_or_architecture(run_with, tiny_checkpoint, tmp_path):
    """What fairseq-train logs when a checkpoint's tensors do not fit the model (its own message around
    torch's, made here by the same load_state_dict): other dictionaries, or another architecture."""
    from fairseq_tfixup.diagnostics.models import build_from_flags
    from tfixup import methods
    from harness import recover

    out, data = run_with
    real, _, state = tiny_checkpoint
    shutil.copy(real, out / "checkpoints" / "checkpoint_last.pt")
    for other_data, dims, says in ((write_dicts(tmp_path / "d50", size=50), (16, 32, 2, 1, 1), "other dictionaries"),
                                   (data, (16, 64, 2, 1, 1), "holds another model")):
        _, _, model, _ = build_from_flags(other_data, ["-s", "de", "-t", "en", *methods.model_flags("tfixup"),
                                                    *methods.dims_flags(*dims)])
        with pytest.raises(RuntimeError) as e:
            model.load_state_dict(state["model"])
        log = (f"fairseq_cli.train | {{'_name': None}}\nException: Cannot load model parameters from checkpoint "
               f"{out}/checkpoints/checkpoint_last.pt; please ensure that the architectures match.\n{e.value}\n")
        line = recover.train_failure(log, 1, str(out), ["bash", "train.sh"])
        assert says in line and "could not use the data" not in line, line
        assert ("44 symbols in the checkpoint, 54 now" in line) == (says == "other dictionaries"), line


def test_truncated_bin_refused_by_train_sh(iwslt_bin, tmp_path):
    """Case 8: a .bin truncated after publishing was "rerun the same command to resume"."""
    data = tmp_path / "data"
    shutil.copytree(iwslt_bin, data)
    binary = data / "valid.de-en.en.bin"
    binary.write_bytes(binary.read_bytes()[:-7])
    last_error(train(data, tmp_path / "run"), str(binary), "manifest.json says", "rebuild it with scripts/prepare-")
    assert not (tmp_path / "run").exists()


# fairseq-train's checkpoint save at update 5, as fairseq_cli/train.py makes it: fairseq's own
# checkpoint_utils.save_checkpoint (which writes checkpoint_1_5.pt, then copies it to
# checkpoint_last.pt) with the plugin loaded, around a trainer that saves a real tiny checkpoint
SAVE_AT_UPDATE_5 = """
import argparse, sys
import torch
import fairseq_tfixup  # as --user-dir
from fairseq import checkpoint_utils
from fairseq.dataclass.configs import CheckpointConfig

print("fairseq_cli.train | {'_name': None}", flush=True)
state = torch.load(sys.argv[1], weights_only=True)
save_dir = sys.argv[sys.argv.index("--save-dir") + 1]

class Trainer:
    data_parallel_rank, checkpoint_suffix, should_save_checkpoint_on_current_rank = 0, "", True
    always_call_state_dict_during_save_checkpoint = False
    task = argparse.Namespace()
    def consolidate_optimizer(self): pass
    def get_num_updates(self): return 5
    def save_checkpoint(self, filename, extra_state):
        # a 1 MB tensor more: the tmpfs below holds one checkpoint and not two
        checkpoint_utils.torch_persistent_save({**state, "extra_state": extra_state, "more": torch.zeros(2 ** 18)},
                                               filename)

class Epochs:
    epoch = 1
    def end_of_epoch(self): return False
    def state_dict(self): return {"epoch": 1}

cfg = CheckpointConfig(save_dir=save_dir, save_interval_updates=5, keep_interval_updates=10)
checkpoint_utils.save_checkpoint(cfg, Trainer(), Epochs(), None)
"""


def test_disk_full_keeps_the_last_checkpoint_whole_and_books_the_run(tiny_checkpoint, tmp_path):
    """Case 8: a full disk gave 'printf: write error', left a truncated checkpoint_last.pt (fairseq 0.12
    copies it with shutil.copyfile) and was later booked as "killed"; torch's "unexpected pos" named
    no full disk. Here train.sh runs on a tmpfs (a mount namespace of its own) that holds the first
    checkpoint and not its copy; fairseq-train is its checkpoint save (SAVE_AT_UPDATE_5)."""
    import sys

    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("unprivileged mount namespaces are not available here (unshare -rm)")
    real, data, _ = tiny_checkpoint
    (tmp_path / "save.py").write_text(SAVE_AT_UPDATE_5)
    env = fake_fairseq_train(tmp_path / "bin", f'exec "{sys.executable}" "{tmp_path / "save.py"}" "{real}" "$@"\n')
    small, copy = tmp_path / "small", tmp_path / "copy"
    small.mkdir()
    size_k = (real.stat().st_size + 2 ** 20) * 3 // 2 // 1024
    script = (f'mount -t tmpfs -o size={size_k}k tmpfs "{small}" && bash "{SCRIPTS}/train.sh" --cpu {EXPERIMENT} '
              f'"{data}" "{small}/run"; rc=$?; cp -a "{small}/run" "{copy}"; exit $rc')
    proc = run("unshare", "-rm", "bash", "-c", script, env={**env, "EMBED_DIM": "16", "FFN_DIM": "32"})
    line = last_error(proc, "disk full (ENOSPC) on the disk of", "training stopped", "checkpoint_1_5.pt (3 updates)",
                      "then resume with: cp ")
    ckpts = copy / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint_1_5.pt"], line  # no truncated copy, no temp file
    rows = [r.split("\t") for r in (copy / "train_runs.tsv").read_text().splitlines()]
    assert [r[4] for r in rows] == ["1"] and not (copy / "train_run.open").exists()


# ---- case 9: what an evaluation used


def test_evaluate_refuses_data_with_other_dictionaries(run_with, tiny_checkpoint, tmp_path):
    from harness import config

    out, data = run_with
    real, _, _ = tiny_checkpoint
    config.record(config.resolve(EXPERIMENT, environ=TINY), ["fairseq-train ..."], out / config.RECORD, data)
    shutil.copy(real, out / "checkpoints" / "checkpoint_last.pt")
    other = write_dicts(tmp_path / "other", size=41)
    proc = run("bash", SCRIPTS / "evaluate.sh", "--cpu", EXPERIMENT, other, out)
    last_error(proc, f"{other}: dict.de.txt differs from the dictionary {out} was trained with (in {data})")
    assert not (out / "eval").exists()
    same = tmp_path / "same"
    shutil.copytree(data, same)
    assert "the dictionaries of the data-bin the run trained on" in config.check_data(out, same)


# ---- case 10: the smaller ones


def test_a_failed_averaging_leaves_no_candidate_and_a_corrupt_checkpoint_is_named(run_with, tiny_checkpoint, monkeypatch):
    from tfixup import checkpoints
    from harness import average

    out, data = run_with
    real, _, _ = tiny_checkpoint
    ckpts = out / "checkpoints"
    shutil.copy(real, ckpts / "checkpoint_last.pt")

    def fails(*_):
        raise RuntimeError("fairseq-validate failed on ...")

    monkeypatch.setattr(average, "valid_loss", fails)
    with pytest.raises(RuntimeError):
        average.choose_and_average(str(ckpts), [1], str(data), str(out / "averaged.pt"), [])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]
    (ckpts / "checkpoint_last.pt").write_bytes(real.read_bytes()[:3000])
    with pytest.raises(checkpoints.CorruptCheckpoint, match=f"^{ckpts}/checkpoint_last.pt is corrupt \\(cannot be read: "):
        average.choose_and_average(str(ckpts), [1], str(data), str(out / "averaged.pt"), [])


# ---- the third pass: stopping the main job, configs that run code or move outputs


def wait_for(condition, timeout_s: float, step_s: float = 0.2) -> bool:
    """CONDITION() became true within TIMEOUT_S (generous: these wait on a loaded machine, never time it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step_s)
    return condition()


@pytest.mark.parametrize("how", ["TERM", "Ctrl-C"])
def test_stopping_the_main_job_stops_training_and_says_what_was_kept(how, cpu_main_job, shared_data, tmp_path):
    """SIGTERM to quickstart.sh's PID left training running (only train.sh's own PID stopped it); Ctrl-C
    (SIGINT to the process group) took 10 s and ended in "lib.sh: line 92: ... Killed"; the run said
    "interrupted: nothing published" with checkpoint_last.pt saved; later train.sh and quickstart.sh each said
    "rerun the same command", with different commands. Here: the script's whole process group ends, the run is
    booked interrupted, and the last lines name what was kept and the one command that resumes."""
    from conftest import TINY_MAIN_ARGS, TINY_MAIN_ENV

    work, _, _ = cpu_main_job
    mine = tmp_path / "qs"
    shutil.copytree(work / "data-bin", mine / "data-bin", symlinks=True)  # the prepare step is skipped
    run_dir = mine / "runs" / "multi30k_de_en_cpu_tfixup"
    err = open(tmp_path / "stderr", "w")
    cmd = ["bash", str(SCRIPTS / "quickstart.sh"), "--cpu", "--work", str(mine), *TINY_MAIN_ARGS]
    job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                           env={**os.environ, **TINY_MAIN_ENV, "MAX_EPOCH": "100", "OMP_NUM_THREADS": "1",
                                "TFIXUP_SHARED_DATA": str(shared_data)})
    try:
        saved = wait_for(lambda: job.poll() is not None or (run_dir / "checkpoints" / "checkpoint_last.pt").exists(), 600)
        assert saved and job.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        if how == "TERM":
            job.send_signal(signal.SIGTERM)  # the script's own PID only
        else:
            os.killpg(job.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        rc = job.wait(timeout=60)
        assert not group_left(job.pid)
    finally:
        kill_group(job.pid)
    stderr = (tmp_path / "stderr").read_text()
    assert rc == {"TERM": 143, "Ctrl-C": 130}[how], stderr[-3000:]
    assert "Killed" not in stderr and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    kept = re.search(rf"interrupted: kept {run_dir}/checkpoints/checkpoint_last.pt \(update (\d+)\) \(quickstart.sh "
                     r"says how to resume\)", stderr)
    assert kept, stderr[-3000:]
    # one command to resume, the one the user typed (train.sh's own was a second, different one)
    assert stderr.count("rerun the same command") == 1, stderr[-3000:]
    assert lines[-1].endswith("interrupted: finished steps and saved checkpoints are kept; rerun the same command to "
                              f"resume: bash {SCRIPTS}/quickstart.sh --cpu --work {mine} {' '.join(TINY_MAIN_ARGS)}")
    assert (run_dir / "train_runs.tsv").read_text().splitlines()[-1].endswith("\tinterrupted")
    assert not (run_dir / "train_run.open").exists()


def test_kill_9_of_prepare_takes_its_preprocess_down_and_the_rerun_removes_its_temp(shared_data, tmp_path):
    """kill -9 of prepare-corpus.sh left fairseq-preprocess running (its worker died with it, the
    worker's children did not) and an OUT.tmp.PID folder; the rerun removes the folder and publishes."""

    src = corpus(tmp_path / "corpus", shared_data)
    out = tmp_path / "bin"
    prepare = ["bash", str(SCRIPTS / "prepare-corpus.sh"), "--src", "de", "--tgt", "en", "--train", str(src / "train"),
               "--valid", str(src / "valid"), "--test", str(src / "test"), "--tokenizer", "none", "--bpe-merges", "0",
               "--out", str(out)]
    # a fairseq-preprocess that takes long (a large corpus): one that ended on its own would hide the orphan
    slow = fake_fairseq_train(tmp_path / "slow", "exit 0\n")
    (tmp_path / "slow" / "fairseq-preprocess").write_text("#!/bin/sh\nexec sleep 300\n")
    (tmp_path / "slow" / "fairseq-preprocess").chmod(0o755)
    job = subprocess.Popen(prepare, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                           env={**os.environ, **slow})
    try:
        busy = wait_for(lambda: job.poll() is not None
                        or any(m.endswith(" sleep") for m in group_members(job.pid)), 300, step_s=0.05)
        assert busy and job.poll() is None, "prepare ended before its fairseq-preprocess was seen"
        os.kill(job.pid, signal.SIGKILL)  # the script's own PID, outright
        job.wait()
        assert not group_left(job.pid)
    finally:
        kill_group(job.pid)
    (stale,) = tmp_path.glob("bin.tmp.*")
    rerun = run(*prepare)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"removing {stale} (left by a run that was killed" in rerun.stderr, rerun.stderr
    assert (out / "manifest.json").is_file() and not list(tmp_path.glob("bin.tmp.*"))


@pytest.mark.parametrize("text", ["", "  \n\t\n"])
def test_an_empty_or_blank_train_file_is_named_up_front(text, shared_data, tmp_path):
    """An empty or whitespace-only train file ended in "max() arg is an empty sequence ... learn BPE failed"."""
    src = corpus(tmp_path / "corpus", shared_data, lines=40)
    (src / "train.de").write_text(text)
    (src / "train.en").write_text(text)
    proc = run("bash", SCRIPTS / "prepare-corpus.sh", "--src", "de", "--tgt", "en", "--train", src / "train",
               "--valid", src / "valid", "--test", src / "test", "--bpe-merges", "100", "--out", tmp_path / "bin")
    last_error(proc, f"{src / 'train.de'} has no text (no lines, or only blank ones): check --train")
    assert "max()" not in proc.stderr and not list(tmp_path.glob("bin*"))


def read_only(folder: pathlib.Path, *cmd):
    """CMD with FOLDER mounted read-only (a private mount namespace: nothing outside sees it)."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespaces here (unshare -m)")
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && shift && exec "$@"'
    return run("unshare", "-m", "sh", "-c", script, "sh", folder, *cmd)


def test_a_read_only_run_folder_is_one_line_naming_it(run_with, tmp_path):
    """train.sh ended with "line 170: .lock: Read-only file system", evaluate.sh with an EROFS traceback."""
    from harness import config

    out, data = run_with
    config.record(config.resolve(EXPERIMENT, {}, environ=TINY), [], out / config.RECORD)
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")
    proc = read_only(out, "bash", SCRIPTS / "train.sh", "--cpu", EXPERIMENT, data, out)
    last_error(proc, f"OUT_DIR {out} is not writable (read-only file system or no permission)")
    proc = read_only(out, "bash", SCRIPTS / "evaluate.sh", "--cpu", EXPERIMENT, data, out)
    last_error(proc, f"the evaluation folder {out}/eval is not writable (read-only file system")
    assert "Traceback" not in proc.stderr and "line " not in proc.stderr


def test_sigterm_to_a_table_script_stops_its_step_and_names_the_command_that_resumes(shared_data, tmp_path):
    """Every script stops its whole tree on SIGTERM to its own PID (here table1.sh while it prepares the
    data), and one that keeps its finished steps says the command that resumes."""

    err = open(tmp_path / "stderr", "w")
    cmd = ["bash", str(SCRIPTS / "table1.sh"), "--only", EXPERIMENT, "--runs", str(tmp_path / "runs"),
           "--data-root", str(tmp_path / "data")]
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                           env={**os.environ, **TINY, "TFIXUP_SHARED_DATA": str(shared_data)})
    try:
        busy = wait_for(lambda: job.poll() is not None or list((tmp_path / "data").glob("**/*.tmp.*")), 300, 0.05)
        assert busy and job.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == 143
        assert not group_left(job.pid)
    finally:
        kill_group(job.pid)
    lines = (tmp_path / "stderr").read_text().strip().splitlines()
    assert lines[-1].endswith("interrupted: finished experiments and saved checkpoints are kept; rerun the same "
                              f"command to resume: {' '.join(cmd)}"), lines[-5:]
    assert not list((tmp_path / "data").glob("**/*.tmp.*"))  # the prepare step's temp folder went with it
