"""``transformer_deepnorm``: the Post-LN Transformer with DeepNorm (Wang et al., 2022,
"DeepNet: Scaling Transformers to 1,000 Layers", §2.3, Figure 2).

Each sublayer computes LN(alpha * x + G(x)) instead of Post-LN's LN(x + G(x)), and
v_proj, out_proj, fc1, fc2 start Xavier-normal with gain beta (q_proj, k_proj with
gain 1); alpha and beta for N encoder and M decoder layers are the pure functions
of ``fairseq_tfixup.baselines.deepnorm_init``. Everything else (embeddings,
biases, LayerNorms, output projection) keeps fairseq's initialisation.

fairseq 0.12 has no DeepNorm of its own: ``--scale-resids`` is a learnable
per-channel weight (initialised to 1) on the decoder's feed-forward residual only.
Its layers, however, add every residual through one method,
``residual_connection(x, residual)``; the layers below override just that, and the
encoder/decoder build them through their ``build_*_layer`` hooks. alpha is
computed from the layer counts when the model is built, so a checkpoint needs no
extra state. ``build_model`` draws the initialisation once, on fresh weights;
loading a checkpoint then overwrites every parameter.
"""

import logging

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_tfixup.baselines import deepnorm_init
from fairseq_tfixup.baselines.layers import LayerClassDecoder, LayerClassEncoder
from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, post_ln_config, without_fused_encoder_path

logger = logging.getLogger(__name__)


class DeepNormEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.alpha = deepnorm_init.encoder_alpha(cfg.encoder.layers, cfg.decoder.layers)
        without_fused_encoder_path(self)  # that kernel adds the residual itself, unscaled

    def residual_connection(self, x, residual):
        return residual * self.alpha + x


class DeepNormDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        self.alpha = deepnorm_init.decoder_alpha(cfg.decoder.layers)

    def residual_connection(self, x, residual):
        return residual * self.alpha + x


class DeepNormTransformerEncoder(LayerClassEncoder):
    layer_class = DeepNormEncoderLayer


class DeepNormTransformerDecoder(LayerClassDecoder):
    layer_class = DeepNormDecoderLayer


@torch.no_grad()
def apply_deepnorm_init_(model: nn.Module, encoder_layers: int, decoder_layers: int) -> None:
    """Redraw the weights of every linear layer of every encoder and decoder layer, in place."""
    betas = (
        (model.encoder, deepnorm_init.encoder_beta(encoder_layers, decoder_layers)),
        (model.decoder, deepnorm_init.decoder_beta(decoder_layers)),
    )
    for stack, beta in betas:
        for layer in stack.layers:
            for name, linear in layer.named_modules():
                if isinstance(linear, nn.Linear):
                    nn.init.xavier_normal_(linear.weight, gain=deepnorm_init.xavier_gain(name, beta))


@register_model("transformer_deepnorm")
class DeepNormTransformerModel(CustomLayerStacks, TransformerModel):
    """Post-LN Transformer with DeepNorm residuals and initialisation. Takes every ``transformer`` flag."""

    encoder_class = DeepNormTransformerEncoder
    decoder_class = DeepNormTransformerDecoder

    @classmethod
    def build_model(cls, args, task):
        post_ln_config(args, "transformer_deepnorm")
        model = super().build_model(args, task)
        n_enc, n_dec = args.encoder_layers, args.decoder_layers
        apply_deepnorm_init_(model, n_enc, n_dec)
        logger.info(
            "DeepNorm: encoder alpha %.4f beta %.4f, decoder alpha %.4f beta %.4f",
            deepnorm_init.encoder_alpha(n_enc, n_dec), deepnorm_init.encoder_beta(n_enc, n_dec),
            deepnorm_init.decoder_alpha(n_dec), deepnorm_init.decoder_beta(n_dec),
        )
        return model


register_presets("transformer_deepnorm")
