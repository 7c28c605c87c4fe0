"""T-Fixup for any PyTorch model, without fairseq: ``apply_tfixup(model, ...)``.

What it handles (a HuggingFace ``transformers`` model built from its config goes to ``tfixup.hf``):

* ``nn.Transformer`` (encoder-decoder): the paper's constants, 0.67 N_e^-1/4 in the encoder and
  (9 N_d)^-1/4 in the decoder and for both input embeddings;
* ``nn.TransformerEncoder``, alone (an encoder-only model, or a decoder-only one run with a causal
  mask): one stack of N layers, (6N)^-1/4 for its blocks and its input embedding;
* ``nn.TransformerDecoder``, alone (the decoder of some encoder-decoder): the paper's decoder rule,
  (9N)^-1/4;
* a user's own residual stack, described by ``layers`` (one :class:`Layer` per layer: its attentions'
  value and output projections, its MLP's linear layers), and for an encoder-decoder ``decoder_layers``.

What it does (docs/derivation.md derives the constants; they come from ``tfixup.tfixup_init``; the plan is
carried out by ``tfixup.applier``, as the fairseq and HuggingFace models' are):

* every LayerNorm of the torch layers and stacks becomes ``nn.Identity`` (a custom model must have none
  left: it is refused otherwise, naming the module);
* value and output projections of every attention and the MLP weights are drawn again Xavier-uniform
  (gain 1; a fused ``in_proj_weight``'s value rows as their own d x d matrix), MLP biases are zeroed,
  and all of them are multiplied by the stack's scale;
* the input embeddings given are drawn N(0, d^-1/2) (their padding row zeroed) and multiplied by the
  scale; a weight shared by several modules (tied input/output embeddings) is one parameter and is
  scaled once, with the first stack's factor;
* nothing else is touched: q/k projections (torch draws them Xavier already), biases of attention,
  positional embeddings, and an untied output projection keep their initialisation (T-Fixup's
  conditions do not involve them).

It returns what it did: parameter name -> scale (fused value rows as ``...in_proj_weight[v]``).
"""

import dataclasses
from typing import Dict, Iterable, Optional, Sequence, Union

import torch
from torch import nn

from tfixup import applier, hf, tfixup_init
from tfixup.applier import Draw

TORCH_STACKS = (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder)

Attention = Union[nn.MultiheadAttention, Sequence[nn.Linear]]


@dataclasses.dataclass
class Layer:
    """One layer of a custom residual stack: ``attention`` holds each of its attentions, either an
    ``nn.MultiheadAttention`` or a pair ``(value, output)`` of ``nn.Linear``; ``mlp`` its MLP's linear
    layers (weights scaled, biases zeroed). ``qkv=True``: each pair's first ``nn.Linear`` is a fused
    projection whose output rows are ``[q | k | v]`` (three blocks the size of the output projection's
    input, as nanoGPT's ``c_attn``): only its value rows, the last third, are drawn and scaled."""

    attention: Sequence[Attention]
    mlp: Sequence[nn.Linear] = ()
    qkv: bool = False


