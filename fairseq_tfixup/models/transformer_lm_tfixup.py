"""``transformer_lm_tfixup``: fairseq's decoder-only language model without LayerNorm, initialised
with T-Fixup's rules for a single stack (``tfixup.applier``, docs/derivation.md).

Everything but one hook is fairseq's own ``TransformerLanguageModel`` (task ``language_modeling``):
``build_model`` refuses flags that would bring a LayerNorm back or replace the plain token
embedding, builds fairseq's model, replaces each layer's LayerNorms by ``nn.Identity`` (the same
``without_layer_norms`` as the translation model; fairseq's LM has no decoder-class hook to build
other layers) and applies the rules once, to the freshly built weights. Loading a checkpoint builds
first and then overwrites every parameter, so trained weights are never rescaled.

With ``--decoder-normalize-before`` off (refused when on) fairseq builds no final LayerNorm either.
Its baselines are fairseq's own: ``--arch transformer_lm`` is Post-LN (x_{l+1} = LN(x_l + G(x_l)),
no final norm) and ``--arch transformer_lm --decoder-normalize-before`` Pre-LN (with a final norm).

Architectures (explicit flags win over every preset):

* ``transformer_lm_tfixup``: fairseq's ``transformer_lm`` defaults, 512-2048-8, 6 layers;
* ``transformer_lm_tfixup_small``: 128-512-4, 6 layers, for CPU;
* ``transformer_lm_tfixup_deep``: the small width with 24 layers.
"""

import logging

from torch import nn

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from fairseq_tfixup.models.transformer_tfixup import without_layer_norms
from tfixup import applier, errors, tfixup_init

logger = logging.getLogger(__name__)

NAME = "transformer_lm_tfixup"


def check_lm_config(args, model: str = NAME) -> None:
    """Raise a one-line ValueError for settings T-Fixup's LM cannot take: a LayerNorm flag, an
    embedding that is not a plain token embedding (the rules scale ``decoder.embed_tokens``), or
    fewer than one layer."""
    for key, flag in (("decoder_normalize_before", "--decoder-normalize-before"),
                      ("layernorm_embedding", "--layernorm-embedding")):
        if getattr(args, key, False):
            raise errors.Refused(f"{model} has no LayerNorm: {flag} cannot be used "
                             "(T-Fixup replaces normalisation by its initialisation)")
    for key, flag in (("adaptive_input", "--adaptive-input"), ("character_embeddings", "--character-embeddings")):
        if getattr(args, key, False):
            raise errors.Refused(f"{model} scales a plain token embedding: drop {flag}")
    dim = getattr(args, "decoder_embed_dim", None)
    for key, flag in (("decoder_input_dim", "--decoder-input-dim"), ("decoder_output_dim", "--decoder-output-dim")):
        if getattr(args, key, dim) != dim:
            raise errors.Refused(f"{model} needs {flag} = --decoder-embed-dim ({getattr(args, key)} != {dim}): "
                             "T-Fixup's embedding scale assumes no projection between the embedding and the stack")
    n = getattr(args, "decoder_layers", None)
    if n is None or int(n) < 1:
        raise errors.Refused(f"{model} needs --decoder-layers >= 1, got {n}")


def same_width_by_default(args) -> None:
    """--decoder-input-dim and --decoder-output-dim left at fairseq's defaults (its config's 512) take
    --decoder-embed-dim: T-Fixup's LM needs them equal (check_lm_config), so setting the width once is
    enough. A value given that differs from both is still refused there."""
    defaults = TransformerLanguageModelConfig()
    for key in ("decoder_input_dim", "decoder_output_dim"):
        if getattr(args, key, None) in (None, getattr(defaults, key)):
            setattr(args, key, args.decoder_embed_dim)


def lm_plan(model: nn.Module) -> applier.Plan:
    """T-Fixup's single-stack plan ((6N)^-1/4, ``tfixup.applier.fairseq_layout``); a tied input/output
    embedding is one parameter (``decoder.embed_tokens.weight``), scaled once."""
    return applier.Plan(applier.fairseq_layout([(model.decoder, "single")], redraw=False))


@register_model(NAME, dataclass=TransformerLanguageModelConfig)
class TFixupTransformerLanguageModel(TransformerLanguageModel):
    """Decoder-only Transformer LM without LayerNorm, trained without warmup: T-Fixup for a single
    stack. Takes every ``transformer_lm`` flag but those ``check_lm_config`` refuses."""

    @classmethod
    def build_model(cls, args, task):
        same_width_by_default(args)
        check_lm_config(args)
        model = super().build_model(args, task)
        for layer in model.decoder.layers:
            without_layer_norms(layer)
        n = int(args.decoder_layers)
        applier.execute(model, lm_plan(model))
        logger.info("T-Fixup LM: no LayerNorm; %d layers, scaled self-attention v/out, MLP weights and the "
                    "token embedding by (6N)^-1/4 = %.4f%s", n, tfixup_init.single_stack_scale(n),
                    " (input/output embedding tied: scaled once)" if model.decoder.share_input_output_embed
                    else "")
        return model


# Architectures. The model's own name is fairseq's ``transformer_lm`` defaults (its config
# dataclass: 512-2048-8, 6 layers, Post-LN order, which without LayerNorm is no order at all); the
# presets below fill only what is unset (getattr-default style), the rest comes from the same
# dataclass, so explicit flags win. fairseq's larger LM presets (``base_lm_architecture``) force
# Pre-LN, which this model refuses, so none is delegated to.


def transformer_lm_defaults(args) -> None:
    """Every setting still unset, at fairseq's ``transformer_lm`` defaults (its config dataclass;
    what ``--arch transformer_lm`` gets). Settings the dataclass takes from the task or common
    config (``${...}``) are the parser's already."""
    config = TransformerLanguageModelConfig()
    for key in config.__dataclass_fields__:
        value = getattr(config, key, None)
        if not key.startswith("_") and not hasattr(args, key) and not str(value).startswith("${"):
            setattr(args, key, value)


@register_model_architecture(NAME, NAME + "_small")
def tfixup_lm_small(args):
    """128-512-4, 6 layers: a CPU-sized stack (the LM study's width)."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 128)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 512)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 6)
    # fairseq's base_lm_architecture does the same: no projections around the stack
    args.decoder_input_dim = getattr(args, "decoder_input_dim", args.decoder_embed_dim)
    args.decoder_output_dim = getattr(args, "decoder_output_dim", args.decoder_embed_dim)
    transformer_lm_defaults(args)


@register_model_architecture(NAME, NAME + "_deep")
def tfixup_lm_deep(args):
    """The small width with 24 layers."""
    args.decoder_layers = getattr(args, "decoder_layers", 24)
    tfixup_lm_small(args)
