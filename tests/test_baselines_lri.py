"""transformer_lri (Xu et al., ACL 2020): the authors' Lipschitz bounds per weight, the order v1
computed by hand over whole stacks (decoding, a state-dict round trip and a fairseq-train run:
tests/test_methods.py, as for every row)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_tfixup.baselines.lri import embedding_bound, linear_bound

from model_checks import build_tiny, trained_looking_

N_ENC, N_DEC = 3, 2


def test_bounds_are_the_authors_initialisers():
    """The authors' calls: linear weights kaiming_uniform_(a=sqrt(5)) (= gain sqrt(1/3)), embeddings
    xavier_uniform_ with gain sqrt(1/3); torch's own initialisers reach the same bounds."""
    g = torch.Generator().manual_seed(0)
    for fan_out, fan_in in ((512, 512), (2048, 512), (512, 2048)):
        w = torch.empty(fan_out, fan_in)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
        assert linear_bound(fan_in) * 0.999 < w.abs().max().item() <= linear_bound(fan_in)
    # a square matrix: Xavier's bound over sqrt(3)
    assert linear_bound(512) == pytest.approx(math.sqrt(6 / (512 + 512)) / math.sqrt(3))
    e = torch.empty(32000, 512)
    nn.init.xavier_uniform_(e, gain=math.sqrt(1 / 3), generator=g)
    assert embedding_bound(32000, 512) * 0.999 < e.abs().max().item() <= embedding_bound(32000, 512)


def _assert_uniform(w, bound, what):
    """w looks drawn from U(-bound, bound): std bound/sqrt(3), support reaching the bound."""
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), what
    assert abs(w.mean().item()) < 0.05 * bound, what
    assert bound * 0.95 < w.abs().max().item() <= bound, what


def test_every_weight_is_drawn_with_its_bound(dict_dir):
    model, task, _ = build_tiny(dict_dir, "transformer_lri", N_ENC, N_DEC, seed=3)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    # 6 per encoder layer, 10 per decoder layer, and the decoder's own output projection
    assert len(linears) == 6 * N_ENC + 10 * N_DEC + 1
    for name, linear in linears:
        _assert_uniform(linear.weight, 1 / math.sqrt(linear.in_features), name)
        assert linear.bias is None or torch.count_nonzero(linear.bias) == 0, name
    for stack, vocab in ((model.encoder, len(task.source_dictionary)), (model.decoder, len(task.target_dictionary))):
        emb = stack.embed_tokens
        rows = torch.cat([emb.weight[: emb.padding_idx], emb.weight[emb.padding_idx + 1:]])
        _assert_uniform(rows, math.sqrt(2 / (vocab + emb.embedding_dim)), "embed_tokens")
        assert torch.count_nonzero(emb.weight[emb.padding_idx]) == 0
    # LayerNorms are fairseq's: gain 1, bias 0, and one more per stack than Post-LN has (its input's)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == (2 * N_ENC + 1) + (3 * N_DEC + 1)
    assert all(torch.all(m.weight == 1) and torch.all(m.bias == 0) for m in norms)


def test_a_shared_output_projection_keeps_the_embedding_rule(joined_dict_dir):
    model, task, _ = build_tiny(joined_dict_dir, "transformer_lri", 1, 1, "--share-all-embeddings")
    weight = model.decoder.output_projection.weight
    assert weight is model.encoder.embed_tokens.weight
    assert weight.abs().max().item() <= math.sqrt(2 / (len(task.target_dictionary) + weight.size(1)))


def _sublayers_v1(norms, branches, h):
    """The authors' order v1 (Neutron, ``norm_residual``): every sublayer reads y = LN(h) and gives
    y + F(y), LN's output on the shortcut; the stack's output is its last LayerNorm's."""
    for norm, branch in zip(norms, branches):
        y = norm(h)
        h = y + branch(y)
    return norms[-1](h)


def _ffn(layer):
    return lambda y: layer.fc2(F.relu(layer.fc1(y)))


def test_stacks_compute_order_v1_by_hand(dict_dir):
    model, _, _ = build_tiny(dict_dir, "transformer_lri", N_ENC, N_DEC, seed=5)
    model = trained_looking_(model)  # LayerNorm gains and biases off 1 and 0 too
    torch.manual_seed(0)
    src = torch.randint(4, 500, (2, 7))
    prev = torch.cat([torch.full((2, 1), 2), torch.randint(4, 500, (2, 5))], dim=1)
    enc, dec = model.encoder, model.decoder
    with torch.no_grad():
        # encoder: embeddings (scaled, plus positions), then LN, self-attention, LN, FFN, ... LN
        h = (enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)).transpose(0, 1)
        norms, branches = [enc.layernorm_embedding], []
        for layer in enc.layers:
            norms += [layer.self_attn_layer_norm, layer.final_layer_norm]
            branches += [lambda y, a=layer.self_attn: a(query=y, key=y, value=y)[0], _ffn(layer)]
        memory = _sublayers_v1(norms, branches, h)
        encoder_out = enc(src, src_lengths=torch.full((2,), 7))
        torch.testing.assert_close(encoder_out["encoder_out"][0], memory)
        # decoder: the same with causal self-attention and encoder attention on the memory
        h = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
        causal = torch.triu(torch.full((6, 6), float("-inf")), 1)
        norms, branches = [dec.layernorm_embedding], []
        for layer in dec.layers:
            norms += [layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm]
            branches += [lambda y, a=layer.self_attn: a(query=y, key=y, value=y, attn_mask=causal)[0],
                         lambda y, a=layer.encoder_attn: a(query=y, key=memory, value=memory, static_kv=True)[0],
                         _ffn(layer)]
        expected = _sublayers_v1(norms, branches, h).transpose(0, 1)
        features, _ = dec(prev, encoder_out=encoder_out, features_only=True)
        torch.testing.assert_close(features, expected)
