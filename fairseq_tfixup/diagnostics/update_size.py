"""The update bound of T-Fixup §3.2, measured: how much one optimizer step moves the model's output.

The paper's GOAL: f is updated by Theta(eta) per SGD step, ||Delta f|| = Theta(eta), independent of depth.
For each method and depth N (layers per side), at initialisation, on a fixed set of real sentence pairs
(dropout 0):

* f: the decoder's output logits (before the softmax) at every target position;
* the gradient of the mean token loss (fairseq's criterion), then one step of
  - SGD with learning rate ``eta`` (small: the paper's bound is a first-order statement as eta -> 0), and
  - Adam (torch's, betas 0.9/0.98, eps 1e-8) with learning rate ``adam_lr``: its first step moves every
    parameter by about lr * sign(g), the early update whose size the paper blames for the instability;
* ||Delta f||: the root mean square over target tokens of the L2 norm of the change of the logit vector.

Reported per method: ||Delta f|| / eta against depth (log-log) and the fitted slope (0: independent of
depth, the paper's goal). Averaged over ``inits`` random initialisations.
"""

import dataclasses
import pathlib
from typing import Callable, Dict, Sequence

import numpy as np
import torch

from tfixup import atomic
from fairseq_tfixup.diagnostics import data, plots
from fairseq_tfixup.diagnostics.grad_norms import mean_loss_gradient
from fairseq_tfixup.diagnostics.models import ModelSpec, build


def logits(model, batches) -> list:
    return [model(**b["net_input"])[0].detach() for b in batches]


def rms_change(before: list, after: list, batches) -> float:
    """RMS over non-padding target tokens of ||logits_after - logits_before||_2."""
    total, count = 0.0, 0
    for b0, b1, b in zip(before, after, batches):
        mask = b["target"].ne(1)  # fairseq's padding index
        total += float((b1 - b0).double().pow(2).sum(-1)[mask].sum())
        count += int(mask.sum())
    return (total / count) ** 0.5


@torch.no_grad()
def step_change(model, batches, params: list, step: Callable[[list], None], before=None) -> float:
    """||Delta f|| after ``step(params)`` applied once to the gradients already in ``.grad``; the
    parameters are restored afterwards. ``before``: the logits before the step, if known."""
    saved = [p.detach().clone() for p in params]
    before = logits(model, batches) if before is None else before
    step(params)
    change = rms_change(before, logits(model, batches), batches)
    for p, s in zip(params, saved):
        p.copy_(s)
    return change


def one_step(model, criterion, batches, step: Callable[[list], None], biases: bool = True) -> float:
    """||Delta f|| after ``step(params)`` applied once to the gradient of the mean token loss (every
    parameter, or all but the biases); the model is restored afterwards."""
    params = [p for name, p in model.named_parameters() if p.requires_grad and (biases or not name.endswith(".bias"))]
    mean_loss_gradient(model, criterion, batches)
    return step_change(model, batches, params, step)


def sgd(eta: float):
    def step(params):
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-eta)
    return step


def adam(lr: float):
    def step(params):
        opt = torch.optim.Adam([p for p in params if p.grad is not None], lr=lr, betas=(0.9, 0.98), eps=1e-8)
        opt.step()
    return step


def loglog_slope(depths: Sequence[int], values: Sequence[float]) -> float:
    d, v = np.asarray(depths, dtype=float), np.asarray(values, dtype=float)
    ok = np.isfinite(v) & (v > 0)
    return float(np.polyfit(np.log(d[ok]), np.log(v[ok]), 1)[0]) if ok.sum() > 1 else float("nan")


def run_update_size(data_bin, out, models=("tfixup", "postln", "preln", "noln"), spec=None,
                    depths=(1, 2, 4, 8, 16, 32, 64, 128, 200), eta: float = 1e-4, adam_lr: float = 5e-4,
                    split: str = "valid", n_sentences: int = 64, inits: int = 2, seed: int = 1,
                    biases: bool = True, device: str = "cpu", log: Callable[[str], None] = print) -> dict:
    """Writes update_size.{png,npz,json} to ``out``. ``biases=False``: the step leaves every bias as it
    is (the zero-initialised, unscaled branch biases move the residual stream once per block)."""
    spec = dataclasses.replace(spec or ModelSpec(), dropout=0.0)
    out = pathlib.Path(out)
    arrays: Dict[str, np.ndarray] = {"depths": np.asarray(depths)}
    summary = {}
    for m in models:
        sizes = np.full((len(depths), inits, 2), np.nan)  # [depth, init, (sgd / eta, adam)]
        for i, n in enumerate(depths):
            for k in range(inits):
                args, task, model, criterion = build(
                    data_bin, dataclasses.replace(spec, model=m, encoder_layers=n, decoder_layers=n),
                    seed=seed + k, device=device)
                model.train()  # dropout is 0 in ``spec``
                batches = data.fixed_batches(task, args, split, n_sentences, device=device)
                sizes[i, k, 0] = one_step(model, criterion, batches, sgd(eta), biases) / eta
                sizes[i, k, 1] = one_step(model, criterion, batches, adam(adam_lr), biases)
            log(f"[update-size] {m} N={n}: SGD ||df||/eta {np.nanmean(sizes[i, :, 0]):.4g}, "
                f"Adam ||df|| {np.nanmean(sizes[i, :, 1]):.4g}")
        arrays[m] = sizes
        mean = np.nanmean(sizes, axis=1)
        summary[m] = {"sgd_df_over_eta": dict(zip(map(str, depths), mean[:, 0].tolist())),
                      "adam_df": dict(zip(map(str, depths), mean[:, 1].tolist())),
                      "sgd_loglog_slope": loglog_slope(depths, mean[:, 0]),
                      "adam_loglog_slope": loglog_slope(depths, mean[:, 1])}
        log(f"[update-size] {m}: log-log slope vs depth: SGD {summary[m]['sgd_loglog_slope']:.3f}, "
            f"Adam {summary[m]['adam_loglog_slope']:.3f} (0: independent of depth)")
    meta = {"data_bin": str(data_bin), "split": split, "sentences": n_sentences, "inits": inits, "seed": seed,
            "eta": eta, "adam_lr": adam_lr, "biases_stepped": biases, "depths": list(depths), "spec": dataclasses.asdict(spec),
            "models": summary}
    title = (f"one update at initialisation, d={spec.dim}: output change vs layers per side "
             f"({n_sentences} pairs of {split}, mean over {inits} inits{'' if biases else '; biases not stepped'})")
    atomic.save_npz(out / "update_size.npz", arrays)
    atomic.write_json(out / "update_size.json", meta)
    curves = {m: np.nanmean(arrays[m], axis=1) for m in models}
    atomic.save_figure(out / "update_size.png", plots.update_size(list(depths), curves, summary, eta, adam_lr, title))
    log(f"[update-size] wrote {out}/update_size.{{png,npz,json}}")
    return meta
