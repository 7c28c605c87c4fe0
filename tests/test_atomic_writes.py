"""The one atomic writer (tfixup/atomic.py) and what goes through it: a writer killed outright (kill -9
mid-save) left `.checkpoint_*.pt.*.tmp` that nothing removed; evaluate.sh's averaging wrote with fairseq's
own writer, so a full disk gave an ENOSPC traceback and left `averaged.pt.candidate.pt.tmp`."""

import errno
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import REPO
from tfixup import atomic, checkpoints

KILLED_MID_WRITE = """
import sys, time
from tfixup import atomic

def write(tmp):
    with open(tmp, "wb") as f:
        f.write(b"half a checkpoint")
        f.flush()
        print("writing", flush=True)
        time.sleep(60)

atomic.write_file(sys.argv[1], write)
"""


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_write_removes(tmp_path):
    target = tmp_path / "checkpoint_last.pt"
    writer = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(target)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    assert writer.stdout.readline() == "writing\n"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(f".checkpoint_last.pt.{writer.pid}.") and left[0].endswith(".tmp")
    # a writer still running keeps its temp file
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        running = tmp_path / f".checkpoint_2_10.pt.{sleeper.pid}.abcd1234.tmp"
        running.write_bytes(b"being written")
        atomic.write_text(tmp_path / "checkpoint_1_5.pt", "x")
        assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "checkpoint_1_5.pt"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_folder_is_published_whole_or_not_at_all(tmp_path):
    """write_folder: the new folder replaces the old one whole; a failure leaves the old one and no temp
    folder; a dead writer's temp folder is removed by the next write, a running writer's kept."""
    out = tmp_path / "data-bin"
    atomic.write_folder(out, lambda tmp: (tmp / "dict.txt").write_text("old"))
    assert (out / "dict.txt").read_text() == "old" and oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())

    def half(tmp):
        (tmp / "dict.txt").write_text("half")
        raise RuntimeError("preprocessing failed")

    with pytest.raises(RuntimeError):
        atomic.write_folder(out, half)
    assert [p.name for p in tmp_path.iterdir()] == ["data-bin"] and (out / "dict.txt").read_text() == "old"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".data-bin.{dead.pid}.abcd1234.tmp" / "text").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        running = tmp_path / f".other.{sleeper.pid}.abcd1234.tmp"
        running.mkdir()
        atomic.write_folder(out, lambda tmp: (tmp / "dict.txt").write_text("new"))
        assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "data-bin"]
        assert [p.name for p in out.iterdir()] == ["dict.txt"] and (out / "dict.txt").read_text() == "new"
    finally:
        sleeper.kill()
        sleeper.wait()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def full_disk(monkeypatch, after_bytes=1000):
    """Writes through checkpoints.save fail with ENOSPC once AFTER_BYTES are written."""
    written = {"n": 0}
    write = checkpoints._Writer.write

    def failing(self, data):
        written["n"] += len(data)
        if written["n"] > after_bytes:
            self.error = self.error or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise self.error
        return write(self, data)

    monkeypatch.setattr(checkpoints._Writer, "write", failing)


def test_averaging_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    from harness import average

    real, data, _ = tiny_checkpoint
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    shutil.copy(real, ckpts / "checkpoint_last.pt")
    out = tmp_path / "eval"
    out.mkdir()
    full_disk(monkeypatch)
    # fairseq's own writer (which `python -m harness average` got: it does not import the plugin) is not used
    monkeypatch.setattr(average.checkpoint_utils, "torch_persistent_save", lambda *a: pytest.fail("fairseq's writer"))
    monkeypatch.setattr(average, "valid_loss", lambda *a: pytest.fail("nothing to validate: the save failed"))
    with pytest.raises(average.DiskFull) as e:
        average.choose_and_average(str(ckpts), [1], str(data), str(out / "averaged.pt"), [])
    line = str(e.value)
    assert line.startswith(f"disk full (ENOSPC) writing the averaged checkpoint {out}/averaged.pt: ")
    assert "MiB free on the disk of" in line and "\n" not in line
    assert list(out.iterdir()) == [] and sorted(p.name for p in ckpts.iterdir()) == ["checkpoint_last.pt"]
