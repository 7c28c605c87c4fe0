"""``transformer_dsinit``: the Post-LN Transformer with depth-scaled initialisation
(DS-Init; Zhang, Titov, Sennrich, EMNLP 2019, "Improving Deep Transformer with
Depth-Scaled Initialization and Merged Attention"), the T-Fixup paper's Table 3
baseline (WMT'14 En-De, 12 layers 28.6, 20 layers 28.7).

DS-Init (Zhang et al., §3, Eq. 7) draws every weight matrix W of layer l from
U(-gamma * alpha / sqrt(l), gamma * alpha / sqrt(l)), gamma = sqrt(6 / (d_in + d_out)):
Xavier-uniform with its bound divided by sqrt(l). l counts from 1 within each
stack (encoder and decoder separately) and alpha = 1 in their experiments
(``--ds-init-alpha``). The output of a residual branch then has a variance that
shrinks with depth, which keeps the gradient through Post-LN from vanishing.

Which weights: every linear layer of each Transformer layer, i.e. the q, k, v and
output projections of self-attention (and of encoder attention in the decoder)
and both feed-forward matrices, each with its own fans (the authors' code sets one
initializer on the whole scope of layer l, where self-attention's q, k, v are one
fused d x 3d matrix). Biases start at zero, as in their code. Token embeddings (N(0, d^-1/2),
as in the authors' code), LayerNorms and the output projection keep fairseq's
initialisation. Layer norms stay where Post-LN has them.

Not included: the merged attention (MAtt) that the 28.6/28.7 results of Table 3
also use. Fact from the authors' released code (TF, ``deep_transformer_init``):
it passes gain * l^-1/2 as the *variance* scale of ``variance_scaling_initializer``,
i.e. a bound scaled by l^-1/4; we follow the paper's equation (bound / sqrt(l)).
"""

import logging
import math

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import post_ln_config

logger = logging.getLogger(__name__)


def ds_init_bound(fan_in: int, fan_out: int, layer: int, alpha: float = 1.0) -> float:
    """Zhang et al. (2019), Eq. 7: sqrt(6 / (fan_in + fan_out)) * alpha / sqrt(l), l >= 1."""
    if layer < 1:
        raise ValueError(f"DS-Init counts layers from 1, got {layer}")
    return math.sqrt(6.0 / (fan_in + fan_out)) * alpha / math.sqrt(layer)


@torch.no_grad()
def apply_ds_init_(model: nn.Module, alpha: float) -> None:
    """Redraw every linear layer of every encoder and decoder layer, in place."""
    for stack in (model.encoder, model.decoder):
        for depth, layer in enumerate(stack.layers, start=1):
            for linear in (m for m in layer.modules() if isinstance(m, nn.Linear)):
                bound = ds_init_bound(linear.in_features, linear.out_features, depth, alpha)
                nn.init.uniform_(linear.weight, -bound, bound)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)


@register_model("transformer_dsinit")
class DSInitTransformerModel(TransformerModel):
    """Post-LN Transformer with DS-Init. Takes every ``transformer`` flag, plus ``--ds-init-alpha``."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--ds-init-alpha", type=float, default=1.0, metavar="A",
                            help="alpha in U(+-sqrt(6/(d_in+d_out)) * alpha/sqrt(l)) (Zhang et al. 2019: 1)")

    @classmethod
    def build_model(cls, args, task):
        post_ln_config(args, "transformer_dsinit")
        alpha = getattr(args, "ds_init_alpha", 1.0)
        if not alpha > 0:
            raise ValueError(f"--ds-init-alpha must be > 0, got {alpha}")
        # fairseq builds the model, then (when loading a checkpoint) overwrites every parameter
        model = super().build_model(args, task)
        apply_ds_init_(model, alpha)
        logger.info("DS-Init: linear layers of layer l drawn with Xavier bound * %g / sqrt(l)", alpha)
        return model


register_presets("transformer_dsinit")
