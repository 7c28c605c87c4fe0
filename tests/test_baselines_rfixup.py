"""transformer_rfixup (Fixup, Zhang et al. 2019) read against Fixup's rules 1-3; decoding; one CLI run."""

import math

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_tfixup.baselines import rfixup
from fairseq_tfixup.models.transformer_tfixup import is_layer_norm

from model_checks import (
    assert_encoder_survives_state_dict_round_trip,
    assert_incremental_decoding_matches_full,
    build_tiny,
    trained_looking_,
)


def _xavier_std(p, gain=1.0):
    fan_out, fan_in = p.shape
    return gain * math.sqrt(2 / (fan_in + fan_out))


def test_rules_1_to_3_on_every_parameter(dict_dir):
    n_enc, n_dec = 2, 3
    model, _, _ = build_tiny(dict_dir, "transformer_rfixup", n_enc, n_dec)
    L = 2 * n_enc + 3 * n_dec
    assert rfixup.num_branches(n_enc, n_dec) == L == 13
    seen = {"scaled_qkv": 0, "fc1": 0, "zero": 0, "bias": 0, "multiplier": 0}
    for name, p in model.named_parameters():
        leaf = name.split(".")[-1]
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            # fairseq's Xavier with gain 1/sqrt(2) (the authors' joint in_proj) times L^-1/6 (m = 4)
            assert p.std().item() == pytest.approx(_xavier_std(p, 2 ** -0.5) * L ** (-1 / 6), rel=0.05), name
            seen["scaled_qkv"] += 1
        elif name.endswith("fc1.weight"):  # redrawn Xavier times L^-1/2 (m = 2)
            assert p.std().item() == pytest.approx(_xavier_std(p) * L ** -0.5, rel=0.05), name
            assert p.abs().max().item() <= _xavier_std(p) * L ** -0.5 * math.sqrt(3) * 1.0001, name
            seen["fc1"] += 1
        elif name.endswith(("out_proj.weight", "fc2.weight")) or name == "decoder.output_projection.weight":
            assert torch.count_nonzero(p) == 0, name  # rule 1: last layer of each branch, classifier
            seen["zero"] += 1
        elif leaf in ("bias", "bias_in", "bias_out"):
            assert p.shape == (1,) and p.item() == 0.0, name  # rule 3: scalar biases at 0
            seen["bias"] += 1
        elif leaf == "scale":
            assert p.shape == (1,) and p.item() == 1.0, name  # rule 3: scalar multipliers at 1
            seen["multiplier"] += 1
        else:
            assert "embed_tokens" in name, name  # nothing else is trainable
    assert seen["scaled_qkv"] == 3 * (n_enc + 2 * n_dec)
    assert seen["fc1"] == n_enc + n_dec
    assert seen["zero"] == L + 1
    assert seen["multiplier"] == L + 1  # one per branch, plus the encoder output's
    assert seen["bias"] == 4 * n_enc + 5 * n_dec + 2  # attention inputs, fc1 in/out, fc2 in; two stack outputs
    assert not [n for n, m in model.named_modules() if is_layer_norm(m)]
    # per-unit biases are constant zero buffers, not parameters
    buffers = dict(model.named_buffers())
    assert torch.count_nonzero(buffers["encoder.layers.0.fc1.bias"]) == 0
    assert "encoder.layers.0.self_attn.q_proj.bias" in buffers


def test_each_stack_starts_as_the_identity(dict_dir):
    """Zero last layers: every branch adds 0, so the encoder returns its embeddings and the logits are 0."""
    model, _, _ = build_tiny(dict_dir, "transformer_rfixup", 3, 3)
    model.eval()
    src = torch.randint(4, 500, (2, 7))
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.full((2,), 7))
        embedded, _ = model.encoder.forward_embedding(src)
        torch.testing.assert_close(enc["encoder_out"][0], embedded.transpose(0, 1))
        logits, _ = model(src, torch.full((2,), 7), src[:, :5])
    assert torch.count_nonzero(logits) == 0


def test_scalars_act_where_fixup_puts_them(dict_dir):
    """y = s * W(x + b) for a branch's last layer; attention's multiplier scales its output."""
    layer = rfixup.FixupLinear(4, 3, multiplier=True)
    with torch.no_grad():
        layer.bias_in.fill_(0.5)
        layer.scale.fill_(2.0)
    x = torch.randn(5, 4)
    torch.testing.assert_close(layer(x), 2.0 * (x + 0.5) @ layer.weight.T)
    model, _, _ = build_tiny(dict_dir, "transformer_rfixup", 1, 1)
    trained_looking_(model)
    attn = model.encoder.layers[0].self_attn
    x = torch.randn(6, 2, 64)
    with torch.no_grad():
        before, _ = attn(query=x, key=x, value=x)
        attn.scale.mul_(3.0)
        after, _ = attn(query=x, key=x, value=x)
    torch.testing.assert_close(after, 3.0 * before)
    # the input bias shifts queries, keys and values alike: attention(x) with b == attention(x + b) without
    with torch.no_grad():
        attn.bias_in.fill_(0.7)
        shifted, _ = attn(query=x, key=x, value=x)
        attn.bias_in.zero_()
        moved, _ = attn(query=x + 0.7, key=x + 0.7, value=x + 0.7)
    torch.testing.assert_close(shifted, moved)


def test_incremental_decoding_equals_full_forward(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_rfixup", 2, 3, "--share-decoder-input-output-embed")
    model = trained_looking_(model)
    assert_incremental_decoding_matches_full(model)
    assert_encoder_survives_state_dict_round_trip(model)


RFIXUP_ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m is rfixup.RFixupTransformerModel)


@pytest.mark.parametrize("flag, message", [
    (["--encoder-normalize-before"], "has no LayerNorm: --encoder-normalize-before cannot be used"),
    (["--decoder-normalize-before"], "has no LayerNorm: --decoder-normalize-before cannot be used"),
    (["--layernorm-embedding"], "has no LayerNorm: --layernorm-embedding cannot be used"),
])
def test_flags_that_bring_layer_norm_back_are_refused(flag, message, dict_dir):
    with pytest.raises(ValueError, match=message) as err:
        build_tiny(dict_dir, "transformer_rfixup", 1, 1, *flag)
    assert "\n" not in str(err.value)
