"""harness/run_ledger.py, train.sh's train_runs.tsv: a run books itself when it ends; one that could not
(a full disk: its outcome kept in the open record's name; killed outright: the open record left) is
booked by the next run, which says so for a killed one."""

import os

from harness import run_ledger


def rows(out):
    return [line.split("\t") for line in (out / "train_runs.tsv").read_text().splitlines()]


def test_a_run_books_itself_and_the_next_books_what_could_not(tmp_path):
    run_ledger.open_run(str(tmp_path), "2", "NVIDIA_H100")
    run_ledger.close_run(str(tmp_path), "0")
    assert [r[2:] for r in rows(tmp_path)] == [["2", "NVIDIA_H100", "0"]]
    assert int(rows(tmp_path)[0][0]) <= int(rows(tmp_path)[0][1]) and not (tmp_path / "train_run.open").exists()

    (tmp_path / "train_runs.tsv").rename(tmp_path / "kept.tsv")
    (tmp_path / "train_runs.tsv").symlink_to("/dev/full")  # a full disk
    run_ledger.open_run(str(tmp_path), "1", "cpu")
    run_ledger.close_run(str(tmp_path), "interrupted")
    (renamed,) = tmp_path.glob("train_run.open.*")
    assert renamed.name.endswith(".interrupted") and not (tmp_path / "train_run.open").exists()
    (tmp_path / "train_runs.tsv").unlink()
    (tmp_path / "kept.tsv").rename(tmp_path / "train_runs.tsv")

    run_ledger.open_run(str(tmp_path), "1", "cpu")  # then killed outright: nothing books it
    (tmp_path / "train.log").write_text("... Saved checkpoint checkpoint_last.pt (epoch 2 @ 40 updates, score 3.1)\n")
    os.utime(tmp_path / "train.log", (1_700_000_000, 1_700_000_000))
    assert run_ledger.book_killed(str(tmp_path)).startswith("the run started ")
    assert run_ledger.book_killed(str(tmp_path)) == ""  # booked once
    assert [r[2:] for r in rows(tmp_path)] == [["2", "NVIDIA_H100", "0"], ["1", "cpu", "interrupted"],
                                               ["1", "cpu", "killed"]]
    assert rows(tmp_path)[2][1] == "1700000000"  # ended at train.log's last write
    assert not list(tmp_path.glob("train_run.open*"))


def test_the_killed_line_says_what_was_kept(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    run_ledger.open_run(str(tmp_path), "1", "cpu")
    assert run_ledger.book_killed(str(tmp_path)).endswith(f"booked as killed in {tmp_path}/train_runs.tsv; "
                                                          "no checkpoint saved yet")
    (tmp_path / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")
    (tmp_path / "train.log").write_text("Saved checkpoint (epoch 1 @ 10 updates)\nSaved checkpoint (epoch 2 @ 20 updates)\n")
    run_ledger.open_run(str(tmp_path), "1", "cpu")
    assert run_ledger.book_killed(str(tmp_path)).endswith(
        f"; kept {tmp_path}/checkpoints/checkpoint_last.pt (update 20)")
