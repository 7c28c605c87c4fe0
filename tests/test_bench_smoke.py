"""Smoke test of the speed benchmark (bench/speed.py): its --smoke setting end to end on the real
IWSLT'14 sample, writing a table, JSON and PNG with the fields that the README quotes. The numbers
themselves are benchmarks, never asserted as speed targets. (The evidence studies' tests:
test_bench_studies.py.)"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def small_bin(shared_data, tmp_path_factory):
    """A data-bin with a short valid/test slice, so that validation and BLEU stay quick."""
    out = tmp_path_factory.mktemp("bench") / "bin"
    subprocess.run(
        ["bash", str(REPO / "scripts" / "prepare-iwslt14.sh"), "--out", str(out), "--shared", str(shared_data),
         "--valid-lines", "100", "--test-lines", "30"],
        check=True, capture_output=True, text=True,
    )
    return out


def run_bench(name, data, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", f"bench.{name}", "--smoke", "--data", str(data), "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for ext in ("json", "md", "png"):
        assert (out / f"{name}.{ext}").stat().st_size > 0
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temp files left behind"
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| " in proc.stdout  # the table is printed
    result = json.loads((out / f"{name}.json").read_text())
    for key in ("command", "machine", "data", "mode"):
        assert result[key]
    assert result["mode"] == "smoke"
    assert "date_utc" in result["machine"]
    return result


def test_speed_benchmark_smoke(small_bin, tmp_path):
    speed = run_bench("speed", small_bin, tmp_path / "speed")
    (rec,) = speed["results"]
    assert rec["size"] == "tiny" and rec["dtype"] == "fp32"
    for m in ("tfixup", "stock"):
        assert rec[m]["tokens_per_s"] > 0 and rec[m]["gflop_per_step"] > 0
        assert rec["cpu_memory"][m]["train_peak_mib"] > 0
    # T-Fixup drops the LayerNorm weights and biases: 2 per norm, 2 norms per encoder layer and 3 per
    # decoder layer (2+2 layers), plus the final norms fairseq keeps only for Pre-LN (not here)
    assert rec["stock"]["params"] - rec["tfixup"]["params"] == 2 * 64 * (2 * 2 + 3 * 2)
    assert rec["ratio_tokens_per_s"] == pytest.approx(rec["tfixup"]["tokens_per_s"] / rec["stock"]["tokens_per_s"])
