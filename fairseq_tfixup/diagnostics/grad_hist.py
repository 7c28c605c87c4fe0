"""T-Fixup paper, Fig. 2: log-scale histograms of the encoder input-embedding gradients and Adam updates.

Per training step, the magnitudes |g| of ``encoder.embed_tokens.weight``'s gradient (of the
mean token loss, as fairseq-train computes it) and of its update (parameter after minus
before the optimizer step) are binned by log10. Exact zeros (embedding rows of tokens not
in the batch) have no logarithm and are counted apart, so for every step
``counts.sum() + zeros == numel``. Values outside the bin range go to the edge bins.
"""

import dataclasses
import pathlib
from typing import Callable

import numpy as np
import torch

from tfixup import atomic
from fairseq_tfixup.diagnostics import plots
from fairseq_tfixup.diagnostics.models import ModelSpec
from fairseq_tfixup.diagnostics.train import Recorder, train

PARAM = "encoder.embed_tokens.weight"


def log_histogram(x: torch.Tensor, edges: np.ndarray):
    """(counts over ``edges`` of log10|x| for nonzero x, clipped into range; number of exact zeros)."""
    mag = x.detach().abs().flatten().double()
    nonzero = mag[mag > 0]
    logs = nonzero.log10().clamp(float(edges[0]), float(edges[-1]))
    counts = torch.histc(logs, bins=len(edges) - 1, min=float(edges[0]), max=float(edges[-1]))
    return counts.cpu().numpy().astype(np.int64), int(mag.numel() - nonzero.numel())


def nonzero_median_log10(x: torch.Tensor) -> float:
    mag = x.detach().abs().flatten()
    mag = mag[mag > 0]
    return float(mag.double().log10().median()) if mag.numel() else float("-inf")


class EmbeddingHistograms(Recorder):
    def __init__(self, edges: np.ndarray, param: str = PARAM):
        self.edges, self.param_name = edges, param
        self.grad, self.update, self.grad_zeros, self.update_zeros = [], [], [], []
        self.grad_median, self.update_median = [], []

    def attach(self, model, task):
        params = dict(model.named_parameters())
        if self.param_name not in params:
            raise ValueError(f"model has no parameter {self.param_name}")
        self.param = params[self.param_name]
        self.numel = self.param.numel()

    def after_backward(self, step, model):
        g = self.param.grad if self.param.grad is not None else torch.zeros_like(self.param)
        c, z = log_histogram(g, self.edges)
        self.grad.append(c)
        self.grad_zeros.append(z)
        self.grad_median.append(nonzero_median_log10(g))
        self.before = self.param.detach().clone()

    def after_update(self, step, model):
        delta = self.param.detach() - self.before
        c, z = log_histogram(delta, self.edges)
        self.update.append(c)
        self.update_zeros.append(z)
        self.update_median.append(nonzero_median_log10(delta))


def run_grad_hist(data_bin, out, models=("postln", "tfixup"), schedules=("warmup", "nowarmup"), spec=None,
                  steps: int = 100, warmup_updates: int = 4000, split: str = "train", bins: int = 60,
                  log_range=(-14.0, 1.0), seed: int = 1, device: str = "cpu",
                  log: Callable[[str], None] = print) -> dict:
    """Train each model x schedule for ``steps`` updates; writes grad_hist.{png,npz,json} to ``out``."""
    spec = spec or ModelSpec(dropout=0.1)
    edges = np.linspace(log_range[0], log_range[1], bins + 1)
    out = pathlib.Path(out)
    runs, arrays, summary = {}, {"edges": edges}, {}
    for m in models:
        for sched in schedules:
            name = f"{m}/{sched}"
            log(f"[grad-hist] {name}: {steps} steps")
            rec = EmbeddingHistograms(edges)
            hist = train(data_bin, dataclasses.replace(spec, model=m), sched, steps, [rec],
                         warmup_updates=warmup_updates, split=split, seed=seed, device=device, log=log)
            key = f"{m}_{sched}"
            for field in ("grad", "update", "grad_zeros", "update_zeros", "grad_median", "update_median"):
                arrays[f"{key}_{field}"] = np.asarray(getattr(rec, field))
            arrays[f"{key}_loss"], arrays[f"{key}_lr"] = np.asarray(hist["loss"]), np.asarray(hist["lr"])
            runs[name] = {"grad": arrays[f"{key}_grad"], "update": arrays[f"{key}_update"]}
            summary[name] = {
                "numel": rec.numel, "steps": len(rec.grad),
                "median_log10_grad": {"first": rec.grad_median[0], "step10": rec.grad_median[min(9, len(rec.grad) - 1)],
                                      "last": rec.grad_median[-1]},
                "median_log10_update": {"first": rec.update_median[0], "last": rec.update_median[-1]},
                "loss": {"first": hist["loss"][0], "last": hist["loss"][-1]},
            }
            log(f"[grad-hist] {name}: median log10|grad| {rec.grad_median[0]:.2f} -> {rec.grad_median[-1]:.2f}, "
                f"median log10|update| {rec.update_median[0]:.2f} -> {rec.update_median[-1]:.2f}")
    meta = {"data_bin": str(data_bin), "param": PARAM, "seed": seed, "steps": steps,
            "warmup_updates": warmup_updates, "spec": dataclasses.asdict(spec), "runs": summary}
    title = (f"encoder input-embedding gradients and Adam updates, first {steps} steps "
             f"({spec.encoder_layers}+{spec.decoder_layers} layers, d={spec.dim})")
    atomic.save_npz(out / "grad_hist.npz", arrays)
    atomic.write_json(out / "grad_hist.json", meta)
    atomic.save_figure(out / "grad_hist.png", plots.grad_hist(runs, edges, title))
    log(f"[grad-hist] wrote {out}/grad_hist.{{png,npz,json}}")
    return meta
