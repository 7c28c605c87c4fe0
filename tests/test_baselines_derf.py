"""transformer_derf and transformer_lm_derf (Chen et al., 2025): Derf(x) = gamma * erf(alpha * x + s) + beta against
the formula, its initialisation (alpha0 0.5, s0 0), every LayerNorm of the Pre-LN Transformer replaced, fairseq's
own weights elsewhere, every parameter trained. (Decoding, a state-dict round trip and a fairseq-train run:
tests/test_methods.py, as for every row.)"""

import math

import torch

from fairseq_tfixup.baselines.derf import Derf
from fairseq_tfixup.baselines.dyt import DyT
from tfixup import methods

from model_checks import build_tiny
from test_lm import build_lm, layer_norms, lm_bin  # noqa: F401  (lm_bin: the fixture)

N_ENC, N_DEC = 2, 2


def derfs(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, Derf)}


def test_derf_is_gamma_erf_alpha_x_plus_s_plus_beta():
    derf = Derf(3)
    x = torch.tensor([[0.0, 1.0, -2.0]])
    # at initialisation (alpha 0.5, s 0, gamma 1, beta 0): erf(x / 2)
    torch.testing.assert_close(derf(x), torch.tensor([[0.0, math.erf(0.5), math.erf(-1.0)]]))
    with torch.no_grad():
        derf.alpha.fill_(2.0)
        derf.shift.fill_(0.25)
        derf.weight.copy_(torch.tensor([1.0, 3.0, -0.5]))
        derf.bias.copy_(torch.tensor([0.1, 0.0, 1.0]))
    expected = torch.tensor([[0.1 + math.erf(0.25), 3 * math.erf(2.25), -0.5 * math.erf(-3.75) + 1.0]])
    torch.testing.assert_close(derf(x), expected)


def test_every_layer_norm_of_pre_ln_is_a_derf_at_its_init_and_the_rest_is_fairseqs(dict_dir):
    model, _, args = build_tiny(dict_dir, "transformer_derf", N_ENC, N_DEC, seed=3)
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert layer_norms(model) == [] and not any(isinstance(m, DyT) for m in model.modules())
    found = derfs(model)
    assert len(found) == 2 * N_ENC + 1 + 3 * N_DEC + 1
    for name, d in found.items():
        assert d.alpha.item() == 0.5 and d.shift.item() == 0.0, name
        assert torch.equal(d.weight, torch.ones(64)) and torch.equal(d.bias, torch.zeros(64)), name
    stock, _, _ = build_tiny(dict_dir, "transformer", N_ENC, N_DEC, "--encoder-normalize-before",
                             "--decoder-normalize-before", seed=3)
    ours, theirs = dict(model.named_parameters()), dict(stock.named_parameters())
    assert set(theirs) == {n for n in ours if not n.endswith((".alpha", ".shift"))}
    for name, value in theirs.items():
        if "layer_norm" not in name:
            torch.testing.assert_close(ours[name], value, rtol=0, atol=0, msg=name)


def test_alpha_shift_gamma_and_beta_receive_gradients(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_derf", 1, 1)
    src = torch.randint(4, 500, (2, 7))
    prev = torch.cat([torch.full((2, 1), 2), torch.randint(4, 500, (2, 5))], dim=1)
    model.train()
    out, _ = model(src, torch.full((2,), 7), prev)
    out.logsumexp(-1).sum().backward()
    for name, d in derfs(model).items():
        for p in (d.alpha, d.shift, d.weight, d.bias):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_language_model_is_pre_ln_with_every_norm_a_derf(lm_bin):
    model, _ = build_lm(lm_bin, *methods.lm_model_flags("derf")[1:], *methods.lm_dims_flags(32, 64, 2, 3))
    assert all(layer.normalize_before for layer in model.decoder.layers)
    assert layer_norms(model) == []
    found = derfs(model)
    assert len(found) == 2 * 3 + 1 and "decoder.layer_norm" in found
