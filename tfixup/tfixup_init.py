"""T-Fixup initialisation rules (Huang et al., ICML 2020, §3.2), as pure functions.

This module knows nothing about torch: it gives the factor of each part of a stack of N layers.
``tfixup/applier.py`` applies them (its adapters name each model's parts); the tests read them
against the paper.

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

What fairseq 0.12 gives us, and why some weights are drawn again
(``applier.fairseq_layout``):

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

A single stack (a decoder-only language model, fairseq's ``transformer_lm``, or an
encoder alone) takes one factor, ``single_stack_scale`` (docs/derivation.md), for its
attention v/out, MLP weights and token embedding.
"""

import math
from typing import Tuple

ENCODER_CONSTANT = 0.67


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


def stack_factors(role: str, num_layers: int) -> Tuple[float, float]:
    """(blocks, token embedding) factors of a stack of ``num_layers`` by its role: "encoder" (0.67 N^-1/4,
    (9N)^-1/4), "decoder" ((9N)^-1/4, (9N)^-1/4) or "single", a stack on its own ((6N)^-1/4 both)."""
    if role == "encoder":
        return encoder_scale(num_layers), embedding_scale(num_layers)
    if role == "decoder":
        return decoder_scale(num_layers), embedding_scale(num_layers)
    return single_stack_scale(num_layers), single_stack_scale(num_layers)


def xavier_uniform_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """Standard deviation of Glorot/Xavier-uniform: gain * sqrt(2 / (fan_in + fan_out))."""
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def _check_layers(num_layers: int) -> None:
    if num_layers < 1:
        raise ValueError(f"T-Fixup needs at least one layer per stack, got {num_layers}")
