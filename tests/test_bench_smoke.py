"""Smoke test of the three benchmarks (bench/): each runs its --smoke setting end to end on the real
IWSLT'14 sample through fairseq-train / fairseq's API and writes a table, JSON and PNG with the fields
that the README quotes. The numbers themselves are benchmarks, never asserted as speed targets."""

import json
import math
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


def test_benchmarks_smoke(small_bin, tmp_path):
    conv = run_bench("convergence", small_bin, tmp_path / "conv")
    assert {r["method"] for r in conv["runs"]} == {"tfixup", "postln_warmup"}
    for r in conv["runs"]:
        assert r["status"] == "ok", r
        assert [u for u, _ in r["valid_curve"]] == [6, 12]
        assert all(math.isfinite(l) for _, l in r["valid_curve"])
        assert 0.0 <= r["bleu"]["bleu"] <= 100.0 and r["bleu"]["sentences"] == 30
    assert conv["baseline_best_valid_loss"] == min(l for _, l in conv["summary"]["postln_warmup"]["mean_valid_curve"])
    assert conv["summary"]["postln_warmup"]["updates_to_baseline_best"] is not None
    ratio = conv["ratio_updates_tfixup_over_postln_warmup"]
    assert ratio is None or ratio > 0

    depth = run_bench("depth", small_bin, tmp_path / "depth")
    assert [(r["method"], r["depth"]) for r in depth["runs"]] == [
        ("tfixup", 2), ("postln", 2), ("tfixup", 6), ("postln", 6)]
    for r in depth["runs"]:
        assert r["status"] == "ok" and r["updates_done"] == 6, r
        assert r["s_per_update"] > 0 and math.isfinite(r["valid_loss"])
    assert 5.0 < depth["unigram_entropy_bits"] < 14.0
    assert set(depth["deepest_trained"]) == {"tfixup", "postln"}

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
