"""The update bound of T-Fixup §3.2, measured: how far one optimizer step moves a model's output, against depth.

The paper's goal: one SGD step of learning rate eta moves the output f by Theta(eta), whatever the depth. This
is the measurement, for any torch model, in one place; ``tfixup-diagnose update-size`` runs it on fairseq
translation models (``--family fairseq``, fairseq_tfixup/diagnostics/update_size.py and its split by
parameter group, update_decomposition.py) and on plain-PyTorch stacks and HuggingFace models (``--family
torch|hf``, tfixup/update_size_stacks.py). It needs torch only.

A model family is two functions of (model, batch), its adapter:

* ``loss(model, batch)``: the scalar whose gradient is stepped (the mean token loss), or (that scalar, the
  outputs) where one forward gives both (the outputs before the step are then not computed again);
* ``outputs(model, batch)``: each output f as a tensor [rows, features], the rows to average over (e.g. the
  non-padding target tokens).

One step: the gradient of ``loss``, then ``step(params)`` (``sgd(eta)``, ``adam(lr)`` or any function of the
parameters that moves them from their ``.grad``), then ||Delta f||, the root mean square over rows of the L2
norm of f's change; the parameters are restored afterwards. ``sweep`` repeats a measurement over depths and
initialisations and ``loglog_slope`` fits the slope against depth (0: independent of depth).
"""

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

Step = Callable[[List[torch.Tensor]], None]


def trainable(model: nn.Module, biases: bool = True) -> List[torch.Tensor]:
    """The parameters a step moves: every trainable one, or all but the biases (``*bias``: torch's
    ``in_proj_bias`` too)."""
    return [p for name, p in model.named_parameters() if p.requires_grad and (biases or not name.endswith("bias"))]


UNIONS = ("weights", "biases", "all")  # what ``selections`` adds to the groups


def selections(model: nn.Module, group_of: Callable[[str], str]) -> Dict[str, list]:
    """Group name (``group_of(parameter name)``) -> its trainable parameters, then the unions ``weights``
    (all but the biases), ``biases`` and ``all``; groups with no parameter left out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out: Dict[str, list] = {}
    for n, p in named:
        out.setdefault(group_of(n), []).append(p)
    out["weights"] = [p for n, p in named if not n.endswith("bias")]
    out["biases"] = [p for n, p in named if n.endswith("bias")]
    out["all"] = [p for _, p in named]
    return {k: v for k, v in out.items() if v}


def sgd(eta: float) -> Step:
    def step(params):
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-eta)
    return step


def adam(lr: float) -> Step:
    """torch's Adam, betas 0.9/0.98, eps 1e-8: its first step moves every parameter by about lr * sign(g)."""
    def step(params):
        torch.optim.Adam([p for p in params if p.grad is not None], lr=lr, betas=(0.9, 0.98), eps=1e-8).step()
    return step


def rms_change(before: torch.Tensor, after: torch.Tensor) -> float:
    """Root mean square over rows of the L2 norm (last axis) of after - before."""
    return float((after - before).double().pow(2).sum(-1).mean().sqrt())


@torch.no_grad()
def outputs_now(model, batch, outputs) -> Dict[str, torch.Tensor]:
    """``outputs(model, batch)``, without a graph."""
    return {k: v.detach() for k, v in outputs(model, batch).items()}


def gradient(model: nn.Module, batch, loss) -> Optional[dict]:
    """The gradient of ``loss(model, batch)`` into ``.grad`` (cleared first); the outputs, if ``loss`` gave them."""
    model.zero_grad(set_to_none=True)
    value = loss(model, batch)
    value, out = value if isinstance(value, tuple) else (value, None)
    value.backward()
    return None if out is None else {k: v.detach() for k, v in out.items()}


@torch.no_grad()
def step_change(model, batch, outputs, params: list, step: Step, before: Optional[dict] = None) -> Dict[str, float]:
    """{f: ||Delta f||} after ``step(params)`` applied once to the gradients already in ``.grad``; the
    parameters are restored afterwards. ``before``: the outputs before the step, if known."""
    saved = [p.detach().clone() for p in params]
    before = outputs_now(model, batch, outputs) if before is None else before
    step(params)
    after = outputs_now(model, batch, outputs)
    for p, s in zip(params, saved):
        p.copy_(s)
    return {k: rms_change(before[k], after[k]) for k in before}


def one_step(model, batch, loss, outputs, step: Step, params: Optional[list] = None) -> Dict[str, float]:
    """{f: ||Delta f||} after one ``step`` on the gradient of ``loss`` (of ``params``, default every
    trainable parameter); the model is left as it was, its gradients cleared."""
    before = gradient(model, batch, loss)
    change = step_change(model, batch, outputs, trainable(model) if params is None else params, step, before)
    model.zero_grad(set_to_none=True)
    return change


def sweep(depths: Sequence[int], inits: int, seed: int, measure: Callable[[int, int], Dict[str, float]],
          log: Callable[[int, Dict[str, np.ndarray]], None] = None) -> Dict[str, np.ndarray]:
    """{key: array [depth, init]} of ``measure(n, seed + k)`` at each depth n and init k (NaN where a key
    is missing); ``log(n, {key: the inits' values at n})`` after each depth."""
    sizes: Dict[str, np.ndarray] = {}
    for i, n in enumerate(depths):
        for k in range(inits):
            for key, value in measure(n, seed + k).items():
                sizes.setdefault(key, np.full((len(depths), inits), np.nan))[i, k] = value
        if log:
            log(n, {key: a[i] for key, a in sizes.items()})
    return sizes


def loglog_slope(depths: Sequence[int], values: Sequence[float]) -> float:
    d, v = np.asarray(depths, dtype=float), np.asarray(values, dtype=float)
    ok = np.isfinite(v) & (v > 0)
    return float(np.polyfit(np.log(d[ok]), np.log(v[ok]), 1)[0]) if ok.sum() > 1 else float("nan")


# The adapters: (loss, outputs) of each family.

def fairseq_adapter(criterion):
    """A fairseq translation model on a list of batches (fairseq_tfixup.diagnostics.data.fixed_batches): the
    mean token loss of ``criterion``; f = the decoder's logits at every non-padding target token."""
    def loss(model, batches):
        ntokens = sum(int(b["ntokens"]) for b in batches)
        return sum(criterion(model, b)[0] for b in batches) / ntokens

    def outputs(model, batches):
        return {"logits": torch.cat([model(**b["net_input"])[0][b["target"].ne(criterion.padding_idx)]
                                     for b in batches])}
    return loss, outputs


def lm_loss(model, tokens: torch.Tensor):
    """A language model returning (hidden, logits) on a token batch [rows, length + 1]: the mean next-token
    cross-entropy, and ``lm_outputs`` (torch stacks of tfixup/update_size_stacks.py; HuggingFace models through
    ``HFModel``)."""
    out = lm_outputs(model, tokens)
    logits = out["logits"]
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)), out


def lm_outputs(model, tokens: torch.Tensor) -> Dict[str, torch.Tensor]:
    """f = the logits and the stack's last hidden state (the paper's f_d), at every position."""
    h, logits = model(tokens[:, :-1])
    return {"logits": logits, "hidden": h}


class HFModel(nn.Module):
    """A HuggingFace model as ``lm_loss``/``lm_outputs`` read it: (last hidden state, logits)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor):
        out = self.model(input_ids=tokens, output_hidden_states=True)
        return out.hidden_states[-1], out.logits
