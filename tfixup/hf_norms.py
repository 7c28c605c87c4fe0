"""The LayerNorm-free replacements of a norm, element-wise: DyT, ``gamma * tanh(alpha x) + beta`` (Zhu et al.,
CVPR 2025), and Derf, ``gamma * erf(alpha x + s) + beta`` (Dec 2025), and ``pointwise_norms_``, which puts them
in place of every RMSNorm of a HuggingFace Llama-family model (the DyT paper's LLaMA recipe: alpha0 per place, a
learned scalar on the token embedding's output). Needs torch only; transformers' models are read, not imported.

    from tfixup.hf_norms import pointwise_norms_
    pointwise_norms_(model, "dyt", {"attention": 0.8, "mlp": 0.2, "final": 0.2})
"""

import torch
from torch import nn

KINDS = ("dyt", "derf")


class Pointwise(nn.Module):
    """DyT (KIND "dyt") or Derf ("derf") over WIDTH channels: alpha (from ALPHA0) and, for Derf, s (from SHIFT0)
    learned scalars; gamma (ones) and beta (zeros) per channel."""

    def __init__(self, kind: str, width: int, alpha0: float, shift0: float = 0.0):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown element-wise norm {kind!r}: dyt or derf")
        self.kind, self.width, self.alpha0, self.shift0 = kind, width, alpha0, shift0
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.full((1,), float(shift0))) if kind == "derf" else None
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        if self.kind == "dyt":
            return self.weight * torch.tanh(self.alpha * x) + self.bias
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias

    def extra_repr(self):
        return f"{self.kind}, width {self.width}, alpha0 {self.alpha0}" + (
            f", s0 {self.shift0}" if self.kind == "derf" else "")


class LearnedScale:
    """A forward hook: the module's output times its learned scalar ``module.learned_scale``."""

    def __call__(self, module, args, output):
        return output * module.learned_scale


def pointwise_norms_(model: nn.Module, kind: str, alpha0: dict, shift0: float = 0.0) -> int:
    """Every RMSNorm of a Llama-family model replaced by DyT or Derf (KIND) with alpha0[place] (place:
    "attention" for input_layernorm, "mlp" for post_attention_layernorm, "final" for the last norm), and a
    learned scalar on the token embedding's output, initialised to sqrt(d) (the stream's input at the scale an
    RMSNorm's output has, where the element-wise functions need it); in place; how many norms."""
    base = getattr(model, "base_model", None)
    if not all(hasattr(base, a) for a in ("layers", "norm", "embed_tokens")):
        raise ValueError(f"pointwise_norms_: {type(model).__name__} is not laid out as a Llama (base_model.layers, "
                         ".norm, .embed_tokens)")

    def make(norm, place):
        return Pointwise(kind, norm.weight.shape[0], alpha0[place], shift0)

    for layer in base.layers:
        layer.input_layernorm = make(layer.input_layernorm, "attention")
        layer.post_attention_layernorm = make(layer.post_attention_layernorm, "mlp")
    base.norm = make(base.norm, "final")
    base.embed_tokens.learned_scale = nn.Parameter(torch.full((1,), base.embed_tokens.weight.shape[1] ** 0.5))
    base.embed_tokens.register_forward_hook(LearnedScale())
    return 2 * len(base.layers) + 1
