"""transformer_dyt and transformer_lm_dyt (Zhu et al., 2025): DyT(x) = gamma * tanh(alpha * x) + beta against
the formula, its initialisation, every LayerNorm of the Pre-LN Transformer replaced (encoder-decoder and LM),
fairseq's own weights elsewhere, the Pre-LN sublayer, and the language model trained by fairseq-train
(decoding, a state-dict round trip and the translation model's training: tests/test_methods.py, as for every
row)."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_tfixup.baselines.dyt import ALPHA0, DyT
from tfixup import methods

from model_checks import build_tiny, train_lm_briefly, trained_looking_
from test_lm import build_lm, layer_norms, lm_bin  # noqa: F401  (lm_bin: the fixture)

N_ENC, N_DEC = 3, 2


def dyts(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, DyT)}


def test_dyt_is_gamma_tanh_alpha_x_plus_beta():
    dyt = DyT(3)
    x = torch.tensor([[0.0, 1.0, -2.0]])
    # at initialisation (alpha 0.5, gamma 1, beta 0): tanh(x / 2)
    torch.testing.assert_close(dyt(x), torch.tensor([[0.0, 0.46211716, -0.76159416]]))
    with torch.no_grad():
        dyt.alpha.fill_(2.0)
        dyt.weight.copy_(torch.tensor([1.0, 3.0, -0.5]))
        dyt.bias.copy_(torch.tensor([0.1, 0.0, 1.0]))
    expected = torch.tensor([[0.1, 3 * math.tanh(2.0), -0.5 * math.tanh(-4.0) + 1.0]])
    torch.testing.assert_close(dyt(x), expected)
    # any shape: over the last dimension, one alpha for all channels
    y = torch.randn(4, 2, 3)
    torch.testing.assert_close(dyt(y), dyt.weight * torch.tanh(2.0 * y) + dyt.bias)


def test_every_layer_norm_of_pre_ln_is_a_dyt_at_its_init(dict_dir):
    model, _, args = build_tiny(dict_dir, "transformer_dyt", N_ENC, N_DEC)
    assert args.encoder_normalize_before and args.decoder_normalize_before  # the paper's layout
    assert layer_norms(model) == []
    found = dyts(model)
    # 2 per encoder layer and the encoder's final norm; 3 per decoder layer and the decoder's final norm
    assert len(found) == 2 * N_ENC + 1 + 3 * N_DEC + 1
    assert {"encoder.layer_norm", "decoder.layer_norm", "decoder.layers.1.encoder_attn_layer_norm"} <= set(found)
    for name, dyt in found.items():
        assert ALPHA0 == 0.5 and dyt.alpha.shape == (1,) and dyt.alpha.item() == 0.5, name
        assert torch.equal(dyt.weight, torch.ones(64)) and torch.equal(dyt.bias, torch.zeros(64)), name


def test_a_layer_norm_embedding_becomes_a_dyt_too(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dyt", 1, 1, "--layernorm-embedding")
    assert layer_norms(model) == []
    assert {"encoder.layernorm_embedding", "decoder.layernorm_embedding"} <= set(dyts(model))


def test_every_other_weight_is_fairseqs_pre_ln_draw(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dyt", N_ENC, N_DEC, seed=3)
    stock, _, _ = build_tiny(dict_dir, "transformer", N_ENC, N_DEC, "--encoder-normalize-before",
                             "--decoder-normalize-before", seed=3)
    ours, theirs = dict(model.named_parameters()), dict(stock.named_parameters())
    assert set(theirs) == {n for n in ours if not n.endswith(".alpha")}
    for name, value in theirs.items():
        if "layer_norm" not in name:
            torch.testing.assert_close(ours[name], value, rtol=0, atol=0, msg=name)


def test_encoder_layer_is_pre_ln_with_dyt(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dyt", N_ENC, N_DEC, seed=2)
    layer = trained_looking_(model).encoder.layers[1]
    a1, a2 = layer.self_attn_layer_norm.alpha.item(), layer.final_layer_norm.alpha.item()
    x = torch.randn(5, 2, 64)
    with torch.no_grad():
        def dyt(norm, alpha, v):
            return norm.weight * torch.tanh(alpha * v) + norm.bias

        u = dyt(layer.self_attn_layer_norm, a1, x)
        h = x + layer.self_attn(query=u, key=u, value=u, key_padding_mask=None, need_weights=False)[0]
        expected = h + layer.fc2(F.relu(layer.fc1(dyt(layer.final_layer_norm, a2, h))))
        torch.testing.assert_close(layer(x, encoder_padding_mask=None), expected)


def test_alpha_gamma_and_beta_receive_gradients(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dyt", 1, 1)
    src = torch.randint(4, 500, (2, 7))
    prev = torch.cat([torch.full((2, 1), 2), torch.randint(4, 500, (2, 5))], dim=1)
    model.train()
    out, _ = model(src, torch.full((2,), 7), prev)
    out.logsumexp(-1).sum().backward()
    for name, dyt in dyts(model).items():
        for p in (dyt.alpha, dyt.weight, dyt.bias):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_language_model_is_pre_ln_with_every_norm_a_dyt(lm_bin):
    model, _ = build_lm(lm_bin, *methods.lm_model_flags("dyt")[1:], *methods.lm_dims_flags(32, 64, 2, 3))
    assert all(layer.normalize_before for layer in model.decoder.layers)
    assert layer_norms(model) == []
    found = dyts(model)
    assert len(found) == 2 * 3 + 1 and "decoder.layer_norm" in found
    assert all(d.alpha.item() == 0.5 and d.weight.shape == (32,) for d in found.values())


def test_fairseq_train_trains_the_language_model_with_warmup(lm_bin):
    """The LM study's command for DyT (matched warmup), run by fairseq-train's own entry point: finite
    losses that fall."""
    assert "DyT LM: Pre-LN; 5 LayerNorms replaced" in train_lm_briefly(lm_bin, "dyt", schedule="matched")


@pytest.mark.parametrize("suffix", ["", "_deep_narrow"])
def test_size_presets_are_pre_ln_too(suffix, dict_dir):
    _, _, args = build_tiny(dict_dir, "transformer_dyt" + suffix, 1, 1)
    assert args.encoder_normalize_before and args.decoder_normalize_before
