"""transformer_dlcl (Wang et al. 2019): combination weights and the layer-input formula, decoding."""

import pytest
import torch


from model_checks import (
    assert_encoder_survives_state_dict_round_trip,
    assert_incremental_decoding_matches_full,
    build_tiny,
    trained_looking_,
)


@pytest.mark.parametrize("arch, pre_norm", [("transformer_dlcl", False), ("transformer_dlcl_pre_norm_wmt_en_de", True)])
def test_weights_start_as_the_average_of_the_layers_below(arch, pre_norm, dict_dir):
    model, _, args = build_tiny(dict_dir, arch, 4, 2)
    enc = model.encoder
    assert enc.pre_norm is pre_norm and args.decoder_normalize_before is pre_norm
    w = enc.dlcl_weights
    assert w.shape == (5, 5) and w.requires_grad
    for l in range(5):  # row l feeds layer l+1 (row 4: the output) with y_0..y_l
        torch.testing.assert_close(w[l, : l + 1], torch.full((l + 1,), 1 / (l + 1)))
        assert torch.count_nonzero(w[l, l + 1:]) == 0
    assert len(enc.dlcl_norms) == 5
    assert type(model.decoder) is not type(enc) and not hasattr(model.decoder, "dlcl_weights")  # decoder is stock


@pytest.mark.parametrize("arch, pre_norm", [("transformer_dlcl", False), ("transformer_dlcl_pre_norm_wmt_en_de", True)])
def test_encoder_output_is_the_papers_combination(arch, pre_norm, dict_dir):
    """x_{l+1} = sum_k W_{l+1,k} LN_k(y_k) (Pre-LN) or LN_{l+1}(sum_k W_{l+1,k} y_k) (Post-LN), by hand."""
    model, _, _ = build_tiny(dict_dir, arch, 3, 1)
    trained_looking_(model)
    with torch.no_grad():
        model.encoder.dlcl_weights.copy_(torch.tril(torch.rand(4, 4)) + torch.eye(4))  # not the average
    enc = model.encoder.eval()
    src = torch.randint(4, 500, (2, 6))
    with torch.no_grad():
        out = enc(src, src_lengths=torch.full((2,), 6))["encoder_out"][0]
        y = [enc.forward_embedding(src)[0].transpose(0, 1)]
        for l, layer in enumerate(enc.layers):
            if pre_norm:
                x = sum(enc.dlcl_weights[l, k] * enc.dlcl_norms[k](y[k]) for k in range(l + 1))
            else:
                x = enc.dlcl_norms[l](sum(enc.dlcl_weights[l, k] * y[k] for k in range(l + 1)))
            y.append(layer(x, encoder_padding_mask=None))
        if pre_norm:
            expected = enc.layer_norm(sum(enc.dlcl_weights[3, k] * enc.dlcl_norms[k](y[k]) for k in range(4)))
        else:
            expected = enc.dlcl_norms[3](sum(enc.dlcl_weights[3, k] * y[k] for k in range(4)))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_weights_get_gradients(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dlcl", 2, 1)
    src = torch.randint(4, 500, (2, 6))
    model.encoder(src, src_lengths=torch.full((2,), 6))["encoder_out"][0].pow(2).sum().backward()
    grad = model.encoder.dlcl_weights.grad
    assert torch.count_nonzero(torch.tril(grad)) == 6 and torch.count_nonzero(torch.triu(grad, 1)) == 0


def test_incremental_decoding_equals_full_forward(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_dlcl", 3, 2, "--share-decoder-input-output-embed")
    model = trained_looking_(model)
    assert_incremental_decoding_matches_full(model)
    assert_encoder_survives_state_dict_round_trip(model)
