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
