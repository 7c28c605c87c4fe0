"""transformer_deepnorm (Wang et al., 2022): alpha/beta against the paper, residuals LN(alpha x + G(x)),
beta-scaled Xavier-normal init (decoding, a state-dict round trip and training: tests/test_methods.py, as
for every row)."""

import math

import pytest
import torch
from torch import nn

from fairseq_tfixup.baselines import deepnorm_init as dn

from model_checks import TINY
from conftest import build_model

N_ENC, N_DEC = 4, 3
LAYERS = ["--encoder-layers", N_ENC, "--decoder-layers", N_DEC, *TINY]


def test_constants_match_the_paper():
    # Figure 2, encoder-decoder: at N = M = 1 the constants themselves
    assert dn.encoder_alpha(1, 1) == pytest.approx(0.81)
    assert dn.encoder_beta(1, 1) == pytest.approx(0.87)
    assert dn.decoder_alpha(1) == pytest.approx(3 ** 0.25)
    assert dn.decoder_beta(1) == pytest.approx(12 ** -0.25)
    # 6+6 (the base model): 0.81 * 6^(5/16), 0.87 * 6^(-5/16), 18^(1/4), 72^(-1/4)
    assert dn.encoder_alpha(6, 6) == pytest.approx(0.81 * 6 ** (5 / 16)) == pytest.approx(1.4179, abs=1e-4)
    assert dn.encoder_beta(6, 6) == pytest.approx(0.87 * 6 ** (-5 / 16)) == pytest.approx(0.4970, abs=1e-4)
    assert dn.decoder_alpha(6) == pytest.approx(18 ** 0.25) == pytest.approx(2.0598, abs=1e-4)
    assert dn.decoder_beta(6) == pytest.approx(72 ** -0.25) == pytest.approx(0.3433, abs=1e-4)
    # depth dependence: N enters to the 4th power, M to the 1st, under a 16th root
    assert dn.encoder_alpha(32, 6) == pytest.approx(2 * dn.encoder_alpha(2, 6))
    assert dn.encoder_beta(6, 32) == pytest.approx(dn.encoder_beta(6, 2) / 16 ** (1 / 16))
    assert dn.decoder_alpha(96) == pytest.approx(2 * dn.decoder_alpha(6))
    assert dn.decoder_beta(96) == pytest.approx(dn.decoder_beta(6) / 2)
    with pytest.raises(ValueError, match="at least one layer per stack, got 0 and 6"):
        dn.encoder_alpha(0, 6)


@pytest.mark.parametrize("name, gain", [
    ("self_attn.v_proj", 0.5), ("self_attn.out_proj", 0.5), ("encoder_attn.v_proj", 0.5),
    ("encoder_attn.out_proj", 0.5), ("fc1", 0.5), ("fc2", 0.5),
    ("self_attn.q_proj", 1.0), ("self_attn.k_proj", 1.0), ("encoder_attn.k_proj", 1.0),
])
def test_xavier_gain_per_linear(name, gain):
    assert dn.xavier_gain(name, beta=0.5) == gain


def test_xavier_gain_refuses_unknown_linears():
    with pytest.raises(ValueError, match="no rule for linear layer 'adapter.fc'"):
        dn.xavier_gain("adapter.fc", 0.5)


def test_every_layer_has_alpha_and_beta_scaled_weights(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_deepnorm", *LAYERS, seed=3)
    stock, _, _ = build_model(dict_dir, "transformer", *LAYERS, seed=3)
    expected = {
        "encoder": (dn.encoder_alpha(N_ENC, N_DEC), dn.encoder_beta(N_ENC, N_DEC)),
        "decoder": (dn.decoder_alpha(N_DEC), dn.decoder_beta(N_DEC)),
    }
    checked = 0
    for stack_name, (alpha, beta) in expected.items():
        for layer in getattr(model, stack_name).layers:
            assert layer.alpha == pytest.approx(alpha)
            for name, linear in layer.named_modules():
                if not isinstance(linear, nn.Linear):
                    continue
                gain = 1.0 if name.endswith(("q_proj", "k_proj")) else beta
                std = gain * math.sqrt(2 / (linear.in_features + linear.out_features))
                w = linear.weight
                assert w.std().item() == pytest.approx(std, rel=0.05), (stack_name, name)
                assert abs(w.mean().item()) < 0.1 * std
                assert w.abs().max().item() > 2.5 * std  # normal, not uniform (bounded at sqrt(3) std)
                checked += 1
    assert checked == 6 * N_ENC + 10 * N_DEC
    # everything but those weights is fairseq's own draw (same seed, same build order)
    weights = dict(model.named_parameters())
    kept = [n for n in weights if not n.endswith(("_proj.weight", "fc1.weight", "fc2.weight"))]
    assert "decoder.layers.0.fc1.bias" in kept and "encoder.embed_tokens.weight" in kept
    stock_params = dict(stock.named_parameters())
    for name in kept:
        torch.testing.assert_close(weights[name], stock_params[name], rtol=0, atol=0, msg=name)


def _eval_model(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_deepnorm", *LAYERS, seed=3)
    return model.eval()


def test_encoder_layer_computes_ln_of_alpha_x_plus_sublayer(dict_dir):
    layer = _eval_model(dict_dir).encoder.layers[1]
    a = dn.encoder_alpha(N_ENC, N_DEC)
    x = torch.randn(5, 2, 64)
    with torch.no_grad():
        attn, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)
        h = layer.self_attn_layer_norm(a * x + attn)
        expected = layer.final_layer_norm(a * h + layer.fc2(torch.relu(layer.fc1(h))))
        torch.testing.assert_close(layer(x, encoder_padding_mask=None), expected)


def test_decoder_layer_computes_ln_of_alpha_x_plus_sublayer(dict_dir):
    layer = _eval_model(dict_dir).decoder.layers[2]
    a = dn.decoder_alpha(N_DEC)
    x, enc = torch.randn(1, 2, 64), torch.randn(6, 2, 64)  # one target position: no causal mask needed
    with torch.no_grad():
        sa, _ = layer.self_attn(query=x, key=x, value=x, need_weights=False)
        h1 = layer.self_attn_layer_norm(a * x + sa)
        ca, _ = layer.encoder_attn(query=h1, key=enc, value=enc, static_kv=True, need_weights=False)
        h2 = layer.encoder_attn_layer_norm(a * h1 + ca)
        expected = layer.final_layer_norm(a * h2 + layer.fc2(torch.relu(layer.fc1(h2))))
        out, _, _ = layer(x, encoder_out=enc, encoder_padding_mask=None)
    torch.testing.assert_close(out, expected)