@torch.no_grad()
def apply_tfixup(model: nn.Module, *, embeddings: Iterable[nn.Module] = (),
                 decoder_embeddings: Iterable[nn.Module] = (), layers: Optional[Sequence[Layer]] = None,
                 decoder_layers: Optional[Sequence[Layer]] = None, input_scale: bool = True,
                 keep_mlp_norm: bool = False, gated_mlp: Optional[str] = None,
                 keep_head_norm: bool = False) -> Dict[str, float]:
    """Apply T-Fixup to ``model`` in place; returns parameter name -> the scale it was multiplied by.

    ``embeddings``: the input token embeddings (``nn.Embedding``, or any module with a 2-D ``weight`` of
    rows = tokens) of the stack, or of the encoder of an encoder-decoder; ``decoder_embeddings``: the
    decoder's. ``layers`` (and ``decoder_layers``) describe a custom stack; leave them out for torch's
    ``nn.Transformer``, ``nn.TransformerEncoder`` and ``nn.TransformerDecoder``. Everything is checked
    before anything is changed: a refused model is left as it was. ``input_scale`` (HuggingFace models): a
    model type with no embedding multiplier gets fairseq's sqrt(d) on its token embedding's output
    (tfixup/hf.py); a model built here owns its forward, and multiplies by sqrt(d) itself as fairseq does.
    ``keep_mlp_norm`` (HuggingFace Llama-family models): keep the RMSNorm before each gated MLP (tfixup/hf.py).
    ``gated_mlp`` (HuggingFace Llama-family models): "sigmoid" or "scaled", a norm-free gated MLP (tfixup/hf.py).
    ``keep_head_norm`` (HuggingFace BERT and RoBERTa): keep the masked-LM head's LayerNorm (tfixup/hf.py).
    """
    _refuse_wrapped_or_unallocated(model)
    embeddings, decoder_embeddings = list(embeddings), list(decoder_embeddings)
    if hf.is_hf_model(model) and layers is None and decoder_layers is None:
        if embeddings or decoder_embeddings:
            raise ValueError(f"apply_tfixup: {type(model).__name__} is a HuggingFace model whose embeddings "
                             "apply_tfixup finds itself: call apply_tfixup(model) without embeddings=")
        return hf.apply_tfixup(model, input_scale, keep_mlp_norm, gated_mlp, keep_head_norm)  # tfixup/hf.py
    if keep_mlp_norm:
        raise ValueError(f"apply_tfixup: keep_mlp_norm is for HuggingFace Llama-family models; {type(model).__name__} "
                         "is described by layers=: keep the norms you want by not replacing them")
    if keep_head_norm:
        raise ValueError(f"apply_tfixup: keep_head_norm is for HuggingFace BERT and RoBERTa; {type(model).__name__} "
                         "is described by layers=: keep the norms you want by not replacing them")
    if gated_mlp is not None:
        raise ValueError(f"apply_tfixup: gated_mlp is for HuggingFace Llama-family models; {type(model).__name__} "
                         "is described by layers=: change its MLP yourself")
    if hf.is_hf_model(model) and getattr(model.config, "model_type", None) in hf.SUPPORTED:
        raise ValueError(f"apply_tfixup: {type(model).__name__} is a HuggingFace {model.config.model_type} model, "
                         "whose layers apply_tfixup reads itself: call apply_tfixup(model) without layers=")
    if isinstance(model, TORCH_STACKS):
        if layers is not None or decoder_layers is not None:
            raise ValueError(f"apply_tfixup: {type(model).__name__} has its own layers: leave out layers= and "
                             "decoder_layers=")
        stacks = _torch_stacks(model, embeddings, decoder_embeddings)
    elif layers is None:
        raise ValueError(f"apply_tfixup: unknown layout {type(model).__name__}: pass layers=[Layer(attention=..., "
                         "mlp=...), ...] naming each layer's value, output and MLP projections")
    elif decoder_layers is None:
        if decoder_embeddings:
            raise ValueError("apply_tfixup: decoder_embeddings= without decoder_layers=: a single stack takes "
                             "embeddings= only")
        _refuse_norms(model)
        stacks = [("single", layers, embeddings)]
    else:
        _refuse_norms(model)
        stacks = [("encoder", layers, embeddings), ("decoder", decoder_layers, decoder_embeddings)]
    stacks = [(role, "decoder_layers" if role == "decoder" and len(stacks) == 2 else "layers",
               "decoder_embeddings" if role == "decoder" else "embeddings", stack_layers, stack_embeddings)
              for role, stack_layers, stack_embeddings in stacks]  # with the arguments that name them
    for role, what, embeds, stack_layers, stack_embeddings in stacks:
        _check_layers(stack_layers, what, max_attention=2 if role == "decoder" else 1)
        for i, embedding in enumerate(stack_embeddings):
            _embedding_weight(embedding, f"{embeds}[{i}]")
    torch_stacks = [stack for _, stack in _torch_modules(model)] if isinstance(model, TORCH_STACKS) else []
    norms = [(parent, attr) for stack in torch_stacks for parent, attr in _torch_norms(stack)]
    done = applier.execute(model, applier.Plan(_draws(stacks), norms))
    for stack in torch_stacks:
        _without_fused_path(stack)
    return done


