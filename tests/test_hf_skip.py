"""Where transformers cannot load its models (a torchaudio built for another torch: its lazy imports fail at the
first model class), each HuggingFace test file is skipped with one line saying why: no failures, no tracebacks."""

import os
import re
import subprocess
import sys

from conftest import REPO

FILES = ["test_hf_tfixup.py", "test_hf_saved.py", "test_hf_trainer.py", "test_hf_examples.py",
         "test_hf_distributed.py"]


def test_a_broken_transformers_skips_each_hf_test_file_in_one_line(tmp_path):
    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "def __getattr__(name):\n"
        "    raise RuntimeError('Failed to import transformers.models.llama.modeling_llama because of the following '\n"
        "                       'error:\\nlibtorchaudio.so: undefined symbol: _ZN3c10')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           *(f"tests/{f}" for f in FILES)], cwd=REPO, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out[-3000:]  # pytest's "no tests ran": each file skipped whole
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1 and re.fullmatch(
        rf"SKIPPED \[{len(FILES)}\] tests/hf_available.py:\d+: transformers cannot be imported \(RuntimeError: "
        r"libtorchaudio.so: undefined symbol: _ZN3c10\): HuggingFace tests skipped", skips[0]), out
    assert "Traceback" not in out and "Error" not in out.replace("RuntimeError", ""), out[-3000:]
