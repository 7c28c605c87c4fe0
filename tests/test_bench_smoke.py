"""The speed benchmark (harness/bench/speed.py): that it times fairseq-train's own Trainer, and its --smoke
setting end to end on the real IWSLT'14 sample, writing a table, JSON and PNG with the fields that the
README quotes. The numbers themselves are benchmarks, never asserted as speed targets. (The evidence
studies' tests: test_bench_studies.py.)"""

import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from harness.bench import speed  # noqa: E402


def test_speed_benchmark_smoke(iwslt_bin, tmp_path, monkeypatch, capsys):
    """``python -m harness.bench.speed --smoke``, its main() run in this process, and each memory run in a thread
    of it instead of a fresh process (two more processes each paid fairseq's import; the peak is then this
    process's, which is what the fields hold)."""
    import concurrent.futures

    out = tmp_path / "speed"
    monkeypatch.setattr(speed, "fresh_process", lambda: concurrent.futures.ThreadPoolExecutor(1))
    monkeypatch.setattr(sys, "argv", ["speed.py", "--smoke", "--data", str(iwslt_bin), "--out", str(out)])
    assert speed.main(sys.argv[1:]) == 0
    for ext in ("json", "md", "png"):
        assert (out / f"speed.{ext}").stat().st_size > 0
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temp files left behind"
    assert (out / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| " in capsys.readouterr().out  # the table is printed
    result = json.loads((out / "speed.json").read_text())
    assert all(result[key] for key in ("command", "machine", "data", "mode"))
    assert result["mode"] == "smoke" and "date_utc" in result["machine"]
    (rec,) = result["results"]
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
