"""T-Fixup paper, Fig. 3a/b: mean L2 norm of the input to the LayerNorm after self-attention, per decoder layer.

The hook point is the residual stream right after the self-attention residual add:
* Post-LN: the input of ``self_attn_layer_norm`` (exactly the paper's quantity);
* T-Fixup: the same module, an ``nn.Identity`` there, so it sees the un-normalised residual stream;
* Pre-LN: ``self_attn_layer_norm`` normalises *before* attention, so the same point
  (x + SelfAttn(LN(x))) is the input of the next LayerNorm, ``encoder_attn_layer_norm``.
The norm is averaged over the non-padding target positions of the batch.
"""

import dataclasses
import pathlib
from typing import Callable

import numpy as np

from tfixup import atomic
from fairseq_tfixup.diagnostics import plots
from fairseq_tfixup.diagnostics.models import ModelSpec
from fairseq_tfixup.diagnostics.train import Recorder, train


def hook_module(layer):
    """The module whose input is the residual stream after the layer's self-attention block."""
    if getattr(layer, "normalize_before", False):
        if getattr(layer, "encoder_attn_layer_norm", None) is None:
            raise ValueError("Pre-LN decoder layer without encoder attention: no LayerNorm after self-attention")
        return layer.encoder_attn_layer_norm
    return layer.self_attn_layer_norm


class DecoderLNInputNorms(Recorder):
    def __init__(self):
        self.norms = []  # [step][layer]
        self.handles = []

    def attach(self, model, task):
        self.pad = task.target_dictionary.pad()
        self.current = {}
        for i, layer in enumerate(model.decoder.layers):
            self.handles.append(hook_module(layer).register_forward_pre_hook(self._hook(i)))

    def _hook(self, i):
        def hook(module, inputs):
            x = inputs[0].detach()  # (T, B, C)
            norms = x.norm(dim=-1)  # (T, B)
            self.current[i] = float(norms[self.mask].mean())
        return hook

    def before_forward(self, step, sample):
        self.mask = sample["net_input"]["prev_output_tokens"].ne(self.pad).t()  # (T, B)
        self.current = {}

    def after_backward(self, step, model):
        self.norms.append([self.current[i] for i in range(len(self.current))])

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def run_ln_norms(data_bin, out, models=("postln", "tfixup"), schedules=("warmup", "nowarmup"), spec=None,
                 steps: int = 100, warmup_updates: int = 4000, split: str = "train", seed: int = 1,
                 device: str = "cpu", log: Callable[[str], None] = print) -> dict:
    """Train each model x schedule; writes ln_norms.{png,npz,json} to ``out``."""
    spec = spec or ModelSpec(dropout=0.1)
    out = pathlib.Path(out)
    runs, arrays, summary = {}, {}, {}
    for m in models:
        for sched in schedules:
            name = f"{m}/{sched}"
            log(f"[ln-norms] {name}: {steps} steps")
            rec = DecoderLNInputNorms()
            hist = train(data_bin, dataclasses.replace(spec, model=m), sched, steps, [rec],
                         warmup_updates=warmup_updates, split=split, seed=seed, device=device, log=log)
            norms = np.asarray(rec.norms)
            runs[name] = norms
            key = f"{m}_{sched}"
            arrays[f"{key}_norms"], arrays[f"{key}_loss"] = norms, np.asarray(hist["loss"])
            summary[name] = {"first_step": norms[0].tolist(), "last_step": norms[-1].tolist(),
                             "growth_last_over_first": (norms[-1] / norms[0]).tolist()}
            log(f"[ln-norms] {name}: per-layer norm step 1 {np.round(norms[0], 1).tolist()} -> "
                f"step {len(norms)} {np.round(norms[-1], 1).tolist()}")
    meta = {"data_bin": str(data_bin), "seed": seed, "steps": steps, "warmup_updates": warmup_updates,
            "spec": dataclasses.asdict(spec), "sqrt_d": float(np.sqrt(spec.dim)), "runs": summary}
    title = (f"mean L2 norm of the decoder's LN input after self-attention "
             f"({spec.decoder_layers} decoder layers, d={spec.dim})")
    atomic.save_npz(out / "ln_norms.npz", arrays)
    atomic.write_json(out / "ln_norms.json", meta)
    atomic.save_figure(out / "ln_norms.png", plots.ln_norms(runs, spec.dim, title))
    log(f"[ln-norms] wrote {out}/ln_norms.{{png,npz,json}}")
    return meta
