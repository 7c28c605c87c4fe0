"""T-Fixup for HuggingFace ``transformers`` models built from a config: ``apply_tfixup(model)``.

``tfixup.torch_tfixup.apply_tfixup`` hands a ``transformers.PreTrainedModel`` here (this module never imports
``transformers``: it reads the model's ``config.model_type`` and its modules). Each supported family is
described once, as a plan of the weights T-Fixup draws and the stacks they belong to (``tfixup.applier`` carries
it out); the constants are ``tfixup.tfixup_init``'s (docs/derivation.md):

* encoder-decoder, Post-LN (``marian``, ``bart``): the paper's constants, as the fairseq model
  ``transformer_tfixup`` applies them: encoder ``v_proj``/``out_proj``/``fc1``/``fc2`` x 0.67 N_enc^-1/4,
  decoder (self- and encoder-attention) x (9 N_dec)^-1/4, each side's token embedding x (9 N)^-1/4 (a shared
  one once, with the encoder's factor);
* encoder-only, Post-LN (``bert``, ``roberta``) and decoder-only, pre-norm (``gpt2``, and ``llama``, ``qwen2``,
  ``mistral``: RMSNorm, SwiGLU MLP, rotary positions, grouped KV heads): one stack, (6N)^-1/4 for the value
  and output projections, every MLP matrix (SwiGLU's gate, up and down) and the token embedding.

In every family each LayerNorm / RMSNorm of the model becomes ``nn.Identity`` (BART's ``layernorm_embedding``,
BERT's ``embeddings.LayerNorm``, its ``*.output.LayerNorm`` after the residual sum, the final norms of the
pre-norm stacks and the masked-LM head's norm); value, output and MLP weights are drawn again Xavier-uniform
(gain 1) and scaled (GPT-2's fused ``c_attn``: only its value columns); MLP biases are zeroed; token
embeddings are drawn N(0, d^-1/2) (padding row zero) and scaled. Untouched: q/k projections, attention
biases, positional and token-type embeddings, an untied output projection, and the model's embedding
multiplier (Marian/BART's sqrt(d) when ``scale_embedding`` is set, as fairseq keeps its own).

The families with no embedding multiplier of their own (BERT, RoBERTa, GPT-2, the Llama family) get fairseq's:
the token embedding's output is multiplied by sqrt(d) (a forward hook on that module; the tied output
projection reads the weight itself, unmultiplied, as in fairseq), so the stack's input is the paper's model's,
per-element Theta(1) times the factor, not sqrt(d) smaller (docs/derivation.md, section 4).
``input_scale=False`` leaves it out.

``keep_mlp_norm=True`` (the Llama family only) keeps each layer's ``post_attention_layernorm``, the RMSNorm
before its gated MLP, and removes the others: the gated MLP is of degree 2 in its input, and without that norm a
deep stack's stream can grow without bound in one forward pass once training has grown the weights
(docs/derivation.md, section 7.6). Not T-Fixup's "no norm anywhere": an option where plain T-Fixup diverges.

``keep_head_norm=True`` (BERT and RoBERTa only) keeps the masked-LM head's LayerNorm (the norm of a module
outside the base model; the paper's model has no counterpart of that head) and removes the others: a control.

``gated_mlp`` (the Llama family only; default None, the gated MLP as built) changes the gated MLP so that the
stack has no norm and a bound that training cannot undo (docs/derivation.md, section 7.7), the candidates the
derivation supports:

* ``"sigmoid"``: the gate bounded, ``down(sigmoid(gate x) * up x)`` (the GLU of Dauphin et al.): the block is
  of degree 1 in its input whatever the gate's weights become (``|G(x)| <= |down| |up| |x|``), as the paper's
  blocks are; ``config.hidden_act`` is set to ``"sigmoid"``, so the model saved and loaded keeps it.
* ``"scaled"``: a fixed, not learned, 1/N on each gated MLP's output (N layers): under Adam the three matrices
  grow by the same amount per update whatever their scale, and the N gated blocks' sum, which must stay below
  1 for the stream to stay finite, then grows as it does for one layer (``mlp.tfixup_output_scale``).

What was chosen is recorded in the model's config (``config.tfixup``) and the model becomes a T-Fixup class of its
own model type (``tfixup_llama``, ...): ``save_pretrained`` and, after ``import tfixup.hf_auto``, the Auto classes'
``from_pretrained`` give the same model back (the end of this file, and tfixup/hf_auto.py).
"""

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from tfixup import applier, tfixup_init
from tfixup.applier import Draw, Plan, weight

