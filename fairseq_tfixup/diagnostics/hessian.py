"""Hessian of a fairseq model's loss at initialisation: Hessian-vector products, top eigenvalues, density.

The loss is the mean token cross-entropy over a fixed set of sentence pairs (summed
over batches, divided by the total number of target tokens), so HVPs of different
batches add up exactly to the HVP of the full loss.
"""

import time
from typing import Callable, Dict, List

import numpy as np
import torch

from fairseq_tfixup.diagnostics.lanczos import lanczos, slq_density, tridiag_eig


def batch_loss_sum(model, criterion, sample) -> torch.Tensor:
    """The criterion's summed loss over the batch's target tokens (fairseq convention: loss is a sum)."""
    loss, _sample_size, _log = criterion(model, sample)
    return loss


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflat(vec: torch.Tensor, like) -> List[torch.Tensor]:
    out, i = [], 0
    for p in like:
        out.append(vec[i: i + p.numel()].view_as(p).to(p.dtype))
        i += p.numel()
    return out


def math_attention():
    """Attention through the plain-math SDPA kernel: the fused CPU/flash kernels have no double backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def hvp(loss: torch.Tensor, params, vecs) -> List[torch.Tensor]:
    """H v by double backward: d/dθ (∇L(θ) · v). Build ``loss`` under ``math_attention()``."""
    grads = torch.autograd.grad(loss, params, create_graph=True)
    dot = sum((g * v).sum() for g, v in zip(grads, vecs))
    return list(torch.autograd.grad(dot, params))


def make_matvec(model, criterion, batches) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> H v for the mean token loss over ``batches`` (flat vectors over all trainable parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    ntokens = sum(int(b["ntokens"]) for b in batches)

    def matvec(v: torch.Tensor) -> torch.Tensor:
        vecs = unflat(v, params)
        total = torch.zeros_like(v)
        for b in batches:
            with math_attention():
                    total += flat(hvp(batch_loss_sum(model, criterion, b) / ntokens, params, vecs)).to(v.dtype)
        return total

    return matvec


def mean_loss(model, criterion, batches) -> float:
    ntokens = sum(int(b["ntokens"]) for b in batches)
    with torch.no_grad():
        return sum(batch_loss_sum(model, criterion, b).item() for b in batches) / ntokens


def spectrum(model, criterion, batches, steps: int = 24, probes: int = 2, seed: int = 1,
             log: Callable[[str], None] = print) -> Dict[str, np.ndarray]:
    """SLQ of the loss Hessian: per probe, the Lanczos nodes/weights; eigenvalue extremes from all probes."""
    model.train()  # dropout is set to 0 by the caller; train mode keeps fairseq's training forward path
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    device = params[0].device
    matvec = make_matvec(model, criterion, batches)
    gen = torch.Generator().manual_seed(seed)
    nodes, weights = [], []
    for k in range(probes):
        t0 = time.time()

        def progress(j, k=k, t0=t0):
            if j % 4 == 0 or j == steps:
                log(f"  probe {k + 1}/{probes}: Lanczos step {j}/{steps} ({time.time() - t0:.0f} s)")

        v0 = (torch.randint(0, 2, (n,), generator=gen) * 2 - 1).to(device=device, dtype=torch.float32)
        alpha, beta = lanczos(matvec, n, steps, v0=v0, progress=progress)
        theta, w = tridiag_eig(alpha, beta)
        nodes.append(np.pad(theta, (0, steps - len(theta)), constant_values=theta[-1]))
        weights.append(np.pad(w, (0, steps - len(w))))
    nodes, weights = np.stack(nodes), np.stack(weights)
    return {"nodes": nodes, "weights": weights, "n_params": np.int64(n),
            "loss": np.float64(mean_loss(model, criterion, batches))}


def top_eigenvalues(nodes: np.ndarray, k: int) -> np.ndarray:
    """The k largest Ritz values of the first probe (Lanczos converges first at the extremes)."""
    return np.sort(nodes[0])[::-1][:k]


def density_on_grid(nodes: np.ndarray, weights: np.ndarray, lo: float, hi: float, points: int = 1000,
                    sigma_frac: float = 0.01):
    grid = np.linspace(lo, hi, points)
    sigma = sigma_frac * (hi - lo)
    return grid, slq_density(nodes, weights, grid, sigma)


def run_hessian(data_bin, out, models=("postln", "preln", "tfixup"), spec=None, split: str = "train",
                n_sentences: int = 1000, steps: int = 20, probes: int = 1, top_k: int = 5, seed: int = 1,
                device: str = "cpu", log: Callable[[str], None] = print) -> dict:
    """Hessian spectrum at initialisation of each model; writes hessian.{png,npz,json,md} to ``out``."""
    import dataclasses
    import pathlib

    from tfixup import atomic
    from fairseq_tfixup.diagnostics import data, plots
    from fairseq_tfixup.diagnostics.models import ModelSpec, build

    spec = spec or ModelSpec()
    out = pathlib.Path(out)
    results, arrays = {}, {}
    for m in models:
        s = dataclasses.replace(spec, model=m, dropout=0.0)  # the Hessian of the deterministic loss
        args, task, model, criterion = build(data_bin, s, seed=seed, device=device)
        batches = data.fixed_batches(task, args, split, n_sentences, device=device)
        n_sent = sum(int(b["nsentences"]) for b in batches)
        log(f"[hessian] {m}: {sum(p.numel() for p in model.parameters())} params, {n_sent} sentence pairs, "
            f"{len(batches)} batches; {probes} probe(s) x {steps} Lanczos steps")
        spec_res = spectrum(model, criterion, batches, steps=steps, probes=probes, seed=seed, log=log)
        top = top_eigenvalues(spec_res["nodes"], top_k)
        results[m] = {"top_eigenvalues": top.tolist(), "min_ritz_value": float(spec_res["nodes"][0].min()),
                      "loss": float(spec_res["loss"]), "n_params": int(spec_res["n_params"]),
                      "sentence_pairs": n_sent}
        log(f"[hessian] {m}: loss {float(spec_res['loss']):.3f}, top eigenvalues {np.round(top, 4).tolist()}")
        for k in ("nodes", "weights"):
            arrays[f"{m}_{k}"] = spec_res[k]
    lo = min(arrays[f"{m}_nodes"].min() for m in models)
    hi = max(arrays[f"{m}_nodes"].max() for m in models)
    pad = 0.05 * (hi - lo)
    curves = {m: density_on_grid(arrays[f"{m}_nodes"], arrays[f"{m}_weights"], lo - pad, hi + pad) for m in models}
    for m, (grid, dens) in curves.items():
        arrays[f"{m}_grid"], arrays[f"{m}_density"] = grid, dens
    meta = {"data_bin": str(data_bin), "split": split, "seed": seed, "steps": steps, "probes": probes,
            "spec": dataclasses.asdict(spec), "models": results}
    title = (f"Hessian spectrum at init: {spec.encoder_layers}+{spec.decoder_layers} layers, d={spec.dim}, "
             f"{results[models[0]]['sentence_pairs']} sentence pairs")
    atomic.save_npz(out / "hessian.npz", arrays)
    atomic.write_json(out / "hessian.json", meta)
    atomic.write_text(out / "hessian.md", eigen_table(results, top_k))
    atomic.save_figure(out / "hessian.png", plots.hessian_density(curves, {m: results[m]["top_eigenvalues"]
                                                                         for m in models}, title))
    log(f"[hessian] wrote {out}/hessian.{{png,npz,json,md}}")
    return meta


def eigen_table(results: dict, top_k: int) -> str:
    """Markdown table: model, loss, top-k eigenvalues, smallest Ritz value."""
    head = "| model | loss at init | " + " | ".join(f"λ{i + 1}" for i in range(top_k)) + " | λmin (Ritz) |\n"
    head += "|---" * (top_k + 3) + "|\n"
    rows = ""
    for m, r in results.items():
        eig = " | ".join(f"{v:.4g}" for v in r["top_eigenvalues"])
        rows += f"| {m} | {r['loss']:.3f} | {eig} | {r['min_ritz_value']:.4g} |\n"
    return head + rows
