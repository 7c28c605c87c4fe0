"""The scaling rules, read against §3.2 of the paper (pure module, no fairseq)."""

import math

import pytest

from tfixup import tfixup_init as ti


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


def test_stack_factors_by_role():
    assert ti.stack_factors("encoder", 3) == (ti.encoder_scale(3), ti.embedding_scale(3))
    assert ti.stack_factors("decoder", 7) == ((9 * 7) ** -0.25, (9 * 7) ** -0.25)
    assert ti.stack_factors("single", 5) == ((6 * 5) ** -0.25, (6 * 5) ** -0.25)


def test_zero_layers_is_an_error():
    with pytest.raises(ValueError, match="at least one layer"):
        ti.encoder_scale(0)
    with pytest.raises(ValueError, match="at least one layer"):
        ti.stack_factors("decoder", 0)
