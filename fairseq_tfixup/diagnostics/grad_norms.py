"""Xiong et al. (2020), Fig. 3: gradient norms at initialisation.

* Per layer: the norm of the gradient of all of a layer's parameters, for every encoder
  and decoder layer (plus embeddings, final LayerNorms and the output projection).
* Depth sweep: the norm of the gradient of the last decoder layer's second FFN weight
  (``decoder.layers[L-1].fc2.weight``, the paper's W^{2,L}) as L grows (encoder = decoder
  = L layers). Their theory: Post-LN's does not shrink with L; Pre-LN's shrinks like 1/sqrt(L).

The loss is the mean token loss over a fixed set of sentence pairs (dropout off), the
gradient is averaged over ``inits`` random initialisations (seeds seed, seed+1, ...).
"""

import dataclasses
import pathlib
import re
import time
from collections import OrderedDict
from typing import Callable, Dict, List

import numpy as np

from tfixup import atomic
from fairseq_tfixup.diagnostics import data, plots
from fairseq_tfixup.diagnostics.models import ModelSpec, build


def layer_group(name: str) -> str:
    """Short name of the layer a parameter belongs to, e.g. 'enc3', 'dec.emb', 'dec.out'."""
    m = re.match(r"(encoder|decoder)\.layers\.(\d+)\.", name)
    side = "enc" if name.startswith("encoder") else "dec"
    if m:
        return f"{side}{int(m.group(2)) + 1}"
    if ".embed_" in name or ".layernorm_embedding" in name:
        return f"{side}.emb"
    if "output_projection" in name:
        return "dec.out"
    return f"{side}.ln"  # the final LayerNorm of Pre-LN


def mean_loss_gradient(model, criterion, batches) -> None:
    """The gradient of the mean token loss over ``batches`` (fairseq's criterion), into ``.grad``."""
    model.zero_grad(set_to_none=True)
    ntokens = sum(int(b["ntokens"]) for b in batches)
    for b in batches:
        loss, _, _ = criterion(model, b)
        (loss / ntokens).backward()


def group_norms(model) -> Dict[str, float]:
    sq = OrderedDict()
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = layer_group(name)
            sq[g] = sq.get(g, 0.0) + float(p.grad.double().pow(2).sum())
    return OrderedDict((g, sq[g] ** 0.5) for g in sorted(sq, key=group_order))


def group_order(g: str):
    """Input to output: encoder embeddings, layers, final LN; then the same for the decoder, then its output."""
    return (g.startswith("dec"), not g.endswith(".emb"), g.endswith((".ln", ".out")), g.endswith(".out"),
            int(re.sub(r"\D", "", g) or 0))


class Progress:
    """'[grad-norms] gradient I of N (WHAT): M min so far, about R min left at that rate' after each step."""

    def __init__(self, total: int, log: Callable[[str], None]):
        self.total, self.done, self.log, self.started = total, 0, log, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        took = time.monotonic() - self.started
        left = took / self.done * (self.total - self.done)
        self.log(f"[grad-norms] gradient {self.done} of {self.total} ({what}): {took / 60:.1f} min so far, "
                 f"about {left / 60:.1f} min left at that rate")


def grads_at_init(data_bin, spec: ModelSpec, seed: int, split: str, n_sentences: int, device: str):
    args, task, model, criterion = build(data_bin, spec, seed=seed, device=device)
    model.train()  # dropout is 0 in ``spec``
    batches = data.fixed_batches(task, args, split, n_sentences, device=device)
    mean_loss_gradient(model, criterion, batches)
    return model


