"""transformer_rezero and transformer_lm_rezero (Bachlechner et al., 2020): no LayerNorm, each sublayer
x + alpha * F(x) with its own alpha, zero at initialisation: the identity at init (a layer, and each whole
stack, which outputs its embeddings unchanged), the formula with nonzero alphas, gradients, refusals, and
the language model trained by fairseq-train (decoding, a state-dict round trip and the translation model's
training: tests/test_methods.py, as for every row)."""

import pytest
import torch
import torch.nn.functional as F

from tfixup import methods

from model_checks import build_tiny, train_lm_briefly, trained_looking_
from test_lm import build_lm, layer_norms, lm_bin  # noqa: F401  (lm_bin: the fixture)

N_ENC, N_DEC = 3, 2


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 500, (2, 7), generator=g)
    prev = torch.cat([torch.full((2, 1), 2), torch.randint(4, 500, (2, 5), generator=g)], dim=1)
    return src, torch.full((2,), 7), prev


def _model(dict_dir, *flags, seed=1):
    return build_tiny(dict_dir, "transformer_rezero", N_ENC, N_DEC, *flags, seed=seed)[0]


def test_no_layer_norm_and_one_zero_alpha_per_sublayer(dict_dir):
    model = _model(dict_dir)
    assert layer_norms(model) == [] and model.encoder.layer_norm is None and model.decoder.layer_norm is None
    alphas = {n: p for n, p in model.named_parameters() if "alpha" in n}
    assert sorted(alphas) == sorted([f"encoder.layers.{i}.rezero_alpha" for i in range(N_ENC)]
                                    + [f"decoder.layers.{i}.rezero_alpha" for i in range(N_DEC)])
    for name, alpha in alphas.items():
        # self-attention and FFN; the decoder's encoder attention between them
        assert torch.equal(alpha, torch.zeros(2 if name.startswith("encoder") else 3)), name


def test_each_layer_is_the_identity_at_init(dict_dir):
    model = _model(dict_dir).eval()
    x, enc = torch.randn(5, 2, 64), torch.randn(6, 2, 64)
    with torch.no_grad():
        for layer in model.encoder.layers:
            assert torch.equal(layer(x, encoder_padding_mask=None), x)
        for layer in model.decoder.layers:
            out, _, _ = layer(x, encoder_out=enc, encoder_padding_mask=None)
            assert torch.equal(out, x)


def test_each_stack_outputs_its_embeddings_unchanged_at_init(dict_dir):
    model = _model(dict_dir).eval()
    src, lengths, prev = _batch()
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        embedded = model.encoder.forward_embedding(src)[0].transpose(0, 1)
        torch.testing.assert_close(enc["encoder_out"][0], embedded, rtol=0, atol=0)
        features, _ = model.decoder.extract_features(prev, encoder_out=enc)
        dec = model.decoder
        torch.testing.assert_close(features, dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev),
                                   rtol=0, atol=0)


def test_layers_compute_x_plus_alpha_times_each_sublayer(dict_dir):
    model = trained_looking_(_model(dict_dir, seed=2))
    enc_layer, dec_layer = model.encoder.layers[1], model.decoder.layers[1]
    with torch.no_grad():
        enc_layer.rezero_alpha.copy_(torch.tensor([0.3, -0.7]))
        dec_layer.rezero_alpha.copy_(torch.tensor([0.5, 0.2, -1.1]))
        x = torch.randn(5, 2, 64)
        h = x + 0.3 * enc_layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)[0]
        expected = h - 0.7 * enc_layer.fc2(F.relu(enc_layer.fc1(h)))
        torch.testing.assert_close(enc_layer(x, encoder_padding_mask=None), expected)
        y, enc = torch.randn(1, 2, 64), torch.randn(6, 2, 64)  # one target position: no causal mask needed
        h1 = y + 0.5 * dec_layer.self_attn(query=y, key=y, value=y, need_weights=False)[0]
        h2 = h1 + 0.2 * dec_layer.encoder_attn(query=h1, key=enc, value=enc, static_kv=True, need_weights=False)[0]
        expected = h2 - 1.1 * dec_layer.fc2(F.relu(dec_layer.fc1(h2)))
        out, _, _ = dec_layer(y, encoder_out=enc, encoder_padding_mask=None)
    torch.testing.assert_close(out, expected)


def _backward(model):
    model.zero_grad()
    model.train()
    out, _ = model(*_batch())
    out.logsumexp(-1).sum().backward()


def test_alphas_receive_gradients_and_sublayers_none_at_init(dict_dir):
    """At alpha = 0 the loss depends on a sublayer's weights only through its alpha: the alpha's gradient is
    the sublayer's output against the loss's, the weights' gradients are zero. The encoder reaches the loss
    only through the decoder's encoder attention, so its alphas get gradients once those are nonzero."""
    model = _model(dict_dir)
    _backward(model)
    for layer in model.decoder.layers:
        assert torch.all(layer.rezero_alpha.grad != 0)
    for layer in (*model.encoder.layers, *model.decoder.layers):
        for linear in (layer.fc1, layer.fc2, layer.self_attn.q_proj, layer.self_attn.v_proj):
            assert torch.all(linear.weight.grad == 0)
    assert all(torch.all(layer.rezero_alpha.grad == 0) for layer in model.encoder.layers)
    assert model.decoder.embed_tokens.weight.grad.abs().sum() > 0
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.rezero_alpha.fill_(0.1)
    _backward(model)
    for layer in model.encoder.layers:
        assert torch.all(layer.rezero_alpha.grad != 0)


@pytest.mark.parametrize("flag", ["--encoder-normalize-before", "--decoder-normalize-before", "--layernorm-embedding"])
def test_layer_norm_flags_are_refused_in_one_line(flag, dict_dir):
    with pytest.raises(ValueError, match=f"transformer_rezero has no LayerNorm: {flag} cannot be used") as err:
        _model(dict_dir, flag)
    assert "\n" not in str(err.value)


def test_language_model_has_no_layer_norm_and_is_the_identity_at_init(lm_bin):
    model, _ = build_lm(lm_bin, *methods.lm_model_flags("rezero")[1:], *methods.lm_dims_flags(32, 64, 2, 3))
    assert layer_norms(model) == [] and model.decoder.layer_norm is None
    assert [tuple(layer.rezero_alpha.shape) for layer in model.decoder.layers] == [(2,)] * 3
    model.eval()
    tokens = torch.randint(4, len(model.decoder.dictionary), (2, 9))
    dec = model.decoder
    with torch.no_grad():
        features, _ = dec.extract_features(tokens, encoder_out=None)
        torch.testing.assert_close(features, dec.embed_scale * dec.embed_tokens(tokens) + dec.embed_positions(tokens),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("flag", ["--decoder-normalize-before", "--layernorm-embedding"])
def test_language_model_refuses_layer_norm_flags(flag, lm_bin):
    with pytest.raises(ValueError, match=f"transformer_lm_rezero has no LayerNorm: drop {flag}"):
        build_lm(lm_bin, "transformer_lm_rezero", *methods.lm_dims_flags(32, 64, 2, 1), flag)


def test_fairseq_train_trains_the_language_model_without_warmup(lm_bin):
    """The LM study's command for ReZero (no warmup, its paper's), run by fairseq-train's own entry point:
    finite losses that fall."""
    log = train_lm_briefly(lm_bin, "rezero")
    assert "ReZero LM: no LayerNorm; 2 layers" in log and "'_name': 'inverse_sqrt_nowarmup'" in log