def _draws(stacks):
    """The plan's draws, stack by stack: each layer's value and output projections and MLP, then the stack's
    embeddings; a tensor outside the model is named by its place in the arguments."""
    draws = []
    for role, what, embeds, stack_layers, stack_embeddings in stacks:
        scale, embed_scale = tfixup_init.stack_factors(role, len(stack_layers))
        for i, layer in enumerate(stack_layers):
            for j, attention in enumerate(layer.attention):
                for weight, rows, part in _value_and_output(attention, layer.qkv):
                    draws.append(Draw(weight, "xavier", scale, f"{role} {part}", index=rows,
                                      label="" if rows is None else "[v]", name=f"{what}[{i}].attention[{j}].{part}"))
            for k, linear in enumerate(layer.mlp):
                draws.append(Draw(linear.weight, "xavier", scale, f"{role} MLP", name=f"{what}[{i}].mlp[{k}].weight"))
                if linear.bias is not None:
                    draws.append(Draw(linear.bias, "zeros", 1.0, f"{role} MLP bias"))
        for i, embedding in enumerate(stack_embeddings):
            # a module outside MODEL (the usual nn.Transformer set-up): by the argument that passed it
            draws.append(Draw(_embedding_weight(embedding, f"{embeds}[{i}]"), "normal", embed_scale,
                              f"{role} token embedding", padding_idx=getattr(embedding, "padding_idx", None),
                              name=f"{embeds}[{i}].weight"))
    return draws


def _refuse_wrapped_or_unallocated(model: nn.Module) -> None:
    """A model inside a wrapper (DataParallel, DDP, FSDP, torch.compile, PEFT, DeepSpeed), sharded (DTensor
    parameters: fully_shard, tensor parallel) or not allocated (the meta device) is refused in one line: T-Fixup
    reads the model's own layers and draws real tensors. NaN or inf in a parameter (memory left unset after
    ``to_empty``) is refused too: the weights T-Fixup leaves would be garbage."""
    name = type(model).__name__
    peft = any(c.__module__.startswith("peft.") for c in type(model).__mro__)
    inner = "model._orig_mod" if hasattr(model, "_orig_mod") else None  # torch.compile's OptimizedModule
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) or \
            (type(model).__module__.startswith(("torch.distributed.fsdp", "deepspeed.")) and hasattr(model, "module")):
        inner = "model.module"
    if inner or peft:
        raise ValueError(f"apply_tfixup: {name} wraps the model: apply it before wrapping"
                         + (" (before get_peft_model: its adapters replace the layers T-Fixup draws)" if peft else
                            f", or pass {inner}"))
    if any(c.__module__.startswith("torch.distributed.fsdp") for c in type(model).__mro__):  # fully_shard (FSDP2)
        raise ValueError(f"apply_tfixup: {name} is sharded by fully_shard: apply it before sharding, on the whole "
                         "model")
    for pname, p in model.named_parameters():
        if p.is_meta:
            raise ValueError(f"apply_tfixup: {name}: {pname} is on the meta device (not allocated): T-Fixup draws "
                             "weights; materialise the model first (model.to_empty(device=...); model.init_weights() "
                             "for a HuggingFace model, your own init otherwise), then apply_tfixup")
        if hasattr(p, "ds_id"):  # DeepSpeed ZeRO-3 keeps a placeholder here, the weight partitioned across ranks
            raise ValueError(f"apply_tfixup: {name}: {pname} is partitioned by DeepSpeed ZeRO-3: apply it before "
                             "deepspeed.initialize, to a model built outside deepspeed.zero.Init")
        if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
            raise ValueError(f"apply_tfixup: {name}: {pname} is sharded (a DTensor: fully_shard or tensor "
                             "parallel): apply it before sharding, on the whole model")
        if p.is_floating_point() and not torch.isfinite(p).all():
            raise ValueError(f"apply_tfixup: {name}: {pname} holds NaN or inf (memory left unset after to_empty?): "
                             "initialise the model first (model.init_weights() for a HuggingFace model), then "
                             "apply_tfixup")


# ---------------------------------------------------------------- torch's own Transformer modules


def _torch_modules(model):
    """(role, stack module) of a torch Transformer module. nn.TransformerDecoder alone is the decoder of some
    encoder-decoder (its layers attend to a memory): the paper's decoder rule."""
    if isinstance(model, nn.Transformer):
        return [("encoder", model.encoder), ("decoder", model.decoder)]
    if isinstance(model, nn.TransformerEncoder):
        return [("single", model)]
    return [("decoder", model)]


