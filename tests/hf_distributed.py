"""A T-Fixup Llama (keep_mlp_norm) trained on 2 CPU processes (gloo), run by tests/test_hf_distributed.py as

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/hf_distributed.py OUT.json

Each rank builds the model from the same seed and calls apply_tfixup before wrapping; the ranks' models are
compared (weights, layout, record, input multiplier). Then 20 updates of Adam under DDP, each rank on its half of a
batch, and 20 updates under FSDP2 (fully_shard per layer and on the model); the T-Fixup class is built in
torchtitan's order (meta device, fully_shard, to_empty, init_weights); rank 0 also trains the same model in one
process on the whole batch. Rank 0 writes the losses, the largest weight differences and the sharded draw's
checks to OUT.json."""

import hashlib
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tfixup import apply_tfixup, atomic, tfixup_init

VOCAB, BATCH, LENGTH, UPDATES = 100, 4, 12, 20  # BATCH rows per rank; one process takes 2 x BATCH


def build():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB))
    apply_tfixup(model, keep_mlp_norm=True)  # before wrapping, on every rank
    return model


def fingerprint(model) -> dict:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
    return {"weights": digest.hexdigest(), "layout": [(n, type(m).__name__) for n, m in model.named_modules()],
            "record": model.config.tfixup, "input_scale": model.model.embed_tokens.tfixup_input_scale}


def train(model, rows, distributed: bool) -> list:
    """UPDATES updates of Adam on ROWS[k] (the k-th batch); each update's loss, averaged over the ranks when
    DISTRIBUTED (each rank's mean over an equal share of rows: the mean over the whole batch)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    losses = []
    for batch in rows:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss = loss.detach()
        if distributed:
            dist.all_reduce(loss)
            loss /= dist.get_world_size()
        losses.append(loss.item())
    return losses


def full_state(model) -> dict:
    """The model's weights as whole tensors (an FSDP2 model's DTensors gathered)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def main(out: str):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    data = torch.randint(3, VOCAB, (UPDATES, world * BATCH, LENGTH))  # the same on every rank
    mine = data[:, rank * BATCH:(rank + 1) * BATCH]
    result = {}

    model = build()
    prints = [None] * world
    dist.all_gather_object(prints, fingerprint(model))
    result["ranks_same"] = all(p == prints[0] for p in prints)
    ddp = DistributedDataParallel(model)
    try:
        apply_tfixup(ddp)
    except ValueError as e:
        result["ddp_refusal"] = str(e)
    result["ddp"] = train(ddp, mine, distributed=True)
    ddp_state = full_state(model)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sharded = build()
    mesh = init_device_mesh("cpu", (world,))
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    try:
        apply_tfixup(sharded)
    except ValueError as e:
        result["fsdp2_refusal"] = str(e)
    result["fsdp2"] = train(sharded, mine, distributed=True)
    fsdp2_state = full_state(sharded)

    # torchtitan's order: the T-Fixup class on the meta device, sharded, materialised, then initialised
    with torch.device("meta"):
        titan = AutoModelForCausalLM.from_config(sharded.config)
    for layer in titan.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(titan, mesh=mesh)
    titan.to_empty(device="cpu")
    titan.init_weights()
    titan_state = full_state(titan)
    v = titan_state["model.layers.0.self_attn.v_proj.weight"]
    result["titan_finite"] = all(bool(torch.isfinite(t).all()) for t in titan_state.values())
    result["titan_v_std_ratio"] = float(v.std()) / (tfixup_init.xavier_uniform_std(*v.shape)
                                                    * tfixup_init.single_stack_scale(2))
    result["titan_norms"] = sum("Norm" in type(m).__name__ for m in titan.modules())
    half = v.shape[0] // 2
    result["titan_shards_differ"] = not torch.equal(v[:half], v[half:])  # each rank drew its own rows

    if rank == 0:
        single = build()
        result["single"] = train(single, data, distributed=False)
        single_state = single.state_dict()
        for name, state in (("ddp", ddp_state), ("fsdp2", fsdp2_state)):
            result[f"{name}_max_weight_diff"] = max((state[k] - single_state[k]).abs().max().item()
                                                    for k in single_state)
        atomic.write_json(out, result)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
