"""``transformer_smallinit``: fairseq's Transformer (Post-LN, or Pre-LN with the ``--*-normalize-before``
flags) initialised as HuggingFace ``transformers`` initialises the same model, so that the fairseq studies can
tell the initialisation from the method.

Why: the HuggingFace study's stock Marian (Post-LN, the quality study's recipe) reached 27.8 sacreBLEU where
fairseq's Post-LN reached 14.2; optimizer, loss, batching and beam were the same, the draws were not. This
model is the fairseq side of that cross-initialisation control: fairseq's Post-LN layers, computed as
fairseq computes them, with transformers' draw.

The draw (``MarianPreTrainedModel._init_weights`` with ``MarianConfig.init_std`` = 0.02, the same rule as
BART's and GPT-2's ``initializer_range``):

* every linear weight N(0, 0.02), its bias 0: q, k, v and output projections of every attention, both
  feed-forward matrices, an untied output projection (fairseq: Xavier-uniform, gain 2^-1/2 for q/k/v, nn.Linear's
  uniform biases for q/k/v and the feed-forward layers, and an output projection of std d^-1/2);
* every embedding matrix N(0, 0.02), the padding row 0 (fairseq: N(0, d^-1/2)), so a tied output projection is
  N(0, 0.02) too, where fairseq's is 0.088 at d = 128;
* LayerNorms gain 1, bias 0 (the same in both).

Kept as fairseq builds them, as transformers' Marian does too: the embedding multiplier sqrt(d)
(``scale_embedding=True``; with it the stack's input is 0.02 sqrt(d) per coordinate, 0.23 at d = 128, against
fairseq's 1.0) and the sinusoidal positions, which have no parameters. Nothing depends on depth.

Loading a checkpoint builds first (the same draw) and then overwrites every parameter. Train it like the
Post-LN (or Pre-LN) baseline, with warmup; the convergence study also asks it without.
"""

import logging

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import is_layer_norm, without_fused_encoder_path

logger = logging.getLogger(__name__)

INIT_STD = 0.02  # transformers' MarianConfig.init_std (and BART's init_std, GPT-2's initializer_range)


@torch.no_grad()
def apply_small_init_(model: nn.Module, std: float = INIT_STD) -> None:
    """Redraw every linear layer and embedding matrix of MODEL as transformers does, in place: weights
    N(0, std), biases 0, padding rows 0, LayerNorms 1 and 0."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif is_layer_norm(module) and getattr(module, "weight", None) is not None:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


@register_model("transformer_smallinit")
class SmallInitTransformerModel(TransformerModel):
    """fairseq's Transformer with transformers' initialisation. Takes every ``transformer`` flag (Post-LN by
    default, Pre-LN with ``--encoder-normalize-before --decoder-normalize-before``)."""

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        apply_small_init_(model)
        if getattr(args, "encoder_normalize_before", False):  # fairseq's fused kernel computes Post-LN only
            for layer in model.encoder.layers:
                without_fused_encoder_path(layer)
        logger.info("small init (transformers'): linear weights and embeddings N(0, %g), biases 0; %s", INIT_STD,
                    "Pre-LN" if getattr(args, "encoder_normalize_before", False) else "Post-LN")
        return model


register_presets("transformer_smallinit")
