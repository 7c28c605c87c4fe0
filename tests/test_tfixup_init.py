"""The scaling rules, read against §3.2 of the paper (pure module, no fairseq)."""

import math

import pytest

from tfixup import tfixup_init as ti
from tfixup.tfixup_init import Rule


def test_factors_match_the_paper():
    # decoder and embeddings: (9N)^-1/4; at N=1 that is 9^-1/4 = 1/sqrt(3)
    assert ti.decoder_scale(1) == pytest.approx(1 / math.sqrt(3))
    assert ti.embedding_scale(1) == pytest.approx(1 / math.sqrt(3))
    assert ti.decoder_scale(6) == pytest.approx(54 ** -0.25) == pytest.approx(0.36889, abs=1e-5)
    # encoder: 0.67 N^-1/4
    assert ti.encoder_scale(1) == pytest.approx(0.67)
    assert ti.encoder_scale(6) == pytest.approx(0.42809, abs=1e-5)
    assert ti.encoder_scale(200) == pytest.approx(0.67 / 200 ** 0.25)
    # a 16x deeper stack gets half the factor
    assert ti.encoder_scale(96) == pytest.approx(ti.encoder_scale(6) / 2)
    assert ti.decoder_scale(96) == pytest.approx(ti.decoder_scale(6) / 2)


@pytest.mark.parametrize("name, expected", [
    # encoder: self-attention v (redrawn plain Xavier = fairseq's gain 1/sqrt(2) times sqrt(2)) and out, MLP
    ("encoder.layers.0.self_attn.v_proj.weight", Rule("xavier", 0.67 * 3 ** -0.25)),
    ("encoder.layers.2.self_attn.out_proj.weight", Rule("", 0.67 * 3 ** -0.25)),
    ("encoder.layers.1.fc1.weight", Rule("xavier", 0.67 * 3 ** -0.25)),
    ("encoder.layers.1.fc2.weight", Rule("xavier", 0.67 * 3 ** -0.25)),
    ("encoder.embed_tokens.weight", Rule("", (9 * 3) ** -0.25)),
    # decoder: self and encoder attention, MLP, embedding, all (9 N_dec)^-1/4
    ("decoder.layers.6.self_attn.v_proj.weight", Rule("xavier", (9 * 7) ** -0.25)),
    ("decoder.layers.0.encoder_attn.v_proj.weight", Rule("xavier", (9 * 7) ** -0.25)),
    ("decoder.layers.0.encoder_attn.out_proj.weight", Rule("", (9 * 7) ** -0.25)),
    ("decoder.layers.3.self_attn.out_proj.weight", Rule("", (9 * 7) ** -0.25)),
    ("decoder.layers.3.fc2.weight", Rule("xavier", (9 * 7) ** -0.25)),
    ("decoder.embed_tokens.weight", Rule("", (9 * 7) ** -0.25)),
    # fc biases: zero, like fairseq 0.9's Linear
    ("decoder.layers.3.fc1.bias", Rule("zeros", 1.0)),
    # untouched: q/k, attention biases, unshared output projection, positions
    ("encoder.layers.0.self_attn.q_proj.weight", ti.KEEP),
    ("decoder.layers.0.encoder_attn.k_proj.weight", ti.KEEP),
    ("decoder.layers.0.self_attn.v_proj.bias", ti.KEEP),
    ("decoder.output_projection.weight", ti.KEEP),
    ("encoder.embed_positions.weight", ti.KEEP),
])
def test_rule_for_names(name, expected):
    rule = ti.rule_for(name, encoder_layers=3, decoder_layers=7)
    assert rule.redraw == expected.redraw
    assert rule.scale == pytest.approx(expected.scale)


def test_zero_layers_is_an_error():
    with pytest.raises(ValueError, match="at least one layer"):
        ti.encoder_scale(0)
    with pytest.raises(ValueError, match="at least one layer"):
        ti.rule_for("decoder.layers.0.fc1.weight", 6, 0)
