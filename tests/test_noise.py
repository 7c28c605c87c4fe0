"""What a user sees is not noise: no fairseq notice before ``tfixup-diagnose --help``, each option once
in the main job's dry run, a figure's mathematical label rendered, the documented diagnostics output
folder ignored by git."""

import os
import re
import subprocess

from conftest import REPO


def sh(*cmd):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_diagnose_help_starts_with_its_usage():
    proc = sh("python3", "-m", "fairseq_tfixup.diagnostics.cli", "--help")
    assert (proc.stderr + proc.stdout).startswith("usage: tfixup-diagnose"), proc.stderr[:500]


def test_the_main_jobs_dry_run_shows_each_log_option_once():
    shown = sh("bash", "scripts/quickstart.sh", "--cpu", "--dry-run", "--no-install").stdout
    train = next(line for line in shown.splitlines() if line.startswith("fairseq-train "))
    # the job logs JSON (its summary reads the learning curve from it): that one, once
    assert re.findall(r"--log-format \S+", train) == ["--log-format json"]


def test_the_grad_norms_figure_renders_its_label_as_mathematics():
    from fairseq_tfixup.diagnostics import plots

    fig = plots.grad_norms({"tfixup": [1.0, 2.0]}, ["a", "b"], [2, 4], {"tfixup": [1.0, 0.7]}, "t")
    fig.canvas.draw()  # mathtext is parsed here: a bad expression raises
    labels = [t.get_text() for ax in fig.axes for t in (ax.yaxis.label, ax.xaxis.label, ax.title)]
    # outside $...$, TeX's ^{...} or _{...} would be drawn as typed
    assert not [text for text in labels if re.search(r"[\^_]\{", re.sub(r"\$[^$]*\$", "", text))], labels
    assert any("W^{2,L}" in text for text in labels)


def test_the_documented_diagnostics_output_folder_is_ignored():
    docs = (REPO / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    outs = set(re.findall(r"^tfixup-diagnose .*--out (\S+)", docs, re.M))
    assert outs
    for out in outs:
        if not (out.startswith("/") or out.startswith("..")):  # inside the checkout
            sh("git", "check-ignore", "-q", f"{out}/grad_norms.png")


def test_the_main_jobs_screen_has_progress_lines_and_its_log_everything(cpu_main_job):
    work, out, _ = cpu_main_job
    screen = out + (work.parent / "stderr").read_text()
    log = (work / "runs" / "multi30k_de_en_cpu_tfixup" / "train.log").read_text()
    # progress as short lines; fairseq's JSON records, the model's structure, progress bars: in the log only
    assert re.search(r"^\S+ \S+ \| epoch 2 \| update \d+ of ~?\d+ \| loss [\d.]+ \| lr [\d.e-]+ \| [\d.]+ updates/s",
                     screen, re.M), screen[-3000:]
    assert '{"epoch"' not in screen and "TFixupTransformerModel(" not in screen
    assert "| train_inner |" not in screen and "\r" not in screen and max(map(len, screen.splitlines())) < 500
    assert '{"epoch"' in log and "TFixupTransformerModel(" in log
