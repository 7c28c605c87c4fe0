"""transformer_admin (Liu et al. 2020): omegas equal the profiled variances, the residual formula, decoding."""

import pytest
import torch
import torch.nn.functional as F


from model_checks import (
    assert_encoder_survives_state_dict_round_trip,
    assert_incremental_decoding_matches_full,
    build_tiny,
    trained_looking_,
)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 500, (3, 8), generator=g)
    prev = torch.cat([torch.full((3, 1), 2), torch.randint(4, 500, (3, 6), generator=g)], dim=1)
    return src, torch.full((3,), 8), prev


def _encoder_variances_by_hand(model, src):
    """Var x_0, then Var f_i of each branch of a plain Post-LN encoder (omega = 1), computed here."""
    enc = model.encoder.eval()
    with torch.no_grad():
        x = enc.forward_embedding(src)[0].transpose(0, 1)
        variances = [x.var()]
        for layer in enc.layers:
            f, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=None)
            variances.append(f.var())
            x = layer.self_attn_layer_norm(x + f)
            f = layer.fc2(F.relu(layer.fc1(x)))
            variances.append(f.var())
            x = layer.final_layer_norm(x + f)
    return torch.stack(variances)


def test_omegas_are_the_profiled_variances(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_admin", 3, 2, seed=4)
    fresh, _, _ = build_tiny(dict_dir, "transformer_admin", 3, 2, seed=4)
    src, lengths, prev = _batch()
    assert not model.admin_profiled and all(torch.all(l.omega == 1) for l in model.encoder.layers)
    model.train()
    model(src, lengths, prev)  # the first training forward profiles
    assert model.admin_profiled
    # omega_i = sqrt(Var x_0 + sum_{j<i} Var f_j), every entry of the D-vector
    variances = _encoder_variances_by_hand(fresh, src)
    expected = torch.cumsum(variances, 0)[:-1].sqrt()
    got = torch.cat([layer.omega for layer in model.encoder.layers])
    assert got.shape == (6, 64)
    torch.testing.assert_close(got, expected.unsqueeze(1).expand(6, 64), rtol=1e-4, atol=1e-5)
    # decoder: omega_1 is the std of its embedding output; 3 branches per layer, growing
    dec = fresh.decoder.eval()
    with torch.no_grad():
        x0 = dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)
    omegas = torch.cat([layer.omega[:, 0] for layer in model.decoder.layers])
    assert omegas.shape == (6,) and omegas[0].item() == pytest.approx(x0.var().sqrt().item(), rel=1e-4)
    assert torch.all(omegas[1:] > omegas[:-1])
    # profiled once: a later training forward leaves them alone
    before = [layer.omega.detach().clone() for layer in model.decoder.layers]
    model(*_batch(seed=1))
    assert all(torch.equal(b, layer.omega) for b, layer in zip(before, model.decoder.layers))


def test_checkpointed_model_is_not_profiled_again(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_admin", 2, 2)
    model.train()
    model(*_batch())
    state = model.state_dict()
    assert state["admin_profiled"]
    reloaded, _, _ = build_tiny(dict_dir, "transformer_admin", 2, 2, seed=9)
    reloaded.load_state_dict(state)
    reloaded.train()
    reloaded(*_batch(seed=3))
    for a, b in zip(model.encoder.layers, reloaded.encoder.layers):
        assert torch.equal(a.omega, b.omega)


def test_each_residual_uses_its_own_omega(dict_dir):
    """x_i = LN(x_{i-1} * omega_i + f_i(x_{i-1})), with a different omega per branch."""
    model, _, _ = build_tiny(dict_dir, "transformer_admin", 1, 1)
    trained_looking_(model)
    layer = model.encoder.layers[0].eval()
    with torch.no_grad():
        layer.omega.copy_(torch.rand_like(layer.omega) * 3)
        x = torch.randn(5, 2, 64)
        out = layer(x, encoder_padding_mask=None)
        f, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=None)
        h = layer.self_attn_layer_norm(x * layer.omega[0] + f)
        expected = layer.final_layer_norm(h * layer.omega[1] + layer.fc2(F.relu(layer.fc1(h))))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # decoder: self-attention, encoder-attention and FFN each read their own row
    dec = model.decoder.layers[0].eval()
    enc_out = torch.randn(4, 2, 64)
    with torch.no_grad():
        base = dec(x, enc_out)[0]
        for row in range(3):
            dec.omega[row].mul_(2.0)
            assert not torch.allclose(dec(x, enc_out)[0], base), row
            dec.omega[row].div_(2.0)


def test_incremental_decoding_equals_full_forward(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_admin", 2, 3, "--share-decoder-input-output-embed")
    trained_looking_(model)
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.omega.copy_(torch.rand_like(layer.omega) * 3)
    assert_incremental_decoding_matches_full(model.eval())
    assert_encoder_survives_state_dict_round_trip(model)


def test_pre_ln_is_refused(dict_dir):
    with pytest.raises(ValueError, match="transformer_admin is a Post-LN Transformer: drop --encoder-normalize-before"):
        build_tiny(dict_dir, "transformer_admin", 1, 1, "--encoder-normalize-before")
