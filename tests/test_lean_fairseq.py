"""The suite's fairseq processes start without scikit-learn and scipy (tests/lean_fairseq/sitecustomize.py):
a subprocess inherits the skip through PYTHONPATH, fairseq still registers what this project builds, and the
two skipped modules register nothing."""

import subprocess
import sys

from conftest import REPO

PROBE = """
import sys
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.tasks import TASK_REGISTRY
print(sorted(m for m in ("sklearn", "scipy") if m in sys.modules))
print("label_smoothed_cross_entropy" in CRITERION_REGISTRY, "translation" in TASK_REGISTRY,
      "language_modeling" in TASK_REGISTRY, "sentence_prediction" in CRITERION_REGISTRY)
"""


def test_a_subprocess_of_the_suite_imports_fairseq_without_sklearn_and_scipy():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["[]", "True True True False"], proc.stdout


def test_each_process_accounts_for_its_cpu_and_the_suites_record_sums_them_by_kind(tmp_path):
    """scripts/test.sh's record of where the suite's CPU goes: a process of the suite writes one line at exit
    (tests/lean_fairseq/sitecustomize.py), harness.main_job sums the lines by kind."""
    import json
    import os

    from harness import main_job

    lines = tmp_path / "processes.jsonl"
    env = {**os.environ, "TFIXUP_TEST_PROCESSES": str(lines)}
    for code in ("pass", "import torch"):
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)
    first, second = (json.loads(line) for line in lines.read_text().splitlines())
    assert (first["torch"], second["torch"], second["fairseq"], second["pytest"]) == (False, True, False, False)
    assert 0 <= first["cpu_s"] < second["cpu_s"]  # each its own CPU: importing torch is work
    summed = main_job.process_cpu(lines, 100.0)
    assert (summed["other_python"]["count"], summed["torch_only"]["count"], summed["torch_fairseq"]["count"]) == (1, 1, 0)
    assert summed["rest_cpu_s"] == round(100.0 - summed["other_python"]["cpu_s"] - summed["torch_only"]["cpu_s"], 1)
