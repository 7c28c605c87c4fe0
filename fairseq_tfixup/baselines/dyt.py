"""``transformer_dyt`` and ``transformer_lm_dyt``: the Pre-LN Transformer with every LayerNorm replaced by
a Dynamic Tanh (Zhu, Chen, He, LeCun, Liu, 2025, "Transformers without Normalization", CVPR 2025).

    DyT(x) = gamma * tanh(alpha * x) + beta

alpha is one learnable scalar per DyT, initialised to alpha0 = 0.5 (the paper's default outside LLMs);
gamma (``weight``) ones and beta (``bias``) zeros per channel, so that a DyT has the parameters of the
LayerNorm it replaces plus alpha. Everything else keeps fairseq's initialisation. The layout is the
paper's, Pre-LN: each sublayer computes x + G(DyT(x)), and the final LayerNorm of each stack (fairseq's
``encoder.layer_norm``/``decoder.layer_norm``, built for Pre-LN) becomes a DyT too. Its paper trains with
warmup (the row in tfixup/methods.py says so; the convergence study also runs it without).

Reference code: the DyT repository, ``dynamic_tanh.py`` (github.com/jiachenzhu/DyT, commit aab5dde):
``DynamicTanh`` (the formula above, ``alpha_init_value=0.5``) and ``convert_ln_to_dyt``, which walks a
built model and replaces every ``nn.LayerNorm`` module by a DynamicTanh of its shape. This module does the
same, once, in ``build_model``, on the model fairseq built: one walk covers every LayerNorm wherever
fairseq puts it (the layers' ``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``,
the stacks' ``layer_norm``, ``--layernorm-embedding``, NormFormer's ``--scale-attn``/``--scale-fc``
norms), with no copy of fairseq's layers. Loading a checkpoint builds first (the same walk) and then
overwrites every parameter, alpha included.

* ``build_model`` sets ``--encoder-normalize-before``/``--decoder-normalize-before``: DyT is defined on the
  Pre-LN Transformer, and no flag can turn those off (fairseq's ``base_lm_architecture`` forces the same
  for its language models).
* fairseq 0.12.2's encoder layers switch to a fused Post-LN kernel in eval mode after a state dict is
  loaded (``without_fused_encoder_path``); that kernel would apply LayerNorm with DyT's gamma and beta,
  so every encoder layer is kept off it.
* Weight decay: the reference's optimizer (timm's parameter groups) exempts 1-D parameters (alpha, gamma,
  beta, biases) from weight decay; fairseq applies ``--weight-decay`` to every parameter alike, for every
  method of this project (LayerNorm's gamma and beta included), and so does this module: alpha, gamma and
  beta are decayed like every other parameter.

Architectures: ``transformer_dyt`` and its size presets (``_iwslt_de_en``, ``_wmt_en_de``,
``_vaswani_wmt_en_de_big``, ``_deep_narrow``) for translation; ``transformer_lm_dyt`` (task
``language_modeling``, fairseq's ``transformer_lm`` defaults; sizes from flags) for the decoder-only LM.
"""

import logging

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import is_layer_norm, without_fused_encoder_path

logger = logging.getLogger(__name__)

ALPHA0 = 0.5  # the paper's default alpha0 outside LLMs, and the reference code's alpha_init_value


class DyT(nn.Module):
    """gamma * tanh(alpha * x) + beta over the last dimension; alpha one scalar, gamma and beta per channel."""

    FORMULA = "gamma * tanh(alpha * x) + beta, alpha0 = %g"  # the models' log line, with alpha0

    def __init__(self, normalized_shape, alpha0: float = ALPHA0):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.alpha0 = alpha0
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"normalized_shape={self.normalized_shape}, alpha0={self.alpha0}"


def layer_norms_to_dyt_(module: nn.Module, make=DyT) -> int:
    """Replace every LayerNorm module under MODULE by a DyT of its shape (or ``make(shape)``: Derf,
    baselines/derf.py), in place, and keep every layer that has fairseq's fused encoder path off it; returns
    how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        if is_layer_norm(child):
            setattr(module, name, make(child.normalized_shape))
            replaced += 1
        else:
            replaced += layer_norms_to_dyt_(child, make)
    without_fused_encoder_path(module)
    return replaced


def set_pre_ln(args, sides) -> None:
    """DyT's layout is Pre-LN: set it before fairseq reads the config (no flag turns it off)."""
    for side in sides:
        setattr(args, f"{side}_normalize_before", True)


@register_model("transformer_dyt")
class DyTTransformerModel(TransformerModel):
    """Pre-LN Transformer with every LayerNorm replaced by DyT. Takes every ``transformer`` flag."""

    POINTWISE = DyT  # the module that replaces each LayerNorm (a subclass may give another: Derf)

    @classmethod
    def build_model(cls, args, task):
        set_pre_ln(args, ("encoder", "decoder"))
        model = super().build_model(args, task)
        n = layer_norms_to_dyt_(model, cls.POINTWISE)
        logger.info("%s: Pre-LN; %d LayerNorms replaced by " + cls.POINTWISE.FORMULA, cls.POINTWISE.__name__, n,
                    ALPHA0)
        return model


register_presets("transformer_dyt")


@register_model("transformer_lm_dyt", dataclass=TransformerLanguageModelConfig)
class DyTTransformerLanguageModel(TransformerLanguageModel):
    """Pre-LN decoder-only Transformer LM with every LayerNorm replaced by DyT. Takes every
    ``transformer_lm`` flag."""

    POINTWISE = DyT

    @classmethod
    def build_model(cls, args, task):
        set_pre_ln(args, ("decoder",))
        model = super().build_model(args, task)
        n = layer_norms_to_dyt_(model, cls.POINTWISE)
        logger.info("%s LM: Pre-LN; %d LayerNorms replaced by " + cls.POINTWISE.FORMULA, cls.POINTWISE.__name__,
                    n, ALPHA0)
        return model
