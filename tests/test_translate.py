"""Translating your own text with a trained run (scripts/translate.sh, harness/translate.py): the
commands the main job's summary prints run as printed; the text gets the data-bin's preprocessing
(as its manifest records it) and the output is detokenized; the hub snippet loads the model with
the plugin and fails without it as docs/pipelines.md says."""

import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO
from harness import manifest, translate

RUN = "runs/multi30k_de_en_cpu_tfixup"
DATA = "data-bin/multi30k.de-en-n1000-v40-t20"


def sh(cmd, stdin=None, check=True, **kw):
    proc = subprocess.run(cmd, cwd=REPO, input=stdin, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, **kw)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def printed_command(summary: str, heading: str) -> str:
    """The command on the line after HEADING in the summary."""
    lines = summary.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(heading))
    return lines[i + 1].strip()


def test_the_printed_command_translates_a_typed_sentence_as_the_data_was_made(cpu_main_job):
    work, out, _ = cpu_main_job
    # the summary's last lines: the command for a typed mixed-case sentence with umlauts, then what it printed
    cmd = printed_command(out, "Translate your own text")
    typed = "Zwei Männer spielen Fußball im Park."
    example = out.rstrip().splitlines()[-1]
    assert example.startswith("  -> ") and typed in cmd
    proc = sh(["bash", "-c", cmd + " --verbose"])
    assert proc.stdout == example[len("  -> "):] + "\n"
    # the model read it lowercased and BPE'd with the data-bin's codes: no <unk> (fairseq's dictionary
    # shows one as "<unk>"), every piece in the training dictionary
    seen, wrote = re.search(r"^S: (.*)\nT: (.*)$", proc.stderr, re.M).groups()
    assert seen == pipeline(work).encode(typed) and "<unk>" not in seen and seen == seen.lower(), seen
    known = {line.split()[0] for line in (work / DATA / "dict.de.txt").read_text(encoding="utf-8").splitlines()}
    assert set(seen.split()) <= known and "männer" in seen.replace("@@ ", "")
    # and what it wrote: BPE removed, detokenized
    assert "@@" not in proc.stdout and proc.stdout.strip() == pipeline(work).decode(wrote)
    # a raw (cased, untokenized) test sentence becomes the tokens evaluate.sh translated (generate-test.txt
    # shows them with BPE removed)
    raw_test = (work / DATA / "test.raw.de").read_text(encoding="utf-8").splitlines()[0]
    generated = (work / RUN / "eval" / "generate-test.txt").read_text(encoding="utf-8")
    assert pipeline(work).encode(raw_test).replace("@@ ", "") == re.search(r"^S-0\t(.*)$", generated, re.M).group(1)


def pipeline(work):
    data = work / DATA
    return translate.TextPipeline(translate.text_steps(data), data)


def test_decoding_removes_bpe_and_detokenizes(cpu_main_job):
    work, _, _ = cpu_main_job
    assert pipeline(work).decode("a man &apos;s hat@@ s , too .") == "A man's hats, too."
    assert pipeline(work).decode("i think i saw it .") == "I think I saw it."  # a lowercased model's output, recased
    assert pipeline(work).encode("Ein Hund, der läuft.").replace("@@ ", "") == "ein hund , der läuft ."


def test_show_names_the_final_model_dictionaries_and_codes(cpu_main_job, tmp_path):
    work, _, _ = cpu_main_job
    shown = json.loads(sh(["bash", "scripts/translate.sh", "--show", str(work / RUN)]).stdout)
    assert shown["model"] == str(work / RUN / "eval" / "averaged.pt")
    assert shown["bpe_codes"] == str(work / DATA / "code") and all(os.path.isfile(d) for d in shown["dictionaries"])
    # without the averaged model: fairseq's best checkpoint, else its last
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint_last.pt").touch()
    assert translate.final_model(run) == run / "checkpoints" / "checkpoint_last.pt"
    (run / "checkpoints" / "checkpoint_best.pt").touch()
    assert translate.final_model(run) == run / "checkpoints" / "checkpoint_best.pt"
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(translate.TranslateError, match="holds no model"):
        translate.final_model(run)


