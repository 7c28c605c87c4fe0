"""T-Fixup initialisation rules (Huang et al., ICML 2020, §3.2), as pure functions.

This module knows nothing about torch: it maps a parameter name of a fairseq
encoder-decoder Transformer and the two stack depths to what T-Fixup does to
that parameter. ``models/transformer_tfixup.py`` applies the rules; the tests
read them against the paper.

The paper, §3.2, with N the number of layers of that stack:

* "Apply Xavier initialization for all parameters excluding input embeddings.
  Use Gaussian initialization N(0, d^-1/2) for input embeddings."
* "Scale v_d and w_d matrices in each decoder attention block, weight matrices
  in each decoder MLP block and input embeddings x and y in encoder and decoder
  by (9N)^-1/4."
* "Scale v_e and w_e matrices in each encoder attention block and weight
  matrices in each encoder MLP block by 0.67 N^-1/4."

v is an attention's value projection (fairseq ``v_proj``), w its output
projection (``out_proj``); the MLP weights are ``fc1`` and ``fc2``.

What fairseq 0.12 gives us, and why some weights are drawn again:

* ``fc1``/``fc2`` are plain ``nn.Linear`` (PyTorch's default, Kaiming-uniform
  with a=sqrt(5)), not Xavier as in the fairseq 0.9 the authors used; we
  redraw them Xavier-uniform with zero bias (fairseq 0.9's ``Linear``).
* ``v_proj`` is Xavier with gain 1/sqrt(2) when q, k and v share a dimension
  (plain Xavier otherwise). T-Fixup wants plain Xavier, i.e. the authors'
  extra factor sqrt(2); redrawing with gain 1 gives exactly that in both cases.
* ``out_proj`` is already plain Xavier; token embeddings are already
  N(0, d^-1/2) (fairseq's ``Embedding``), so both are only scaled.
* A shared embedding matrix is one parameter and is scaled once, with the
  encoder's factor (as the authors' code does with ``--share-all-embeddings``).

``lm_rule_for`` is the same for a single stack (a decoder-only language model,
fairseq's ``transformer_lm``, whose parameters are named ``decoder.*``): the
same redraws, and one factor, ``single_stack_scale`` (docs/derivation.md), for
the self-attention v/out, MLP weights and the token embedding; a tied
input/output embedding is one parameter, scaled once.
"""

import math
import re
from typing import NamedTuple

ENCODER_CONSTANT = 0.67

_ATTENTION = re.compile(r"^(encoder|decoder)\.layers\.\d+\.(self_attn|encoder_attn)\.(v_proj|out_proj)\.weight$")
_MLP = re.compile(r"^(encoder|decoder)\.layers\.\d+\.(fc1|fc2)\.weight$")
_MLP_BIAS = re.compile(r"^(encoder|decoder)\.layers\.\d+\.(fc1|fc2)\.bias$")
_EMBEDDING = re.compile(r"^(encoder|decoder)\.embed_tokens\.weight$")


class Rule(NamedTuple):
    """What T-Fixup does to one parameter: redraw it first, then multiply it."""

    redraw: str  # "" (keep fairseq's init), "xavier" (Xavier-uniform, gain 1) or "zeros"
    scale: float


KEEP = Rule("", 1.0)


def encoder_scale(num_layers: int) -> float:
    """0.67 N_enc^-1/4: encoder attention v/out and MLP weights."""
    _check_layers(num_layers)
    return ENCODER_CONSTANT * num_layers ** -0.25


def decoder_scale(num_layers: int) -> float:
    """(9 N_dec)^-1/4: decoder attention v/out (self and encoder) and MLP weights."""
    _check_layers(num_layers)
    return (9 * num_layers) ** -0.25


def embedding_scale(num_layers: int) -> float:
    """(9 N)^-1/4 for the token embedding of a stack with N layers."""
    _check_layers(num_layers)
    return (9 * num_layers) ** -0.25


def single_stack_scale(num_layers: int) -> float:
    """(6N)^-1/4 = (3L)^-1/4 for a stack of N layers on its own (decoder-only or encoder-only, L = 2N
    blocks, no memory): its attention v/out, MLP weights and token embedding. Eq. 6's condition with
    ||v|| = ||w|| = ||x|| (docs/derivation.md); not in the paper, which derives the encoder-decoder only."""
    _check_layers(num_layers)
    return (6 * num_layers) ** -0.25


def rule_for(name: str, encoder_layers: int, decoder_layers: int) -> Rule:
    """The T-Fixup rule for parameter ``name`` of a model built by fairseq.

    ``name`` is as ``model.named_parameters()`` yields it, e.g.
    ``decoder.layers.3.encoder_attn.v_proj.weight``. Parameters that T-Fixup
    does not mention (q/k projections, biases, positional and output
    embeddings of an unshared output layer) keep fairseq's initialisation.
    """
    layers = {"encoder": encoder_layers, "decoder": decoder_layers}
    stack_scale = {"encoder": encoder_scale, "decoder": decoder_scale}

    m = _EMBEDDING.match(name)
    if m:
        return Rule("", embedding_scale(layers[m.group(1)]))
    m = _ATTENTION.match(name)
    if m:
        stack, _, proj = m.groups()
        return Rule("xavier" if proj == "v_proj" else "", stack_scale[stack](layers[stack]))
    m = _MLP.match(name)
    if m:
        stack = m.group(1)
        return Rule("xavier", stack_scale[stack](layers[stack]))
    if _MLP_BIAS.match(name):
        return Rule("zeros", 1.0)
    return KEEP


_LM_ATTENTION = re.compile(r"^decoder\.layers\.\d+\.self_attn\.(v_proj|out_proj)\.weight$")
_LM_MLP = re.compile(r"^decoder\.layers\.\d+\.(fc1|fc2)\.weight$")
_LM_MLP_BIAS = re.compile(r"^decoder\.layers\.\d+\.(fc1|fc2)\.bias$")
_LM_EMBEDDING = "decoder.embed_tokens.weight"


def lm_rule_for(name: str, num_layers: int) -> Rule:
    """The T-Fixup rule for parameter ``name`` of a decoder-only language model of ``num_layers``
    layers built by fairseq (``transformer_lm``: self-attention and MLP blocks, no encoder memory).

    ``name`` is as ``model.named_parameters()`` yields it, e.g.
    ``decoder.layers.3.self_attn.v_proj.weight`` or ``decoder.embed_tokens.weight``. The factor is
    ``single_stack_scale(num_layers)`` everywhere; q/k projections, biases other than the MLP's,
    positional embeddings and an untied output projection keep fairseq's initialisation.
    """
    scale = single_stack_scale(num_layers)
    if name == _LM_EMBEDDING:
        return Rule("", scale)
    m = _LM_ATTENTION.match(name)
    if m:
        return Rule("xavier" if m.group(1) == "v_proj" else "", scale)
    if _LM_MLP.match(name):
        return Rule("xavier", scale)
    if _LM_MLP_BIAS.match(name):
        return Rule("zeros", 1.0)
    return KEEP


def xavier_uniform_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """Standard deviation of Glorot/Xavier-uniform: gain * sqrt(2 / (fan_in + fan_out))."""
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def _check_layers(num_layers: int) -> None:
    if num_layers < 1:
        raise ValueError(f"T-Fixup needs at least one layer per stack, got {num_layers}")