ENCODER_DECODER = ("marian", "bart")
ENCODER_ONLY = ("bert", "roberta")
LLAMA_LIKE = ("llama", "qwen2", "mistral")
SUPPORTED = (*ENCODER_DECODER, *ENCODER_ONLY, "gpt2", *LLAMA_LIKE)
GATED_MLP = ("sigmoid", "scaled")  # apply_tfixup's gated_mlp options (docs/derivation.md, section 7.7)

# model types whose fused qkv layout is not GPT-2's [q | k | v] columns: refused by name
FUSED_QKV = {
    "gpt_neox": "its query_key_value interleaves q, k and v per head",
    "gpt_neox_japanese": "its query_key_value interleaves q, k and v per head",
    "bloom": "its query_key_value is laid out (heads, 3, head_dim)",
    "falcon": "its query_key_value fuses q, k and v per head group (multi-query / grouped)",
    "gpt_bigcode": "its c_attn fuses q with one shared k/v head (multi-query)",
    "mpt": "its Wqkv fuses q, k and v with its own grouped layout",
    "phi3": "its qkv_proj fuses q, k and v with grouped KV heads",
}


class InputScale:
    """A forward hook: the token embedding's output times ``scale`` (fairseq's ``embed_scale``, sqrt(d))."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, module, args, output):
        return output * self.scale


def is_hf_model(model: nn.Module) -> bool:
    """A ``transformers.PreTrainedModel``, told without importing transformers."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
               for c in type(model).__mro__)


