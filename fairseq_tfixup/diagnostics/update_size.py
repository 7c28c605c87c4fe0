"""The update bound of T-Fixup §3.2, measured on fairseq translation models: how much one optimizer step moves
the model's output (``tfixup-diagnose update-size``; the measurement is tfixup/update_size.py's, through its
fairseq adapter).

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
from typing import Callable, Dict

import numpy as np

from tfixup import atomic
from tfixup import update_size as us
from fairseq_tfixup.diagnostics import data, plots
from fairseq_tfixup.diagnostics.models import ModelSpec, build


def one_step(model, criterion, batches, step, biases: bool = True) -> float:
    """||Delta f|| of the logits after ``step(params)`` on the gradient of the mean token loss (every
    parameter, or all but the biases); the model is left as it was (tfixup/update_size.py)."""
    loss, outputs = us.fairseq_adapter(criterion)
    return us.one_step(model, batches, loss, outputs, step, us.trainable(model, biases))["logits"]


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
        def measure(n, s, m=m):
            args, task, model, criterion = build(
                data_bin, dataclasses.replace(spec, model=m, encoder_layers=n, decoder_layers=n), seed=s, device=device)
            model.train()  # dropout is 0 in ``spec``
            batches = data.fixed_batches(task, args, split, n_sentences, device=device)
            return {"sgd": one_step(model, criterion, batches, us.sgd(eta), biases) / eta,
                    "adam": one_step(model, criterion, batches, us.adam(adam_lr), biases)}

        def progress(n, at, m=m):
            log(f"[update-size] {m} N={n}: SGD ||df||/eta {np.nanmean(at['sgd']):.4g}, "
                f"Adam ||df|| {np.nanmean(at['adam']):.4g}")

        swept = us.sweep(depths, inits, seed, measure, progress)
        sizes = np.stack([swept["sgd"], swept["adam"]], axis=-1)  # [depth, init, (sgd / eta, adam)]
        arrays[m] = sizes
        mean = np.nanmean(sizes, axis=1)
        summary[m] = {"sgd_df_over_eta": dict(zip(map(str, depths), mean[:, 0].tolist())),
                      "adam_df": dict(zip(map(str, depths), mean[:, 1].tolist())),
                      "sgd_loglog_slope": us.loglog_slope(depths, mean[:, 0]),
                      "adam_loglog_slope": us.loglog_slope(depths, mean[:, 1])}
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