def run_grad_norms(data_bin, out, models=("postln", "preln", "tfixup"), spec=None, depths=(2, 4, 6, 8, 12),
                   split: str = "valid", n_sentences: int = 500, inits: int = 3, seed: int = 1,
                   device: str = "cpu", log: Callable[[str], None] = print) -> dict:
    """Writes grad_norms.{png,npz,json} to ``out``, each whole, at the end (a stopped run leaves none of them);
    a progress line after every gradient, with the time so far and what is left at that rate."""
    spec = dataclasses.replace(spec or ModelSpec(), dropout=0.0)
    out = pathlib.Path(out)
    per_layer, arrays = {}, {"depths": np.asarray(depths)}
    last_fc2: Dict[str, List[float]] = {}
    summary = {}
    progress = Progress(len(models) * inits * (1 + len(depths)), log)
    log(f"[grad-norms] {progress.total} gradients at initialisation ({len(models)} models x {inits} inits x "
        f"({spec.encoder_layers}+{spec.decoder_layers} layers and depths {','.join(map(str, depths))})), "
        f"{n_sentences} sentence pairs of {split} each; the files are written at the end")
    for m in models:
        rows, names = [], None
        for k in range(inits):
            model = grads_at_init(data_bin, dataclasses.replace(spec, model=m), seed + k, split, n_sentences, device)
            progress.step(f"{m} {spec.encoder_layers}+{spec.decoder_layers} layers, init {k + 1} of {inits}")
            norms = group_norms(model)
            names = names or list(norms)
            rows.append([norms[g] for g in names])
        per_layer[m] = OrderedDict(zip(names, np.mean(rows, axis=0).tolist()))
        arrays[f"{m}_per_layer"], arrays[f"{m}_layer_names"] = np.asarray(rows), np.asarray(names)
        log(f"[grad-norms] {m} {spec.encoder_layers}+{spec.decoder_layers} layers: "
            + " ".join(f"{g}={v:.3g}" for g, v in per_layer[m].items()))
        sweep = []
        for L in depths:
            vals = []
            for k in range(inits):
                s = dataclasses.replace(spec, model=m, encoder_layers=L, decoder_layers=L)
                model = grads_at_init(data_bin, s, seed + k, split, n_sentences, device)
                progress.step(f"{m} {L}+{L} layers, init {k + 1} of {inits}")
                vals.append([float(model.decoder.layers[L - 1].fc2.weight.grad.norm()),
                             float(model.encoder.layers[L - 1].fc2.weight.grad.norm())])
            sweep.append(vals)
            log(f"[grad-norms] {m} L={L}: |grad W2,L| decoder {np.mean([v[0] for v in vals]):.4g} "
                f"encoder {np.mean([v[1] for v in vals]):.4g}")
        sweep = np.asarray(sweep)  # (depths, inits, [decoder, encoder])
        arrays[f"{m}_last_fc2"] = sweep
        last_fc2[m] = sweep[:, :, 0].mean(axis=1).tolist()
        d = np.asarray(depths, dtype=float)
        slope = float(np.polyfit(np.log(d), np.log(last_fc2[m]), 1)[0]) if len(depths) > 1 else float("nan")
        summary[m] = {"per_layer": dict(per_layer[m]),
                      "last_decoder_fc2_vs_depth": dict(zip(map(str, depths), last_fc2[m])),
                      "last_encoder_fc2_vs_depth": dict(zip(map(str, depths), sweep[:, :, 1].mean(axis=1).tolist())),
                      "loglog_slope_decoder": slope}
        log(f"[grad-norms] {m}: log-log slope of |grad W2,L| vs L = {slope:.3f} (1/sqrt(L) is -0.5)")
    names = sorted({g for norms in per_layer.values() for g in norms}, key=group_order)
    meta = {"data_bin": str(data_bin), "split": split, "sentences": n_sentences, "inits": inits, "seed": seed,
            "depths": list(depths), "spec": dataclasses.asdict(spec), "models": summary}
    title = (f"gradients at initialisation (d={spec.dim}, {n_sentences} sentence pairs of {split}, "
             f"mean over {inits} inits)")
    atomic.save_npz(out / "grad_norms.npz", arrays)
    atomic.write_json(out / "grad_norms.json", meta)
    table = {m: [v.get(g, np.nan) for g in names] for m, v in per_layer.items()}
    atomic.save_figure(out / "grad_norms.png", plots.grad_norms(table, names, list(depths), last_fc2, title))
    log(f"[grad-norms] wrote {out}/grad_norms.{{png,npz,json}}")
    return meta
