"""The main job's record (harness/main_job.py): written by `bash scripts/quickstart.sh --cpu` at its end (commit,
date, machine, each step's time, the results), published into results/main-job/ by one command, and the source
of README's numbers on the job (a generated block), so that they cannot go stale."""

import json
import os
import pathlib
import re
import time

from conftest import REPO

from harness import docs, main_job

VALUES = {"MAX_EPOCH": "7", "MAX_UPDATE": "0", "DATASET": "multi30k.de-en", "ARCH": "transformer_tfixup",
          "EMBED_DIM": "128", "FFN_DIM": "256", "HEADS": "4", "ENCODER_LAYERS": "6", "DECODER_LAYERS": "6",
          "LR": "5e-4", "MAX_TOKENS": "4096", "LOWERCASE": "1"}
SIGNATURE = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"


def fake_run(tmp_path) -> pathlib.Path:
    """A run folder as train.sh and evaluate.sh leave it (the files the record reads)."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.resolved.json").write_text(json.dumps({"values": VALUES}))
    (run / "eval" / "results.json").write_text(json.dumps({
        "experiment": "multi30k_de_en_cpu_tfixup", "row": "Multi30k De-En, T-Fixup", "config": VALUES,
        "num_updates": 868, "bleu_tok": 27.5, "bleu_detok": 27.6, "sacrebleu_signature": SIGNATURE,
        "averaging": {"chosen": {"k": 2}}, "sentences": 1000, "beam": 4, "lenpen": 0.3, "train_segments": 1,
        "train_wall_hours": 0.25}))
    (run / "summary.txt").write_text("Your model:\n")
    return run


def test_the_record_holds_each_steps_time_the_machine_and_the_results(tmp_path, monkeypatch):
    run = fake_run(tmp_path)
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    main_job.timing(tmp_path / "venv" / "install-time.json", 1000.0, ["what=scripts/install.sh"])
    t0 = 1_700_000_000.0
    rec = main_job.record(run, (t0, t0 + 30, t0 + 90, t0 + 1000), 0.4, 2, "work/data-bin/x", ["--cpu"])
    assert json.loads((run / "main-job.json").read_text()) == rec
    t = rec["times"]
    assert (t["install_s"], t["prepare_s"], t["train_s"]) == (30.0, 60.0, 910.0)
    assert t["total_s"] == round(t["install_s"] + t["prepare_s"] + t["train_s"] + t["evaluate_s"], 1)
    assert rec["results"] == {"test_bleu": 27.5, "sacrebleu": 27.6, "k": 2, "test_sentences": 1000, "beam": 4,
                              "lenpen": 0.3, "sacrebleu_signature": SIGNATURE}
    assert rec["machine"]["cores"] == os.cpu_count() and rec["machine"]["busy_cores_at_start"] == 0.4
    assert rec["machine"]["cpu"] and rec["machine"]["torch"]
    assert len(rec["commit"]) == 40 and rec["date"].startswith("2023-11-14")
    assert rec["command"].endswith("scripts/quickstart.sh --cpu")
    assert rec["first_install"]["what"] == "scripts/install.sh" and rec["first_install"]["wall_s"] > 0
    # --no-install: no install time, not a zero one
    rec = main_job.record(run, (t0, t0, t0 + 90, t0 + 1000), None, 1, "d", ["--cpu", "--no-install"])
    assert rec["times"]["install_s"] is None and rec["times"]["prepare_s"] == 90.0


def test_publish_replaces_the_folder_whole_and_readme_takes_its_numbers(tmp_path, monkeypatch, capsys):
    run = fake_run(tmp_path)
    results = tmp_path / "results"
    block = docs.block_main_job(results, tmp_path)
    assert "No run of the job has recorded itself yet" in block and not any(c.isdigit() for c in block)
    # a job stopped before its end has no record: one line, nothing published
    assert main_job.main(["publish", str(run), "--to", str(results / "main-job")]) == 1
    assert "no record" in capsys.readouterr().err and not (results / "main-job").exists()
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    main_job.timing(tmp_path / "venv" / "install-time.json", time.time() - 1250, [])
    t0 = 1_700_000_000.0
    rec = main_job.record(run, (t0, t0 + 30, t0 + 90, t0 + 1000), 0.4, 2, "d", ["--cpu"])
    (results / "main-job").mkdir(parents=True)
    (results / "main-job" / "steps.log").write_text("an older run's\n")
    suite = tmp_path / "test-suite.json"
    monkeypatch.setattr(main_job, "SUITE", suite)
    main_job.timing(suite, time.time() - 130, ["passed=true", "cpu_s=253.4", "workers=auto"])
    assert json.loads(suite.read_text())["cpu_s"] == 253.4  # a number (scripts/test.sh's CPU seconds)
    assert main_job.main(["publish", str(run), "--to", str(results / "main-job")]) == 0
    names = sorted(p.name for p in (results / "main-job").iterdir())
    assert names == ["README.md", "config.resolved.json", "record.json", "results.json", "summary.txt"]
    published = json.loads((results / "main-job" / "record.json").read_text())
    assert published["suite"]["passed"] is True and published["times"] == rec["times"]
    page = (results / "main-job" / "README.md").read_text()
    assert "test BLEU 27.50" in page and "sacreBLEU 27.60" in page and "| **total** |" in page
    assert "- model: Multi30k De-En, T-Fixup, 128-256-4, 6+6 layers" in page
    readme = tmp_path / "README.md"
    readme.write_text("<!-- generated: python -m harness.docs write (main-job) -->\n<!-- end generated -->\n")
    monkeypatch.setattr(docs, "DOCS", ("README.md",))
    assert docs.write(["README.md"], tmp_path) == ["README.md"]
    text = readme.read_text()
    total = main_job.duration(rec["times"]["total_s"])
    assert f"**{total}** in all" in text and "test BLEU **27.50** (sacreBLEU 27.60)" in text
    assert re.search(r"first install .* took 20 min 5\d s .* test suite .* took 2 min 1\d s on \d+ cores \(passed\)",
                     text)
    assert docs.stale(["README.md"], tmp_path) == []


def test_the_main_job_writes_its_record_and_summary(cpu_main_job, tmp_path):
    """The tiny main job (conftest.cpu_main_job) ends with RUN/main-job.json and RUN/summary.txt (with the model
    section README promises); publish puts them into a folder of results' shape."""
    work, out, _ = cpu_main_job
    run = work / "runs" / "multi30k_de_en_cpu_tfixup"
    rec = json.loads((run / "main-job.json").read_text())
    res = json.loads((run / "eval" / "results.json").read_text())
    assert rec["results"]["test_bleu"] == res["bleu_tok"] and rec["results"]["sacrebleu"] == res["bleu_detok"]
    t = rec["times"]
    assert t["install_s"] is None  # --no-install
    assert all(t[k] >= 0 for k in ("prepare_s", "train_s", "evaluate_s")) and t["train_s"] > 0
    assert t["total_s"] >= t["prepare_s"] + t["train_s"] + t["evaluate_s"] - 0.5
    assert rec["machine"]["torch_threads"] == 1 and rec["machine"]["busy_cores_at_start"] is not None
    assert rec["command"].endswith("--no-install --train-lines 1000 --valid-lines 40 --test-lines 20")
    assert "MAX_EPOCH=2" in rec["command"] and rec["train"]["epochs"] == 2
    summary = (run / "summary.txt").read_text()
    assert "Your model:" in summary and "Train longer" in summary and summary.strip() in out
    to = tmp_path / "main-job"
    assert main_job.main(["publish", str(run), "--to", str(to)]) == 0
    assert {"record.json", "summary.txt", "learning-curve.png", "report.md", "results.json", "README.md",
            "config.resolved.json", "train_command.sh"} <= {p.name for p in to.iterdir()}
    assert str(REPO) not in (to / "README.md").read_text().split("\n", 1)[0]
