"""``transformer_rfixup``: Fixup (Zhang, Dauphin & Ma, ICLR 2019, "Fixup Initialization:
Residual Learning Without Normalization") on fairseq's Transformer: "R-Fixup" in T-Fixup's
Table 1 (IWSLT'14 De-En 34.5, WMT'17 En-De big 29.3, both quoted from the Fixup paper, §4.3).

Fixup, §3 ("Fixup initialization"), for a network of L residual branches of m layers each:

1. the classification layer and the last layer of each residual branch start at 0;
2. every other layer gets a standard init, and the weight layers inside residual
   branches are scaled by L^(-1/(2m-2));
3. a scalar multiplier (1 at init) in every branch and a scalar bias (0 at init)
   before each convolution, linear and element-wise activation layer.

§4.3 applies it to the Transformer "by replacing layer normalization"; the facts below
that the paper's text does not fix come from the authors' fairseq code
(github.com/hongyi-zhang/Fixup, ``fairseq/``), and are marked *ours* where we chose.

Mapping onto fairseq's layers (no LayerNorm anywhere: each becomes ``nn.Identity``):

* L = 2 N_enc + 3 N_dec: every self-attention, encoder-attention and FFN block is a
  branch (authors' code).
* FFN branch, m = 2: x + b1 -> fc1 -> + b2 -> ReLU -> dropout -> + b3 -> fc2 -> * s.
  fc1 is Xavier-uniform (redrawn: fairseq 0.12 builds it with PyTorch's default)
  times L^(-1/2); fc2 is 0 (rule 1).
* attention branch: (x + b) -> attention -> * s; the decoder's encoder-attention adds
  its b to the query only (keys and values are the encoder output). q, k and v keep
  fairseq's Xavier (gain 1/sqrt(2), the authors' joint in_proj init) times L^(-1/6),
  i.e. m = 4 (W_Q, W_K, W_V, W_O; the exponent -1/6 is the authors'); out_proj is 0.
  *Ours*: the authors' code gives the encoder-attention L = 12 whatever the depth
  (a default left in place); we use the model's L for every attention.
* The branch layers carry no per-unit biases (authors: ``bias=False``, the scalar
  biases replace them). fairseq 0.12's fused attention kernel and fairseq 0.12.2's
  encoder layer read ``q_proj.bias``... ``fc2.bias``, so they stay as constant zero
  buffers (in checkpoints, never trained).
* Stack outputs: the encoder output is (x + b) * s, the decoder's last hidden state
  x + b (authors' code; rule 3's bias before the output projection).
* Output projection: 0 when it is its own matrix (rule 1); a shared embedding keeps
  fairseq's N(0, d^-1/2), as do token embeddings (authors' code).

Layers are fairseq's own; only their builders are overridden (``build_self_attention``,
``build_encoder_attention``, ``build_fc1``, ``build_fc2``), so training, incremental
decoding and checkpoints run fairseq's code.
"""

import logging

import torch
from torch import nn

from fairseq.models import register_model
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase, TransformerModel
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_tfixup.baselines.layers import wrap_layer
from fairseq_tfixup.baselines.post_ln import register_presets
from fairseq_tfixup.models.transformer_tfixup import CustomLayerStacks, no_layer_norm_config, without_layer_norms

logger = logging.getLogger(__name__)


def num_branches(encoder_layers: int, decoder_layers: int) -> int:
    """L: residual branches of the encoder-decoder (2 per encoder layer, 3 per decoder layer)."""
    return 2 * encoder_layers + 3 * decoder_layers


def attention_scale(branches: int) -> float:
    """L^(-1/(2m-2)) with m = 4: q, k and v projections."""
    return branches ** (-1 / 6)


def ffn_scale(branches: int) -> float:
    """L^(-1/(2m-2)) with m = 2: fc1."""
    return branches ** (-1 / 2)


def scalar(value: float) -> nn.Parameter:
    return nn.Parameter(torch.full((1,), float(value)))


def drop_vector_bias_(linear: nn.Linear) -> nn.Linear:
    """Turn a Linear's bias into a constant zero buffer (same name, same shape)."""
    bias = linear.bias
    del linear.bias
    linear.register_buffer("bias", torch.zeros_like(bias.data))
    return linear