def _torch_stacks(model, embeddings, decoder_embeddings):
    """[(role, Layers, embeddings)] of a torch Transformer module; refuses Pre-LN layers."""
    modules = _torch_modules(model)
    if len(modules) == 1 and decoder_embeddings:
        if modules[0][0] == "single":
            raise ValueError("apply_tfixup: nn.TransformerEncoder is one stack: pass its input embedding as "
                             "embeddings=, not decoder_embeddings=")
        embeddings, decoder_embeddings = [*embeddings, *decoder_embeddings], []
    out = []
    for (role, stack), stack_embeddings in zip(modules, (embeddings, decoder_embeddings)):
        if not isinstance(stack, (nn.TransformerEncoder, nn.TransformerDecoder)):
            raise ValueError(f"apply_tfixup: the {role} is a custom {type(stack).__name__}, not torch's: call "
                             "apply_tfixup on a module holding the model, with layers= and decoder_layers= naming "
                             "both stacks' projections")
        stack_layers = []
        for i, layer in enumerate(stack.layers):
            if getattr(layer, "norm_first", False):
                raise ValueError(f"apply_tfixup: {role} layer {i} has norm_first=True (Pre-LN, a method that keeps "
                                 "its LayerNorms); T-Fixup replaces Post-LN's LayerNorms: build the layers with "
                                 "norm_first=False")
            attentions = [layer.self_attn] + ([layer.multihead_attn] if hasattr(layer, "multihead_attn") else [])
            stack_layers.append(Layer(attention=attentions, mlp=[layer.linear1, layer.linear2]))
        out.append((role, stack_layers, stack_embeddings))
    return out


def _torch_norms(stack: nn.Module):
    """(parent, attribute) of each LayerNorm of a torch stack: its layers' norm1..3 and its final norm."""
    return [(layer, name) for layer in stack.layers for name in ("norm1", "norm2", "norm3") if hasattr(layer, name)] \
        + ([(stack, "norm")] if stack.norm is not None else [])


def _without_fused_path(stack: nn.Module) -> None:
    for layer in stack.layers:
        if hasattr(layer, "activation_relu_or_gelu"):
            # the encoder layer's fused inference kernel computes stock Post-LN (and reads norm1.eps): a
            # falsy flag is the first of its conditions this layer can fail, so it never takes it
            layer.activation_relu_or_gelu = 0
    if isinstance(stack, nn.TransformerEncoder):
        stack.use_nested_tensor = False  # the same fused kernel, entered from the stack


# ---------------------------------------------------------------- one attention, one tensor


def _value_and_output(attention, qkv: bool = False):
    """[(weight, rows or None, part)]: the value projection (a fused in_proj_weight's or ``qkv`` Linear's value
    rows) and the output projection of one attention; one-line errors for a layout it cannot read."""
    if isinstance(attention, nn.MultiheadAttention):
        if attention.in_proj_weight is not None:
            weight, e = attention.in_proj_weight, attention.embed_dim
            if tuple(weight.shape) != (3 * e, e):
                raise ValueError(f"apply_tfixup: fused in_proj_weight of shape {tuple(weight.shape)} is not "
                                 f"(3*{e}, {e}): cannot find its value rows")
            value = (weight, slice(2 * e, 3 * e), "in_proj_weight")  # rows: q, k, v stacked
        elif getattr(attention, "v_proj_weight", None) is not None:
            value = (attention.v_proj_weight, None, "v_proj_weight")
        else:
            raise ValueError("apply_tfixup: nn.MultiheadAttention with neither in_proj_weight nor v_proj_weight: "
                             "unknown layout")
        return [value, (attention.out_proj.weight, None, "out_proj.weight")]
    pair = list(attention) if isinstance(attention, (list, tuple)) else None
    if not pair or len(pair) != 2 or not all(isinstance(m, nn.Linear) for m in pair):
        kinds = ", ".join(type(m).__name__ for m in pair) if pair else type(attention).__name__
        hint = (" (a HuggingFace GPT-2 block: call apply_tfixup(model) on the model, without layers=)"
                if "Conv1D" in kinds else "")
        raise ValueError(f"apply_tfixup: an attention must be nn.MultiheadAttention or a (value, output) pair of "
                         f"nn.Linear, got {kinds}{hint}")
    value, out = pair
    e = out.in_features
    if qkv:
        if value.out_features != 3 * e:
            raise ValueError(f"apply_tfixup: Layer(qkv=True) but the fused projection gives {value.out_features} "
                             f"features, not 3 x the {e} the output projection takes: its rows are not [q | k | v]")
        return [(value.weight, slice(2 * e, 3 * e), "value.weight"), (out.weight, None, "output.weight")]
    if value.out_features == 3 * e:
        raise ValueError(f"apply_tfixup: the value projection gives {value.out_features} features, 3 x the {e} the "
                         "output projection takes: a fused qkv Linear; if its output rows are [q | k | v] (nanoGPT's "
                         "c_attn), pass Layer(..., qkv=True) (a HuggingFace model: apply_tfixup(model) without "
                         "layers=)")
    if value.out_features > e or e % value.out_features:  # fewer: grouped value heads, each read by e/out queries
        raise ValueError(f"apply_tfixup: the value projection gives {value.out_features} features but the output "
                         f"projection takes {e} (neither equal nor a whole number of grouped heads): the pair swapped?")
    return [(value.weight, None, "value.weight"), (out.weight, None, "output.weight")]


