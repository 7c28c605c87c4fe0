"""``transformer_tfixup``: fairseq's Transformer without LayerNorm, initialised with T-Fixup.

Everything but three narrow hooks is fairseq's own ``TransformerModel``:

* ``build_encoder``/``build_decoder`` return stacks whose ``build_*_layer``
  hook replaces each layer's LayerNorms by ``nn.Identity``;
* ``build_model`` refuses flags that would bring a LayerNorm back, then
  applies the rules of ``tfixup.tfixup_init`` once, to the freshly
  built weights (``tfixup.applier``). Loading a checkpoint builds first and then overwrites every
  parameter, so trained weights are never rescaled.

Two options outside the paper (results/diagnostics/update_decomposition.md):
``--tfixup-zero-attn-bias`` starts every attention's q/k/v bias at zero (fairseq draws them
like nn.Linear's, unscaled, and the v bias reaches the residual stream in every block);
``--tfixup-scale-positions`` multiplies the positional embedding by the token embedding's
factor (9N)^-1/4, so the stack's input shrinks with depth as the paper's ||x|| does. The
factor is a forward hook, recomputed from the layer counts at build: no extra state.
"""

import logging
import re

import torch
from torch import nn

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from tfixup import applier, errors, tfixup_init

logger = logging.getLogger(__name__)


is_layer_norm = applier.is_norm  # fairseq's LayerNorm() returns torch's, or apex's FusedLayerNorm on GPU


def without_layer_norms(layer: nn.Module) -> nn.Module:
    """Replace every LayerNorm child of a Transformer layer by an identity (``tfixup.applier``'s plan of norms).

    fairseq's layers call their norms unconditionally (post- or pre-norm), so an
    identity is the narrowest way to take them out; it has no parameters and
    leaves no trace in checkpoints.
    """
    applier.execute(layer, applier.Plan([], [(layer, name) for name, child in layer.named_children()
                                             if is_layer_norm(child)]))
    return without_fused_encoder_path(layer)  # that path applies post-LN norms itself


def without_fused_encoder_path(layer: nn.Module) -> nn.Module:
    """fairseq 0.12.2's encoder layer switches, in eval mode after ``load_state_dict``, to a fused
    kernel (BetterTransformer) that computes stock Post-LN itself, and its encoder feeds that kernel
    batch-first tensors; a layer whose norms, residual path or caller differ must never take it. The flag
    is set on any fairseq (one without that path ignores it), so tests/test_method_layout.py can see that a
    method's encoder layers went through here."""
    layer.can_use_fastpath = False
    return layer


class TFixupTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return without_layer_norms(super().build_encoder_layer(cfg))


class TFixupTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return without_layer_norms(super().build_decoder_layer(cfg, no_encoder_attn))


def no_layer_norm_config(
    args,
    model: str = "transformer_tfixup",
    reason: str = "T-Fixup replaces normalisation by its initialisation",
) -> TransformerConfig:
    """The structured config of ARGS (fairseq's defaults filled in); a one-line ValueError for
    settings that defeat a model without LayerNorm.

    Reads the structured config, which fairseq builds alike from command-line
    flags (``--encoder-layers``) and from hydra configs (``encoder.layers``).
    """
    base_architecture(args)
    cfg = TransformerConfig.from_namespace(args)
    for value, flag in (
        (cfg.encoder.normalize_before, "--encoder-normalize-before"),
        (cfg.decoder.normalize_before, "--decoder-normalize-before"),
        (cfg.layernorm_embedding, "--layernorm-embedding"),
    ):
        if value:
            raise errors.Refused(f"{model} has no LayerNorm: {flag} cannot be used ({reason})")
    check_layers(cfg, model)
    return cfg


def check_layers(cfg: TransformerConfig, model: str) -> None:
    for n, flag in ((cfg.encoder.layers, "--encoder-layers"), (cfg.decoder.layers, "--decoder-layers")):
        if n is None or int(n) < 1:
            raise errors.Refused(f"{model} needs {flag} >= 1, got {n}")


def post_ln_config(args, model: str) -> TransformerConfig:
    """For a model that keeps Post-LN's LayerNorms (T-Fixup's init on Post-LN, and the Post-LN baselines:
    DS-Init, DeepNorm, Admin, LRI): the structured config of ARGS; a one-line refusal of the flags that
    would make it Pre-LN."""
    base_architecture(args)
    cfg = TransformerConfig.from_namespace(args)
    for value, flag in ((cfg.encoder.normalize_before, "--encoder-normalize-before"),
                        (cfg.decoder.normalize_before, "--decoder-normalize-before")):
        if value:
            raise errors.Refused(f"{model} is a Post-LN Transformer: drop {flag}")
    check_layers(cfg, model)
    return cfg


def tfixup_plan(model: nn.Module) -> applier.Plan:
    """T-Fixup's plan for a fairseq encoder-decoder just built: the paper's factors by stack
    (``tfixup.applier.fairseq_layout``: v_proj, fc1, fc2 drawn again, out_proj and embeddings scaled)."""
    return applier.Plan(applier.fairseq_layout([(model.encoder, "encoder"), (model.decoder, "decoder")], redraw=False))


