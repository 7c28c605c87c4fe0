"""Data preparation (offline, real shared data) and bad-input behaviour of the pipeline scripts."""

import gzip
import json
import os
import subprocess

import pytest

from conftest import REPO

SCRIPTS = REPO / "scripts"


def run(*cmd, env=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def assert_one_line_error(proc, *words):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]


def test_wmt_local_mode_is_resumable_and_complete(shared_data, tmp_path):
    """prepare-wmt17-en-de.sh on the real WMT En-De toy slice + newstest files: a run
    that fails in the tokenize step keeps the finished raw step and nothing half
    written; the rerun resumes and produces a joined-dictionary data-bin with raw refs."""
    toy, tests = shared_data / "wmt-ende-toy10k", shared_data / "wmt-testsets"
    out = tmp_path / "wmt17" / "bin"
    common = ["bash", SCRIPTS / "prepare-wmt17-en-de.sh", "--out", out,
              "--train-src", toy / "src-train.txt.xz", "--train-tgt", toy / "tgt-train.txt.xz", "--pretokenized",
              "--train-lines", "1200", "--test-lines", "40", "--bpe-tokens", "200", "--workers", "1"]
    empty = tmp_path / "no-testsets"
    empty.mkdir()
    failed = run(*common, "--testsets", empty)
    assert failed.returncode != 0 and "newstest2014.en-de.en" in failed.stderr
    work = out.parent / "bin.work"
    assert (work / "raw" / "train.en").is_file() and not (work / "tok").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["bin.work"]
    assert sorted(p.name for p in work.iterdir()) in (["archives", "raw"], ["raw"])

    ok = run(*common, "--testsets", tests)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "exists, skipping: " + str(work / "raw") in ok.stderr
    assert (out / "dict.en.txt").read_text() == (out / "dict.de.txt").read_text()  # joined dictionary
    for split in ("train", "valid", "test"):
        assert (out / f"{split}.en-de.de.bin").stat().st_size > 0
    ref = (out / "test.raw.de").read_text(encoding="utf-8").splitlines()
    with gzip.open(tests / "newstest2014.en-de.de.gz", "rt", encoding="utf-8") as f:
        expected = [next(f).rstrip("\n") for _ in range(40)]
    assert ref == expected
    valid = (work / "bpe" / "valid.en").read_text().splitlines()
    assert 8 <= len(valid) <= 12  # every 100th of 1200 pairs, after cleaning
    assert "@@" in (work / "bpe" / "test.en").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["sentences"]["test"] == 40 and manifest["params"]["train_lines"] == "1200"
    assert "up to date, skipping" in run(*common, "--testsets", tests).stderr


def test_corrupted_wmt_archive_is_refused(tmp_path):
    archives = tmp_path / "archives"
    archives.mkdir()
    for name in ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                 "training-parallel-nc-v12.tgz"):
        (archives / name).write_bytes(b"not the real archive")
    out = tmp_path / "data" / "wmt17"
    proc = run("bash", SCRIPTS / "prepare-wmt17-en-de.sh", "--out", out, "--archives", archives)
    assert_one_line_error(proc, "checksum mismatch", "training-parallel-europarl-v7.tgz")
    assert not (tmp_path / "data").exists()


def test_corrupted_iwslt_archive_is_refused(tmp_path):
    fake = tmp_path / "de-en.tgz"
    fake.write_bytes(b"\x1f\x8b not the release")
    out = tmp_path / "data" / "iwslt"
    proc = run("bash", SCRIPTS / "prepare-iwslt14.sh", "--out", out, "--archive", fake)
    assert_one_line_error(proc, "checksum mismatch", "de-en.tgz")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("script", ["train.sh", "evaluate.sh"])
def test_unknown_experiment(script, tmp_path):
    proc = run("bash", SCRIPTS / script, "--cpu", "no_such_experiment", tmp_path, tmp_path / "run")
    assert_one_line_error(proc, "unknown experiment 'no_such_experiment'")
    assert not (tmp_path / "run").exists()


def test_missing_data_dir(tmp_path):
    proc = run("bash", SCRIPTS / "train.sh", "--cpu", "iwslt14_de_en_tfixup", tmp_path / "missing", tmp_path / "run")
    assert_one_line_error(proc, "data dir not found", "missing")
    assert not (tmp_path / "run").exists()


def test_evaluate_without_training(tmp_path):
    (tmp_path / "data").mkdir()
    proc = run("bash", SCRIPTS / "evaluate.sh", "--cpu", "iwslt14_de_en_tfixup", tmp_path / "data", tmp_path / "run")
    assert_one_line_error(proc, "no trained model")
    assert not (tmp_path / "run").exists()


def test_bad_flags_and_tables():
    assert_one_line_error(run("bash", SCRIPTS / "train.sh", "--nproc", "two", "iwslt14_de_en_tfixup", "a", "b"),
                          "--nproc must be a number")
    assert_one_line_error(run("bash", SCRIPTS / "table1.sh", "--only", "wmt14_en_de_base_12l_tfixup", "--dry-run"),
                          "not an experiment of this table")
    assert_one_line_error(run("bash", SCRIPTS / "report.sh", "nope"), "unknown experiment 'nope'")
