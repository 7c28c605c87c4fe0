"""Checkpoints load with torch's weights_only=True everywhere: a crafted checkpoint whose
unpickling would run a command is refused by every entry point, and the command never runs.
(Real checkpoints loading under fairseq-generate, resume and averaging: test_cli.py and
test_pipeline_chain.py.)"""

import os
import pickle
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, USER_DIR, fairseq_command, write_dicts
from harness import recover


class RunsACommand:
    """Unpickling this runs ``touch MARKER``: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "crafted.pt"
    torch.save({"model": {}, "optimizer_history": [{"num_updates": 1}], "payload": RunsACommand(marker)}, path)
    return path, marker


def test_refused_after_importing_the_plugin(crafted):
    """In this process, which imported the plugin (as every entry point does): torch's own loader,
    the plugin's and fairseq's each refuse the crafted checkpoint."""
    from fairseq import checkpoint_utils

    from tfixup import checkpoints  # imports the plugin, which registers its safe types

    path, marker = crafted
    assert not [k for k in os.environ if "NO_WEIGHTS_ONLY" in k], "safe loading switched off"
    for load in (torch.load, checkpoints.load, checkpoint_utils.load_checkpoint_to_cpu):
        with pytest.raises(pickle.UnpicklingError):
            load(str(path))
    assert not marker.exists()


def test_refused_by_fairseq_generate_with_the_plugin(crafted, dict_dir):
    """fairseq-generate's own entry point, in process (conftest.fairseq_command)."""
    path, marker = crafted
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        fairseq_command("generate", dict_dir, "--user-dir", USER_DIR, "--path", path, "--task", "translation",
                        "-s", "de", "-t", "en", "--cpu")
    assert not marker.exists()


def test_refused_by_train_sh_resume(crafted, tmp_path):
    path, marker = crafted
    data = write_dicts(tmp_path / "data")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    os.replace(path, tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "train.sh"), "--cpu", "iwslt14_de_en_tfixup",
                           str(data), str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "checkpoint_last.pt is corrupt" in last and "refused by torch.load(weights_only=True)" in last
    assert "start over with: mv " in last  # the recovery advice (no other checkpoint to resume from)
    assert not marker.exists()


def test_refused_by_evaluate_sh_averaging(crafted, tmp_path):
    """A foreign checkpoint dropped into a real run's folder (its config recorded by train.sh)."""
    from harness import config

    path, marker = crafted
    data = write_dicts(tmp_path / "data")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    config.record(config.resolve("iwslt14_de_en_tfixup", environ={}), ["fairseq-train ..."],
                  tmp_path / "run" / config.RECORD)
    os.replace(path, tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "evaluate.sh"), "--cpu", "iwslt14_de_en_tfixup",
                           str(data), str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "checkpoint_last.pt" in last and "weights_only" in last, proc.stderr[-2000:]
    assert not marker.exists()


def test_a_checkpoint_with_numpy_metrics_loads_and_code_is_still_refused(tmp_path):
    """fairseq-train --eval-bleu keeps its BLEU meters' counts as numpy arrays in the checkpoint."""
    import numpy as np

    from tfixup import checkpoints

    path = tmp_path / "metrics.pt"
    counts = np.array([10, 7, 5, 3], dtype=np.int64)
    torch.save({"model": {"w": torch.ones(2)}, "optimizer_history": [{"num_updates": 3}],
                "extra_state": {"metrics": {"valid": {"_bleu_counts": counts, "lp": np.float64(0.5).dtype}}}}, path)
    state = checkpoints.load(path)
    assert (state["extra_state"]["metrics"]["valid"]["_bleu_counts"] == counts).all()
    assert recover.num_updates(path) == 3
    bad = tmp_path / "bad.pt"
    torch.save({"model": {}, "payload": RunsACommand(tmp_path / "ran")}, bad)
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        checkpoints.load(bad)
    assert not (tmp_path / "ran").exists()


def test_averaging_validation_failure_names_the_checkpoint_and_keeps_the_log_quiet(tmp_path, capfd):
    """evaluate.sh's averaging runs fairseq-validate's code in its own process (harness/average):
    a checkpoint it cannot validate is one error naming that file, and fairseq's log (DEBUG lines,
    hydra's warnings) stays out of the terminal and out of the caller's logging setup."""
    import logging

    from harness import average

    data = write_dicts(tmp_path / "data")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    root = logging.getLogger()
    before = (root.handlers[:], root.level)
    with pytest.raises(RuntimeError, match=r"^fairseq-validate failed on \S*bad\.pt: "):
        average.valid_loss(str(bad), str(data), ["--task", "translation", "-s", "de", "-t", "en", "--max-tokens", "1000"])
    assert (root.handlers[:], root.level) == before
    out, err = capfd.readouterr()
    assert "DEBUG" not in out + err and "hydra" not in out + err, out + err


def test_fairseq_loader_loads_safely_whatever_torch_default(crafted, monkeypatch):
    """The plugin's torch.load wrapper relied on torch's default: with the default rebound to
    weights_only=False (torch before 2.6, or TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD), the crafted pickle ran
    its command through load_checkpoint_to_cpu. The wrapper now passes weights_only=True itself."""
    from fairseq import checkpoint_utils

    import fairseq_tfixup  # noqa: F401  (installs the wrapper)

    path, marker = crafted
    monkeypatch.setattr(torch.serialization, "_default_to_weights_only", lambda pickle_module: False)
    torch.load(str(path))  # the simulation is live: torch's own default now runs the command
    assert marker.exists()
    marker.unlink()
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_an_unsafe_torch_is_refused_at_import_in_one_line():
    from tfixup import checkpoints

    for version in ("2.5.1", "1.13.0+cu117", "2.4.0"):
        with pytest.raises(checkpoints.UnsafeTorch, match=rf"^torch {re.escape(version)} is too old .* install torch >= 2\.6"):
            checkpoints.require_safe_torch(version, environ={})
    checkpoints.require_safe_torch("2.6.0", environ={})
    with pytest.raises(checkpoints.UnsafeTorch, match="^TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: .*unset it"):
        checkpoints.require_safe_torch("2.13.0", environ={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    # the import itself, under a torch that says it is 2.5.1: one line, before fairseq is loaded
    proc = subprocess.run([sys.executable, "-c", "import torch; torch.__version__ = '2.5.1'; import fairseq_tfixup"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and \
        proc.stderr.startswith("error: torch 2.5.1 is too old for fairseq-tfixup"), proc.stderr


def test_updates_of_a_file_that_is_no_checkpoint_is_one_line(tmp_path):
    """`python -m harness updates` on a text file (or a link to one) ended in an IndexError traceback."""
    from tfixup import checkpoints

    text = tmp_path / "notes.txt"
    text.write_text("a note\n", encoding="utf-8")  # torch's legacy reader: IndexError (pop from empty list)
    (tmp_path / "checkpoint_last.pt").symlink_to(text)
    (tmp_path / "empty.pt").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "harness", "updates", str(tmp_path / "checkpoint_last.pt")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path}/checkpoint_last.pt is not a checkpoint (text, not torch's zip "
                                  "format or its legacy pickle)") and proc.stderr.count("\n") == 1
    for path, why in ((text, "text, not torch's zip format or its legacy pickle"), (tmp_path / "empty.pt", "empty"),
                      (tmp_path, "not a regular file")):
        with pytest.raises(checkpoints.NotACheckpoint, match=rf"^{re.escape(str(path))} is not a checkpoint \({why}"):
            checkpoints.load(path)