class ScalarBias(nn.Module):
    """x + b, b a learned scalar (0 at init); ``scale`` adds a multiplier s: (x + b) * s."""

    def __init__(self, scale: bool = False):
        super().__init__()
        self.bias = scalar(0)
        self.scale = scalar(1) if scale else None

    def forward(self, x):
        x = x + self.bias
        return x if self.scale is None else x * self.scale


class FixupLinear(nn.Linear):
    """Linear with Fixup's scalar bias before it and, after it, a scalar bias (before an
    activation) or a scalar multiplier (end of a branch); no per-unit bias."""

    def __init__(self, in_features, out_features, bias_after=False, multiplier=False):
        super().__init__(in_features, out_features)
        drop_vector_bias_(self)
        self.bias_in = scalar(0)
        self.bias_out = scalar(0) if bias_after else None
        self.scale = scalar(1) if multiplier else None

    def forward(self, x):
        y = super().forward(x + self.bias_in)
        if self.bias_out is not None:
            y = y + self.bias_out
        return y if self.scale is None else y * self.scale


class FixupAttention(MultiheadAttention):
    """fairseq's attention with a scalar bias on its input and a scalar multiplier on its output."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            drop_vector_bias_(proj)
        self.bias_in = scalar(0)
        self.scale = scalar(1)

    def forward(self, query, key, value, **kwargs):
        shifted = query + self.bias_in
        # self-attention gets one tensor three times; encoder-attention's keys and values stay as they are
        key = shifted if key is query else key
        value = shifted if value is query else value
        out, weights = super().forward(shifted, key, value, **kwargs)
        return out * self.scale, weights


class FixupFFN:
    """Builders of the FFN branch, shared by encoder and decoder layers."""

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(FixupLinear(input_dim, output_dim, bias_after=True), q_noise, qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(FixupLinear(input_dim, output_dim, multiplier=True), q_noise, qn_block_size)


class RFixupEncoderLayer(FixupFFN, TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return FixupAttention(
            embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout, self_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class RFixupDecoderLayer(FixupFFN, TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return FixupAttention(
            embed_dim, cfg.decoder.attention_heads, dropout=cfg.attention_dropout, add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn, self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return FixupAttention(
            embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout, encoder_decoder_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class RFixupTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.layer_norm = ScalarBias(scale=True)  # fairseq's slot for a final norm: (x + b) * s

    def build_encoder_layer(self, cfg):
        return wrap_layer(without_layer_norms(RFixupEncoderLayer(cfg, return_fc=self.return_fc)), cfg)


class RFixupTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.layer_norm = ScalarBias()  # the scalar bias before the output projection

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(without_layer_norms(RFixupDecoderLayer(cfg, no_encoder_attn)), cfg)


@torch.no_grad()
def apply_fixup_(model: nn.Module, branches: int) -> None:
    """Fixup's rules 1-2 on a freshly built model, in place (rule 3's scalars are built at 0/1)."""
    for name, param in model.named_parameters():
        leaf = ".".join(name.split(".")[-2:])
        if leaf in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
            param.mul_(attention_scale(branches))
        elif leaf == "fc1.weight":
            nn.init.xavier_uniform_(param)
            param.mul_(ffn_scale(branches))
        elif leaf in ("out_proj.weight", "fc2.weight") or name == "decoder.output_projection.weight":
            nn.init.zeros_(param)


@register_model("transformer_rfixup")
class RFixupTransformerModel(CustomLayerStacks, TransformerModel):
    """Transformer without LayerNorm, with Fixup's initialisation, scalar biases and
    multipliers (Zhang et al., 2019). Takes every ``transformer`` flag."""

    encoder_class = RFixupTransformerEncoder
    decoder_class = RFixupTransformerDecoder

    @classmethod
    def build_model(cls, args, task):
        cfg = no_layer_norm_config(args, "transformer_rfixup", "Fixup replaces it by scalar biases and multipliers")
        model = super().build_model(args, task)
        branches = num_branches(cfg.encoder.layers, cfg.decoder.layers)
        apply_fixup_(model, branches)
        logger.info(
            "R-Fixup: no LayerNorm; L = %d branches; q/k/v x %.4f, fc1 Xavier x %.4f, out_proj/fc2 zero",
            branches, attention_scale(branches), ffn_scale(branches),
        )
        return model


register_presets("transformer_rfixup")  # fairseq's presets (and 64-128-2 _deep_narrow); explicit flags win
