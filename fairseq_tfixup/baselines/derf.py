"""``transformer_derf`` and ``transformer_lm_derf``: the Pre-LN Transformer with every LayerNorm replaced by a
Dynamic erf (Chen, Lu, Zhu, Sun, Liu, "Stronger Normalization-Free Transformers", arXiv:2512.10938, Dec 2025;
Eq. 10):

    Derf(x) = gamma * erf(alpha * x + s) + beta

alpha and s one learnable scalar each per Derf, initialised to alpha0 = 0.5 and s0 = 0; gamma (``weight``) ones
and beta (``bias``) zeros per channel. It is DyT's form (baselines/dyt.py) with erf for tanh and a learnable
shift inside, and it is built exactly as DyT is: fairseq builds its Pre-LN Transformer, then one walk replaces
every LayerNorm (each sublayer's, each stack's final one, ``--layernorm-embedding``'s) by a Derf of its shape;
everything else keeps fairseq's initialisation; ``--*-normalize-before`` are set by the model; the encoder
layers are kept off fairseq's fused Post-LN kernel; alpha, s, gamma and beta are weight-decayed like every
other parameter (fairseq's ``--weight-decay``). Its paper trains with warmup (the row in tfixup/methods.py
says so; the convergence study also runs it without, as a LayerNorm-free method).

Architectures: ``transformer_derf`` and its size presets (``_iwslt_de_en``, ``_wmt_en_de``,
``_vaswani_wmt_en_de_big``, ``_deep_narrow``); ``transformer_lm_derf`` (task ``language_modeling``, fairseq's
``transformer_lm`` defaults; sizes from flags).
"""

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer_lm import TransformerLanguageModelConfig

from fairseq_tfixup.baselines.dyt import ALPHA0, DyTTransformerLanguageModel, DyTTransformerModel
from fairseq_tfixup.baselines.post_ln import register_presets

SHIFT0 = 0.0  # s0, the paper's initial shift


class Derf(nn.Module):
    """gamma * erf(alpha * x + s) + beta over the last dimension; alpha and s one scalar each, gamma and beta
    per channel."""

    FORMULA = "gamma * erf(alpha * x + s) + beta, alpha0 = %g, s0 = 0"  # the models' log line, with alpha0

    def __init__(self, normalized_shape, alpha0: float = ALPHA0, shift0: float = SHIFT0):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.alpha0, self.shift0 = alpha0, shift0
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.shift = nn.Parameter(torch.full((1,), float(shift0)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias

    def extra_repr(self) -> str:
        return f"normalized_shape={self.normalized_shape}, alpha0={self.alpha0}, s0={self.shift0}"


@register_model("transformer_derf")
class DerfTransformerModel(DyTTransformerModel):
    """Pre-LN Transformer with every LayerNorm replaced by Derf. Takes every ``transformer`` flag."""

    POINTWISE = Derf


register_presets("transformer_derf")


@register_model("transformer_lm_derf", dataclass=TransformerLanguageModelConfig)
class DerfTransformerLanguageModel(DyTTransformerLanguageModel):
    """Pre-LN decoder-only Transformer LM with every LayerNorm replaced by Derf. Takes every ``transformer_lm``
    flag."""

    POINTWISE = Derf