_ATTENTION_BIAS = re.compile(r"(^|\.)(self_attn|encoder_attn)\.(q_proj|k_proj|v_proj)\.bias$")


@torch.no_grad()
def zero_attention_biases_(model: nn.Module) -> None:
    """Every attention's q/k/v bias set to zero (out_proj's is zero already)."""
    for name, param in model.named_parameters():
        if _ATTENTION_BIAS.search(name):
            param.zero_()


def scale_positions(stack: nn.Module, factor: float) -> None:
    """Multiply the output of ``stack.embed_positions`` (if any) by ``factor``: a forward hook, so
    checkpoints keep fairseq's state dict and a rebuilt model gets the same factor."""
    if getattr(stack, "embed_positions", None) is not None:
        stack.embed_positions.register_forward_hook(lambda module, inputs, output: output * factor)


class CustomLayerStacks:
    """Mixin for a ``TransformerModel`` whose encoder and decoder are ``cls.encoder_class`` and
    ``cls.decoder_class``: fairseq's stacks, subclassed to build other layers."""

    encoder_class = TransformerEncoderBase
    decoder_class = TransformerDecoderBase

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return cls.encoder_class(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return cls.decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


@register_model("transformer_tfixup")
class TFixupTransformerModel(CustomLayerStacks, TransformerModel):
    """Transformer without LayerNorm, trained without warmup: T-Fixup
    (Huang et al., 2020, "Improving Transformer Optimization Through Better
    Initialization"). Takes every ``transformer`` flag."""

    encoder_class = TFixupTransformerEncoder
    decoder_class = TFixupTransformerDecoder
    # T-Fixup's two steps; the ablations of baselines/ablations.py leave out one each
    removes_layer_norm = True
    apply_init = True

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--tfixup-zero-attn-bias", action="store_true",
                            help="start every attention's q/k/v bias at zero (not in the paper)")
        parser.add_argument("--tfixup-scale-positions", action="store_true",
                            help="scale the positional embeddings by the token embedding's (9N)^-1/4 "
                                 "(not in the paper)")

    @classmethod
    def build_model(cls, args, task):
        arch = getattr(args, "arch", None) or "transformer_tfixup"
        cfg = no_layer_norm_config(args, arch) if cls.removes_layer_norm else post_ln_config(args, arch)
        model = super().build_model(args, task)
        n_enc, n_dec = cfg.encoder.layers, cfg.decoder.layers
        if cls.apply_init:
            applier.execute(model, tfixup_plan(model))
        if getattr(args, "tfixup_zero_attn_bias", False):
            zero_attention_biases_(model)
        if getattr(args, "tfixup_scale_positions", False):
            scale_positions(model.encoder, tfixup_init.embedding_scale(n_enc))
            scale_positions(model.decoder, tfixup_init.embedding_scale(n_dec))
        name = "T-Fixup" if cls.removes_layer_norm and cls.apply_init else arch
        logger.info(
            "%s: %s; %s", name, "no LayerNorm" if cls.removes_layer_norm else "Post-LN (LayerNorms kept)",
            "fairseq's initialisation (no T-Fixup scaling)" if not cls.apply_init else
            "scaled encoder blocks by %.4f, decoder blocks by %.4f, embeddings by %.4f (encoder) / %.4f "
            "(decoder)" % (tfixup_init.encoder_scale(n_enc), tfixup_init.decoder_scale(n_dec),
                           tfixup_init.embedding_scale(n_enc), tfixup_init.embedding_scale(n_dec)))
        return model



# Architectures: fairseq's own presets, under this model's name. Explicit flags win
# (fairseq's presets only fill what is unset, getattr-default style).


@register_model_architecture("transformer_tfixup", "transformer_tfixup")
def tfixup_base_architecture(args):
    """base: 512-2048-8, 6+6 layers (paper §4)."""
    base_architecture(args)


@register_model_architecture("transformer_tfixup", "transformer_tfixup_iwslt_de_en")
def tfixup_iwslt_de_en(args):
    """small: 512-1024-4, 6+6 layers (IWSLT'14, paper Table 1)."""
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_tfixup", "transformer_tfixup_wmt_en_de")
def tfixup_wmt_en_de(args):
    """base: 512-2048-8 (WMT, paper Tables 1-3)."""
    transformer_wmt_en_de(args)


@register_model_architecture("transformer_tfixup", "transformer_tfixup_vaswani_wmt_en_de_big")
def tfixup_vaswani_wmt_en_de_big(args):
    """big: 1024-4096-16, dropout 0.3 (WMT'17 En-De, paper Table 1)."""
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_tfixup", "transformer_tfixup_deep_narrow")
def tfixup_deep_narrow(args):
    """64-128-2 for the depth study (paper Fig. 4b, up to 200+200 layers); fairseq has no
    such preset. Set the depth with --encoder-layers/--decoder-layers."""
    for side in ("encoder", "decoder"):
        for key, value in (("embed_dim", 64), ("ffn_embed_dim", 128), ("attention_heads", 2)):
            setattr(args, f"{side}_{key}", getattr(args, f"{side}_{key}", value))
    base_architecture(args)
