"""``transformer_rezero`` and ``transformer_lm_rezero``: the Transformer without LayerNorm, each sublayer
gated by a learnable scalar that starts at zero: ReZero (Bachlechner, Majumder, Mao, Cottrell, McAuley,
2020, "ReZero is All You Need: Fast Convergence at Large Depth").

    x_{i+1} = x_i + alpha_i * F(x_i),   alpha_i = 0 at initialisation

F is a sublayer (self-attention, encoder-decoder attention or feed-forward network, with its dropout);
each has its own alpha (the layer's ``rezero_alpha``: 2 scalars in an encoder layer, 3 in a decoder layer
with encoder attention, 2 in a language model's). At initialisation every layer is the identity, so each
stack outputs its embeddings (scaled token embedding + positions) unchanged. No LayerNorm anywhere (no
final stack norm, no ``--layernorm-embedding``); everything else keeps fairseq's initialisation.

Reference code: the ``rezero`` package, ``rezero/transformer/rztx.py`` (github.com/majumderb/rezero, commit bfea86b):
``RZTXEncoderLayer``/``RZTXDecoderLayer`` drop the LayerNorms and add ``resweight * sublayer(x)`` after
each sublayer, ``resweight`` zero-initialised, and the stacks have no final norm. There ``resweight`` is
one scalar per layer, shared by its sublayers (the paper: "a single additional learned parameter per
layer"); here each sublayer has its own, the finer gate (the two are the same at initialisation).
fairseq's ``--weight-decay`` applies to the alphas as to every parameter, for every method here.

Warmup: the paper trains its Transformers without it ("we are the first to train Transformers over 100
layers without learning rate warm-up or LayerNorm", §1 of arXiv:2003.04887v1), so its row in
tfixup/methods.py has ``warmup=False`` (inverse_sqrt_nowarmup, T-Fixup's schedule); the convergence
study also runs it with warmup.

fairseq's layers add every residual through ``residual_connection(x, residual)``, in sublayer order;
the layers below override just that (and ``forward``, to start each pass at the first sublayer's alpha),
and ``without_layer_norms`` replaces their LayerNorms by identities and keeps them off fairseq 0.12.2's
fused encoder path (a stock Post-LN kernel). The translation model builds them through its stacks'
``build_*_layer`` hooks; fairseq's language model has no such hook, so ``transformer_lm_rezero``
replaces each layer of the decoder fairseq built by a ReZero decoder layer built and wrapped as that
decoder builds its own (``wrap_layer``).
"""

import logging

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_tfixup.baselines.layers import LayerClassDecoder, LayerClassEncoder, wrap_layer
from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, no_layer_norm_config, without_layer_norms

logger = logging.getLogger(__name__)

REASON = "ReZero replaces normalisation by residual weights that start at zero"


class ReZeroLayer:
    """Mixin for a fairseq Transformer layer: residual + alpha[k] * x at the k-th residual of a pass."""

    def add_rezero_alpha(self, sublayers: int) -> None:
        self.rezero_alpha = nn.Parameter(torch.zeros(sublayers))
        self.sublayer = 0

    def forward(self, *args, **kwargs):
        self.sublayer = 0
        return super().forward(*args, **kwargs)

    def residual_connection(self, x, residual):
        alpha = self.rezero_alpha[self.sublayer]
        self.sublayer += 1
        return residual + alpha * x


class ReZeroEncoderLayer(ReZeroLayer, TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.add_rezero_alpha(2)  # self-attention, feed-forward
        without_layer_norms(self)


class ReZeroDecoderLayer(ReZeroLayer, TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.add_rezero_alpha(decoder_sublayers(self))
        without_layer_norms(self)


def decoder_sublayers(layer) -> int:
    """Self-attention, encoder attention (when the layer has one), feed-forward."""
    return 2 if layer.encoder_attn is None else 3


class ReZeroTransformerEncoder(LayerClassEncoder):
    layer_class = ReZeroEncoderLayer


class ReZeroTransformerDecoder(LayerClassDecoder):
    layer_class = ReZeroDecoderLayer


@register_model("transformer_rezero")
class ReZeroTransformerModel(CustomLayerStacks, TransformerModel):
    """Transformer without LayerNorm, every sublayer gated by a zero-initialised scalar. Takes every
    ``transformer`` flag but those that bring a LayerNorm back."""

    encoder_class = ReZeroTransformerEncoder
    decoder_class = ReZeroTransformerDecoder

    @classmethod
    def build_model(cls, args, task):
        no_layer_norm_config(args, "transformer_rezero", REASON)
        model = super().build_model(args, task)
        logger.info("ReZero: no LayerNorm; x + alpha * F(x) per sublayer, alpha = 0 at initialisation")
        return model


register_presets("transformer_rezero")


def check_lm_config(args, model: str = "transformer_lm_rezero") -> None:
    """Raise a one-line ValueError for a flag that would bring a LayerNorm back into the language model."""
    for key, flag in (("decoder_normalize_before", "--decoder-normalize-before"),
                      ("layernorm_embedding", "--layernorm-embedding")):
        if getattr(args, key, False):
            raise ValueError(f"{model} has no LayerNorm: drop {flag} ({REASON})")


@register_model("transformer_lm_rezero", dataclass=TransformerLanguageModelConfig)
class ReZeroTransformerLanguageModel(TransformerLanguageModel):
    """Decoder-only Transformer LM without LayerNorm, every sublayer gated by a zero-initialised scalar.
    Takes every ``transformer_lm`` flag but those that bring a LayerNorm back."""

    @classmethod
    def build_model(cls, args, task):
        check_lm_config(args)
        model = super().build_model(args, task)
        cfg = TransformerConfig.from_namespace(args)  # what fairseq's LM decoder builds its layers from
        for i in range(len(model.decoder.layers)):
            model.decoder.layers[i] = wrap_layer(ReZeroDecoderLayer(cfg, no_encoder_attn=True), cfg)
        logger.info("ReZero LM: no LayerNorm; %d layers, x + alpha * F(x) per sublayer, alpha = 0 at "
                    "initialisation", len(model.decoder.layers))
        return model