@torch.no_grad()
def apply_tfixup(model: nn.Module, input_scale: bool = True, keep_mlp_norm: bool = False,
                 gated_mlp: Optional[str] = None, keep_head_norm: bool = False) -> Dict[str, float]:
    """T-Fixup on a HuggingFace model, in place; returns parameter name -> the scale it was multiplied by.
    Everything is checked before anything changes: a refused model is left as it was. ``input_scale``: give a
    family with no embedding multiplier fairseq's sqrt(d) (its token embedding's ``tfixup_input_scale``).
    ``keep_mlp_norm``: the Llama family keeps the RMSNorm before each gated MLP (see the module's text).
    ``gated_mlp``: None, or one of GATED_MLP, the Llama family's norm-free gated MLP (see the module's text).
    ``keep_head_norm``: BERT and RoBERTa keep their masked-LM head's LayerNorm (see the module's text)."""
    _refuse_recorded(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    name = type(model).__name__
    if model_type in FUSED_QKV:
        raise ValueError(f"apply_tfixup: {name} (model type {model_type!r}) is not supported: {FUSED_QKV[model_type]}, "
                         f"a layout T-Fixup does not read; {_DESCRIBE}")
    if model_type not in SUPPORTED:
        raise ValueError(f"apply_tfixup: {name} (model type {model_type!r}) is not one of {', '.join(SUPPORTED)}; "
                         f"{_DESCRIBE}")
    try:
        plan = FAMILIES[model_type](model)
    except AttributeError as e:  # a class of this model type laid out otherwise (another transformers version?)
        raise ValueError(f"apply_tfixup: {name} (model type {model_type!r}) is not laid out as tfixup.hf reads it "
                         f"({e}); {_DESCRIBE}") from None
    if keep_mlp_norm and model_type not in LLAMA_LIKE:
        raise ValueError(f"apply_tfixup: keep_mlp_norm keeps the RMSNorm before the gated MLP of the Llama family "
                         f"({', '.join(LLAMA_LIKE)}); {name} (model type {model_type!r}) has none: leave it out")
    if keep_head_norm and (model_type not in ENCODER_ONLY or not _head_norms(model, applier.norms(model))):
        raise ValueError(f"apply_tfixup: keep_head_norm keeps the masked-LM head's LayerNorm of "
                         f"{', '.join(ENCODER_ONLY)}; {name} (model type {model_type!r}) has none: leave it out")
    if gated_mlp is not None:
        check_gated_mlp(gated_mlp, model_type, name)
    options = {"input_scale": input_scale and bool(plan.inputs), "keep_mlp_norm": keep_mlp_norm,
               "gated_mlp": gated_mlp, "keep_head_norm": keep_head_norm}  # as done: what the record says
    plan.norms = removed_norms(model, options)
    if not plan.norms or getattr(model, "tfixup_applied", False):
        raise ValueError(f"apply_tfixup: {name}: T-Fixup was applied to it already (no norm left that it removes, or "
                         f"tfixup_applied set; applying it twice would scale its weights twice); build the model again "
                         f"from its config")

    done = applier.execute(model, plan)  # its shapes checked before any change
    for embedding in plan.inputs if input_scale else ():
        _add_input_scale(embedding)
    if gated_mlp is not None:
        gate_mlps_(model, gated_mlp)
    model.tfixup_applied = True  # what the second call refuses (a kept norm would hide it)
    _record(model, **options)
    return done


def removed_norms(model: nn.Module, options: dict) -> List[Tuple[nn.Module, str]]:
    """The norms T-Fixup replaces by nn.Identity, as (parent, attribute): every LayerNorm / RMSNorm of the model
    but those an option keeps (``keep_mlp_norm``: each Llama-family layer's ``post_attention_layernorm``;
    ``keep_head_norm``: BERT's and RoBERTa's masked-LM head norm). The one
    place: apply_tfixup and rebuild (a saved model loaded back) read it."""
    kept = set()
    if options.get("keep_mlp_norm"):
        kept |= {(id(layer), "post_attention_layernorm") for layer in model.base_model.layers}
    norms = applier.norms(model)
    if options.get("keep_head_norm"):
        kept |= {(id(parent), attr) for parent, attr in _head_norms(model, norms)}
    return [(parent, attr) for parent, attr in norms if (id(parent), attr) not in kept]


def check_gated_mlp(option, model_type, name: str = "the model") -> None:
    """Refuse, in one line, a gated_mlp option that is not one of GATED_MLP or a model without a gated MLP."""
    if option not in GATED_MLP:
        raise ValueError(f"apply_tfixup: gated_mlp={option!r} is not one of {', '.join(map(repr, GATED_MLP))} (or "
                         "None, the gated MLP as built)")
    if model_type not in LLAMA_LIKE:
        raise ValueError(f"apply_tfixup: gated_mlp changes the gated MLP of the Llama family ({', '.join(LLAMA_LIKE)}); "
                         f"{name} (model type {model_type!r}) has none: leave it out")


def gated_mlp_scale(n_layers: int) -> float:
    """The fixed factor on each gated MLP's output of gated_mlp="scaled": 1/N (docs/derivation.md, 7.7)."""
    return 1.0 / n_layers


class OutputScale:
    """A forward hook: the module's output times ``scale`` (gated_mlp="scaled"; not a parameter, not learned)."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, module, args, output):
        return output * self.scale


def gate_mlps_(model: nn.Module, option: str) -> int:
    """Each gated MLP of a Llama-family model as OPTION makes it (GATED_MLP); how many."""
    layers = model.base_model.layers
    for layer in layers:
        if option == "sigmoid":
            layer.mlp.act_fn = nn.Sigmoid()
        else:
            layer.mlp.tfixup_output_scale = gated_mlp_scale(len(layers))
            layer.mlp.register_forward_hook(OutputScale(layer.mlp.tfixup_output_scale))
    if option == "sigmoid":
        model.config.hidden_act = "sigmoid"  # what a saved model is built with again
    return len(layers)


_DESCRIBE = ("replace its norms with nn.Identity() and describe its layers: apply_tfixup(model, "
             "layers=[Layer(attention=[(v_proj, o_proj)], mlp=[...]) for each layer], embeddings=[embed_tokens]) "
             "(tfixup.torch_tfixup.Layer; docs/beyond-fairseq.md)")


# ---------------------------------------------------------------- the families


def _head_norms(model: nn.Module, norms: List[Tuple[nn.Module, str]]) -> List[Tuple[nn.Module, str]]:
    """Those of NORMS outside the base model: a head's (BERT's cls.predictions.transform.LayerNorm)."""
    inside = {id(m) for m in model.base_model.modules()}
    return [(parent, attr) for parent, attr in norms if id(parent) not in inside]


def _encoder_decoder(model: nn.Module) -> Plan:
    """Marian, BART: fairseq's layout and the paper's encoder-decoder constants; each weight drawn again."""
    base = model.base_model
    encoder, decoder = getattr(base, "encoder", None), getattr(base, "decoder", None)
    if encoder is None or decoder is None:
        raise ValueError(f"apply_tfixup: {type(model).__name__} is not an encoder-decoder (a decoder alone?): T-Fixup "
                         f"for {model.config.model_type} covers the whole encoder-decoder model; for one stack, "
                         + _DESCRIBE)
    return Plan(applier.fairseq_layout([(encoder, "encoder"), (decoder, "decoder")], redraw=True))


def _refuse_cross_attention(model: nn.Module, family: str) -> None:
    if getattr(model.config, "add_cross_attention", False):
        raise ValueError(f"apply_tfixup: {type(model).__name__} is built with add_cross_attention=True (a decoder of "
                         f"an encoder-decoder): T-Fixup for {family} covers the single stack; build it without "
                         "cross-attention, or describe both stacks with layers= and decoder_layers=")


def _bert(model: nn.Module) -> Plan:
    """BERT, RoBERTa: one Post-LN stack; every LayerNorm (embeddings, each ``*.output``, the MLM head's) goes."""
    _refuse_cross_attention(model, "BERT/RoBERTa")
    base = model.base_model
    layers = base.encoder.layer
    scale = tfixup_init.single_stack_scale(len(layers))
    draws = []
    for layer in layers:
        draws += [Draw(weight(layer.attention.self.value, "attention.self.value"), "xavier", scale, "single v"),
                  Draw(weight(layer.attention.output.dense, "attention.output.dense"), "xavier", scale, "single w")]
        draws += applier.mlp([layer.intermediate.dense, layer.output.dense], scale, "single")
    draws.append(applier.embedding(base.embeddings.word_embeddings, scale, "single"))
    return Plan(draws, inputs=[base.embeddings.word_embeddings])


def _gpt2(model: nn.Module) -> Plan:
    """GPT-2: pre-LN (ln_1, ln_2, ln_f go); ``Conv1D`` weights are (in, out) and ``c_attn``'s output columns are
    [q | k | v]: only the last third is drawn and scaled. Every c_proj is drawn again, so HF's 1/sqrt(2L)
    rescale of its own draw is replaced, not multiplied."""
    _refuse_cross_attention(model, "GPT-2")
    base = model.base_model
    layers = base.h
    scale = tfixup_init.single_stack_scale(len(layers))
    draws = []
    for i, layer in enumerate(layers):
        c_attn = layer.attn.c_attn
        d = c_attn.weight.shape[0]
        if tuple(c_attn.weight.shape) != (d, 3 * d):
            raise ValueError(f"apply_tfixup: h.{i}.attn.c_attn weight is {tuple(c_attn.weight.shape)}, not GPT-2's "
                             f"(d, 3d) = ({d}, {3 * d}): cannot find its value columns")
        draws += [Draw(c_attn.weight, "xavier", scale, "single v", index=(slice(None), slice(2 * d, 3 * d)),
                       label="[v]"),
                  Draw(weight(layer.attn.c_proj, "attn.c_proj"), "xavier", scale, "single w")]
        draws += applier.mlp([layer.mlp.c_fc, layer.mlp.c_proj], scale, "single")
    draws.append(applier.embedding(base.wte, scale, "single"))
    return Plan(draws, inputs=[base.wte])


def _llama(model: nn.Module) -> Plan:
    """Llama, Qwen2, Mistral: pre-RMSNorm (input_layernorm, post_attention_layernorm, norm go), SwiGLU MLP
    (gate_proj, up_proj, down_proj, each scaled), v_proj with grouped KV heads (its own (kv_dim, d) matrix),
    rotary positions (no positional embedding)."""
    base = model.base_model
    layers = base.layers
    scale = tfixup_init.single_stack_scale(len(layers))
    draws = []
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        missing = [p for p in ("gate_proj", "up_proj", "down_proj") if not hasattr(mlp, p)]
        if missing:
            raise ValueError(f"apply_tfixup: layers.{i}.mlp is a {type(mlp).__name__} without {', '.join(missing)} "
                             "(a mixture of experts?): T-Fixup reads a gated MLP of three matrices; "
                             + _DESCRIBE)
        draws += [Draw(weight(layer.self_attn.v_proj, "self_attn.v_proj"), "xavier", scale, "single v"),
                  Draw(weight(layer.self_attn.o_proj, "self_attn.o_proj"), "xavier", scale, "single w")]
        draws += applier.mlp([mlp.gate_proj, mlp.up_proj, mlp.down_proj], scale, "single")
    draws.append(applier.embedding(base.embed_tokens, scale, "single"))
    return Plan(draws, inputs=[base.embed_tokens])


FAMILIES: Dict[str, Callable[[nn.Module], Plan]] = {
    **{t: _encoder_decoder for t in ENCODER_DECODER}, **{t: _bert for t in ENCODER_ONLY}, "gpt2": _gpt2,
    **{t: _llama for t in LLAMA_LIKE},
}


# ---------------------------------------------------------------- saved and loaded: the record in the config
# What apply_tfixup chose is written into the model's config (``config.tfixup``), and the model and its config
# become T-Fixup classes of their own model type (``tfixup_llama``, ...; tfixup/hf_auto.py), so that
# ``save_pretrained`` writes it to config.json and the Auto classes, after ``import tfixup.hf_auto``, build the
# same model again without drawing a weight: ``rebuild`` removes the same norms and adds the same multiplier.

RECORD_FORMAT = 1
# apply_tfixup's choices, recorded, with their defaults
OPTIONS = {"input_scale": True, "keep_mlp_norm": False, "gated_mlp": None, "keep_head_norm": False}


def _add_input_scale(embedding: nn.Module) -> None:
    """fairseq's sqrt(d) on the token embedding's output (d read from the module, not its weight: a weight not
    yet allocated, on the meta device or partitioned, has no reliable shape)."""
    dim = getattr(embedding, "embedding_dim", None) or embedding.weight.shape[1]
    embedding.tfixup_input_scale = dim ** 0.5
    embedding.register_forward_hook(InputScale(embedding.tfixup_input_scale))


def record_of(config) -> Optional[dict]:
    """The config's T-Fixup record (``config.tfixup``), or None: a model T-Fixup was never applied to, or one
    saved before the record existed."""
    return getattr(config, "tfixup", None)


def _refuse_recorded(model: nn.Module) -> None:
    record = record_of(getattr(model, "config", None))
    if record is not None:
        raise ValueError(f"apply_tfixup: {type(model).__name__}: T-Fixup was applied to it already (its config "
                         f"records it: tfixup = {record!r}); applying it again would redraw its trained weights: use "
                         "the model as it is (a saved folder: load it with the Auto classes after "
                         "`import tfixup.hf_auto`)")


def _record(model: nn.Module, **options) -> None:
    """apply_tfixup's choices into the model's config; the model and config become T-Fixup classes."""
    from tfixup import hf_auto  # transformers is imported: MODEL is one of its models

    record = {"format": RECORD_FORMAT, "family": model.config.model_type, **OPTIONS}
    record.update((k, v if k == "gated_mlp" else bool(v)) for k, v in options.items() if k in OPTIONS)
    hf_auto.adopt(model, record)


def check_record(record, family: str) -> dict:
    """RECORD (config.json's ``tfixup``, untrusted) read by an allow-list: its options, or a one-line refusal."""
    where = f"config.json's tfixup record {record!r}"
    if not isinstance(record, dict):
        raise ValueError(f"{where} is not a mapping: not written by apply_tfixup; rebuild the model with it")
    unknown = sorted(set(record) - {"format", "family", *OPTIONS})
    if unknown:
        raise ValueError(f"{where} has unknown fields {', '.join(map(repr, unknown))} (written by a newer tfixup?): "
                         f"it knows format, family, {', '.join(OPTIONS)}; upgrade tfixup")
    if type(record.get("format")) is not int or record["format"] != RECORD_FORMAT or record.get("family") != family:
        raise ValueError(f"{where}: expected format {RECORD_FORMAT} and family {family!r} (the config's model type "
                         f"tfixup_{family}); not written by this tfixup: rebuild the model with apply_tfixup")
    options = {k: record.get(k, default) for k, default in OPTIONS.items()}
    bad = [k for k, v in options.items() if k != "gated_mlp" and not isinstance(v, bool)]
    if bad:
        raise ValueError(f"{where}: {', '.join(bad)} must be true or false")
    if options["gated_mlp"] is not None and (options["gated_mlp"] not in GATED_MLP or family not in LLAMA_LIKE):
        raise ValueError(f"{where}: gated_mlp must be null or one of {', '.join(map(repr, GATED_MLP))}, for the "
                         f"Llama family ({', '.join(LLAMA_LIKE)}) only")
    if options["keep_mlp_norm"] and family not in LLAMA_LIKE:
        raise ValueError(f"{where}: keep_mlp_norm is for the Llama family ({', '.join(LLAMA_LIKE)}), not {family}")
    if options["keep_head_norm"] and family not in ENCODER_ONLY:
        raise ValueError(f"{where}: keep_head_norm is for {', '.join(ENCODER_ONLY)}, not {family}")
    return options


def rebuild(model: nn.Module, options: dict) -> None:
    """What apply_tfixup(model, **OPTIONS) changes in the model's layout, without drawing a weight: the same norms
    become nn.Identity, the same input multiplier is added. For a model built from a T-Fixup config, whose
    weights are then loaded (from_pretrained) or drawn (``redraw``)."""
    applier.execute(model, Plan([], removed_norms(model, options)))
    if options["input_scale"] and model.config.model_type.removeprefix("tfixup_") not in ENCODER_DECODER:
        _add_input_scale(model.get_input_embeddings())
    if options["gated_mlp"] is not None:
        gate_mlps_(model, options["gated_mlp"])
    model.tfixup_applied = True


@torch.no_grad()
def redraw(model: nn.Module) -> Dict[str, float]:
    """T-Fixup's draws on a model ``rebuild`` laid out (a T-Fixup model built from its config, or materialised
    from the meta device and initialised): the weights apply_tfixup draws, drawn and scaled the same way."""
    family = model.config.model_type.removeprefix("tfixup_")
    return applier.execute(model, FAMILIES[family](model))
