"""The speed benchmark (harness/bench/speed.py): that it times fairseq-train's own Trainer, and its --smoke
setting end to end on the real IWSLT'14 sample, writing a table, JSON and PNG with the fields that the
README quotes. The numbers themselves are benchmarks, never asserted as speed targets. (The evidence
studies' tests: test_bench_studies.py.)"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from harness.bench import speed  # noqa: E402


def run_bench(name, data, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", f"harness.bench.{name}", "--smoke", "--data", str(data), "--out", str(out)],
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


def test_speed_benchmark_smoke(iwslt_bin, tmp_path):
    (rec,) = run_bench("speed", iwslt_bin, tmp_path / "speed")["results"]
    assert rec["size"] == "tiny" and rec["dtype"] == "fp32"
    for m in ("tfixup", "stock"):
        assert rec[m]["tokens_per_s"] > 0 and rec[m]["gflop_per_step"] > 0
        mem = rec["cpu_memory"][m]
        assert mem["train_peak_mib"] > 0
        # the fresh memory process trained the same model on every batch
        assert mem["params"] == rec[m]["params"] and mem["steps"] == speed.MODES["smoke"]["batches"]
    # T-Fixup drops the LayerNorm weights and biases: 2 per norm, 2 norms per encoder layer and 3 per
    # decoder layer (2+2 layers), plus the final norms fairseq keeps only for Pre-LN (not here)
    assert rec["stock"]["params"] - rec["tfixup"]["params"] == 2 * 64 * (2 * 2 + 3 * 2)
    assert rec["ratio_tokens_per_s"] == pytest.approx(rec["tfixup"]["tokens_per_s"] / rec["stock"]["tokens_per_s"])


def test_speed_times_fairseq_trainer(iwslt_bin, tmp_path):
    """The timed object is fairseq-train's Trainer with fairseq's Adam and each method's own schedule
    (T-Fixup at full lr from update 0, stock warming up from 1e-7), and a CUDA fp16 run passes --fp16,
    which makes fairseq's Trainer half the model and wrap Adam in FP16Optimizer."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.adam import FairseqAdam
    from fairseq.trainer import Trainer

    from fairseq_tfixup.diagnostics.models import parse_train_args

    cfg = speed.MODES["smoke"]
    trainers = {m: speed.new_trainer(m, "tiny", iwslt_bin, cfg, "cpu", "fp32", str(tmp_path)) for m in speed.MODELS}
    for t in trainers.values():
        assert isinstance(t, Trainer) and isinstance(t.optimizer, FairseqAdam)
        assert t.cfg.common.cpu and not t.cfg.common.fp16
    assert trainers["tfixup"].get_lr() == pytest.approx(5e-4)
    assert trainers["stock"].get_lr() == pytest.approx(1e-7)
    batch = speed.real_batches(trainers["tfixup"], 1)[0]
    trainers["tfixup"].train_step([batch])
    assert trainers["tfixup"].get_num_updates() == 1
    fp16 = convert_namespace_to_omegaconf(parse_train_args(
        iwslt_bin, speed.train_flags("tfixup", "tiny", 512, "cuda", "fp16", str(tmp_path))))
    assert fp16.common.fp16 and not fp16.common.cpu
    assert not list(tmp_path.iterdir()), "the trainer wrote into its save dir"
