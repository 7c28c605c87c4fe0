"""A T-Fixup HuggingFace model on 2 CPU processes (torchrun, gloo; tests/hf_distributed.py): apply_tfixup before
wrapping gives the same model on every rank; 20 updates under DDP, and under FSDP2 (fully_shard), log the losses of
one process on the doubled batch within 1e-5 (float32: the gradient averaged over two halves sums in another order
than over the whole batch; measured 9.5e-7 on the losses, 1.4e-7 on the weights, torch 2.13); apply_tfixup on the
DDP-wrapped or sharded model is refused in one line."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

from hf_available import require_transformers  # noqa: E402

require_transformers()

BOUND = 1e-5


def test_ddp_and_fsdp2_on_two_processes_equal_one_process_on_the_doubled_batch(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(REPO / "tests" / "hf_distributed.py"), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ranks_same"]
    assert result["ddp_refusal"] == ("apply_tfixup: DistributedDataParallel wraps the model: apply it before "
                                     "wrapping, or pass model.module")
    assert "is sharded by fully_shard: apply it before sharding" in result["fsdp2_refusal"]
    # torchtitan's order: the T-Fixup class built on the meta device, sharded, to_empty, init_weights: T-Fixup's
    # draws on the shards (finite, v_proj's spread), keep_mlp_norm's norms kept. On a CPU mesh DTensor's random ops
    # give every rank the same stream (torch warns so): the ranks' rows repeat; docs/beyond-fairseq.md says so
    assert result["titan_finite"] and result["titan_norms"] == 2
    assert result["titan_v_std_ratio"] == pytest.approx(1, abs=0.15)
    print(f"meta, fully_shard, to_empty, init_weights: v_proj std / T-Fixup's {result['titan_v_std_ratio']:.3f}; "
          f"the ranks' rows differ: {result['titan_shards_differ']}")
    for kind in ("ddp", "fsdp2"):
        assert len(result[kind]) == len(result["single"]) == 20
        gap = max(abs(a - b) for a, b in zip(result[kind], result["single"]))
        weights = result[f"{kind}_max_weight_diff"]
        print(f"{kind}: largest loss difference to one process {gap:.2e}, weights {weights:.2e}")
        assert gap <= BOUND and weights <= BOUND