def _embedding_weight(embedding, where: str) -> torch.Tensor:
    if isinstance(embedding, torch.Tensor):
        weight = embedding
    else:
        weight = getattr(embedding, "weight", None)
        if isinstance(weight, torch.Tensor):
            _check_module_weight(embedding, f"{where} ({type(embedding).__name__})")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"apply_tfixup: {where}: {type(embedding).__name__} has no 2-D weight (tokens x dim)")
    _check_dtype(weight, f"{where} ({type(embedding).__name__})")
    return weight


def _check_module_weight(module: nn.Module, where: str) -> None:
    """MODULE's ``weight`` is its own parameter, which T-Fixup can set: refused when weight norm computes it
    from other parameters (changing the computed tensor would change nothing)."""
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(module, "weight") or hasattr(module, "weight_g") or \
            "weight" not in module._parameters:
        raise ValueError(f"apply_tfixup: {where} has a weight computed by weight norm (or another "
                         "parametrization), which T-Fixup cannot set: remove it first "
                         "(torch.nn.utils.parametrize.remove_parametrizations(module, 'weight'), or "
                         "torch.nn.utils.remove_weight_norm(module) for the legacy weight_norm)")
    _check_dtype(module.weight, where)


def _check_dtype(weight: torch.Tensor, where: str) -> None:
    if not weight.is_floating_point():
        raise ValueError(f"apply_tfixup: {where} has a {weight.dtype} weight: T-Fixup draws floating-point "
                         "weights; give the module a float weight (e.g. module.float())")


# ---------------------------------------------------------------- checks


def _check_layers(layers, what: str, max_attention: int) -> None:
    if not layers:
        raise ValueError(f"apply_tfixup: {what} is empty: T-Fixup needs at least one layer")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise ValueError(f"apply_tfixup: {what}[{i}] is {type(layer).__name__}, not tfixup.torch_tfixup.Layer")
        if not 1 <= len(layer.attention) <= max_attention:
            role = ("a decoder layer has self- and encoder-attention" if max_attention == 2 else
                    "a layer of one stack (or an encoder) has one self-attention; an encoder-decoder's "
                    "decoder goes in decoder_layers=")
            raise ValueError(f"apply_tfixup: {what}[{i}] has {len(layer.attention)} attentions: {role}")
        for j, attention in enumerate(layer.attention):
            _value_and_output(attention, layer.qkv)
            linears = [attention.out_proj] if isinstance(attention, nn.MultiheadAttention) else list(attention)
            for part, linear in zip(("output",) if len(linears) == 1 else ("value", "output"), linears):
                _check_module_weight(linear, f"{what}[{i}].attention[{j}].{part}")
            if isinstance(attention, nn.MultiheadAttention):
                for weight, _, part in _value_and_output(attention, layer.qkv)[:1]:
                    _check_dtype(weight, f"{what}[{i}].attention[{j}].{part}")
        for k, linear in enumerate(layer.mlp):
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"apply_tfixup: {what}[{i}].mlp holds {type(linear).__name__}: list its nn.Linear "
                                 "layers")
            _check_module_weight(linear, f"{what}[{i}].mlp[{k}]")


def _refuse_norms(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if applier.is_norm(module):
            raise ValueError(f"apply_tfixup: {name or 'the model'} is a {type(module).__name__}; T-Fixup trains "
                             "without LayerNorm: replace it with nn.Identity() first")