def test_a_data_bin_made_before_its_preprocessing_was_recorded(cpu_main_job, tmp_path):
    work, _, _ = cpu_main_job
    data = tmp_path / "data"
    shutil.copytree(work / DATA, data)
    m = json.loads((data / "manifest.json").read_text())
    recorded = m.pop("preprocess")
    (data / "manifest.json").write_text(json.dumps(m))
    # prepare-corpus.sh always recorded its tokenizer, casing and merges in its parameters
    steps = translate.text_steps(data)
    assert {k: steps[k] for k in recorded} == recorded
    # any other script: one line naming the field and the command that makes the data-bin again
    m["made_by"] = "scripts/prepare-iwslt14.sh"
    (data / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(translate.TranslateError) as e:
        translate.text_steps(data, work / RUN)
    msg = str(e.value)
    assert "'preprocess'" in msg and "\n" not in msg
    # the config's prepare command with the sizes this data-bin was made with (1000 merges, not the config's 8000)
    assert msg.endswith(f"rm -rf {data} && bash scripts/prepare-corpus.sh --src de --tgt en --lowercase --out {data} "
                        "--bpe-merges 1000 --train-lines 1000 --valid-lines 40 --test-lines 20")


def test_hub_snippet_loads_with_the_plugin_and_without_it_fails_as_documented(cpu_main_job):
    work, _, _ = cpu_main_job
    report = (work / RUN / "report.md").read_text(encoding="utf-8")
    snippet = re.search(r"```python\n(.*?)```", report, re.S).group(1)
    assert snippet.startswith("import fairseq_tfixup")
    # one process (one import of fairseq): the snippet without its first line, which fails with torch's own
    # error (docs/pipelines.md quotes it with its fix), then the snippet as printed, which translates
    without_plugin = snippet.split("\n", 1)[1]
    script = (f"try:\n    exec({without_plugin!r})\nexcept Exception as e:\n    print('FAILED:', type(e).__name__, e)\n"
              f"else:\n    print('LOADED')\nprint('=' * 8)\nexec({snippet!r})\n")
    failed, loaded = sh(["python3", "-c", script]).stdout.split("=" * 8 + "\n")
    assert failed.startswith("FAILED: UnpicklingError Weights only load failed") and "argparse.Namespace" in failed
    assert loaded.strip()
    docs = (REPO / "docs" / "pipelines.md").read_text(encoding="utf-8")
    assert "Weights only load failed" in docs and "argparse.Namespace" in docs and "import fairseq_tfixup" in docs


def test_the_summary_names_the_model_and_the_command_that_trains_longer(cpu_main_job):
    work, out, _ = cpu_main_job
    model = re.search(r"^  model: +(\S+)$", out, re.M).group(1)
    assert model == str(work / RUN / "eval" / "averaged.pt")
    dicts = re.search(r"^  dictionaries: +(.+)$", out, re.M).group(1).split(", ")
    codes = re.search(r"^  BPE codes: +(\S+)$", out, re.M).group(1)
    assert all(os.path.isfile(f) for f in [*dicts, codes]) and codes == str(work / DATA / "code")
    # the main job's command with twice the epochs and this job's overrides: it trains on (a dry run shows it)
    longer = printed_command(out, "Train longer")
    assert "MAX_EPOCH=4 " in longer and "BPE_MERGES=1000 " in longer and f"--work {work}" in longer
    shown = sh(["bash", "-c", longer + " --dry-run"]).stdout
    assert "--max-epoch 4 " in shown and str(work / RUN) in shown
    report = (work / RUN / "report.md").read_text(encoding="utf-8")
    assert model in report and codes in report and longer in report


def test_the_recorded_preprocessing_is_complete_and_checked():
    with pytest.raises(manifest.DataError, match="lacks normalize_punctuation, remove_nonprinting"):
        manifest.preprocess_record(["tokenizer=moses", "lowercase=1"])
    with pytest.raises(manifest.DataError, match="lowercase=yes: must be 0 or 1"):
        manifest.preprocess_record(["lowercase=yes"])
    with pytest.raises(manifest.DataError, match="tokenizer=spacy: must be one of moses, none"):
        manifest.preprocess_record(["tokenizer=spacy"])


def test_a_corrupt_model_stops_in_one_line(cpu_main_job, tmp_path):
    work, _, _ = cpu_main_job
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    shutil.copy(work / RUN / "config.resolved.json", run)
    model = (work / RUN / "eval" / "averaged.pt").read_bytes()
    (run / "eval" / "averaged.pt").write_bytes(model[:len(model) // 2])
    proc = sh(["bash", "scripts/translate.sh", str(run)], stdin="Ein Hund.\n", check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "averaged.pt is corrupt" in proc.stderr


def test_the_summary_of_a_run_on_such_a_data_bin_says_so_and_ends_well(cpu_main_job, tmp_path):
    work, _, _ = cpu_main_job
    copy = tmp_path / "qs"
    shutil.copytree(work, copy, ignore=shutil.ignore_patterns("checkpoint*.pt"))
    rec = copy / RUN / "config.resolved.json"
    rec.write_text(rec.read_text().replace(str(work), str(copy)))
    m = json.loads((copy / DATA / "manifest.json").read_text())
    del m["preprocess"]
    m["made_by"] = "scripts/prepare-iwslt14.sh"
    (copy / DATA / "manifest.json").write_text(json.dumps(m))
    run = copy / RUN
    proc = sh(["python3", "-m", "harness.summary", "--run", str(run), "--png", str(run / "curve.png"),
               "--report", str(run / "report.md"), "--", "--cpu"])
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith("Translate your own text: not with this data-bin: ") and "'preprocess'" in last
    assert f"Your model: {run / 'eval' / 'averaged.pt'}" in proc.stdout


def made_up_data_bin(folder, **steps):
    """A data-bin's manifest as a prepare script writes it (a complete one), with STEPS replaced."""
    folder.mkdir()
    (folder / "code").write_text("#version: 0.2\na b\n")
    record = {"normalize_punctuation": False, "remove_nonprinting": False, "tokenizer": "moses",
              "aggressive_dash_splits": False, "lowercase": True, "bpe": "subword_nmt", "bpe_codes": "code", **steps}
    (folder / "manifest.json").write_text(json.dumps({"complete": True, "params": {"src": "de", "tgt": "en"},
                                                      "made_by": "scripts/prepare-corpus.sh", "preprocess": record}))
    return folder


@pytest.mark.parametrize("steps, message", [
    # a value this code does not know was no step at all: the text went to the model untokenized
    ({"tokenizer": "-a"}, "preprocess.tokenizer is '-a', not moses or none"),
    ({"lowercase": "yes"}, "preprocess.lowercase is 'yes', not true or false"),
    ({"bpe": "sentencepiece"}, "preprocess.bpe is 'sentencepiece', not subword_nmt or none"),
    # the codes are a file of the data-bin: never a path elsewhere (its first line was printed in the error)
    ({"bpe_codes": "/etc/passwd"}, "preprocess.bpe_codes '/etc/passwd' is not a file of the data-bin"),
    ({"bpe_codes": "../code"}, "preprocess.bpe_codes '../code' is not a file of the data-bin"),
    ({"bpe_codes": "link"}, "preprocess.bpe_codes 'link' is not a file of the data-bin"),
    ({"bpe_codes": "huge"}, "MB, not BPE codes the prepare scripts write (at most 64 MB)"),
])
def test_a_manifest_from_elsewhere_is_checked_before_its_steps_are_used(steps, message, tmp_path):
    data = made_up_data_bin(tmp_path / "data", **steps)
    (data / "link").symlink_to("/etc/passwd")
    with open(data / "huge", "wb") as f:  # sparse: no disk used
        f.truncate(translate.MAX_CODES_BYTES + 1)
    with pytest.raises(translate.TranslateError) as e:
        translate.text_steps(data)
    assert message in str(e.value) and "\n" not in str(e.value) and "root:" not in str(e.value)
    assert str(e.value).endswith("make the data-bin again: its prepare script") or "lacks" in str(e.value)
    assert translate.text_steps(made_up_data_bin(tmp_path / "good"))["tokenizer"] == "moses"


def test_help_says_what_the_output_is():
    """--help said the output is lowercased when the training text was: it is sentence-cased (recase)."""
    text = sh(["bash", "scripts/translate.sh", "--help"]).stdout
    said = " ".join(text.split()).split("the output is ", 1)[1]
    assert said.startswith("detokenized, and sentence-cased when the training text was lowercased"), said
    assert translate.recase("two men play football in the park , i think .") == \
        "Two men play football in the park , I think ."


def test_ctrl_c_ends_a_translation_without_a_traceback(monkeypatch, capsys):
    """Ctrl-C at the typed-sentence prompt (SIGINT: KeyboardInterrupt) printed Python's traceback."""
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(translate, "Translator", interrupted)
    assert translate.main(["some-run"]) == 130
    assert capsys.readouterr().err == ""
