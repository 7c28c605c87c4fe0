"""transformer_tfixup built through fairseq's own parser and task: init, LayerNorm removal, decoding, errors."""

import math
import re

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from tfixup import applier, tfixup_init
from fairseq_tfixup.models.transformer_tfixup import is_layer_norm, tfixup_plan

from conftest import build_model
from model_checks import (
    assert_encoder_survives_state_dict_round_trip,
    assert_incremental_decoding_matches_full,
    trained_looking_,
)

SMALL = ["--encoder-embed-dim", 64, "--decoder-embed-dim", 64, "--encoder-ffn-embed-dim", 128,
         "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4, "--decoder-attention-heads", 4]

# (n_enc, n_dec, extra flags, joined dictionary)
CASES = {
    "6-6 unshared": (6, 6, [], False),
    "3-7 decoder in/out shared": (3, 7, ["--share-decoder-input-output-embed"], False),
    "4-4 all shared": (4, 4, ["--share-all-embeddings"], True),
    "2-5 all shared": (2, 5, ["--share-all-embeddings"], True),
}


def _fan(p):
    return p.shape[1], p.shape[0]  # nn.Linear weight is (out, in)


def paper_factor(name: str, n_enc: int, n_dec: int) -> float:
    """T-Fixup's factor for a weight, with the paper's numbers written here (§3.2, Algorithm 1), not read
    from tfixup_init: a change of the module's constants fails this test."""
    if re.fullmatch(r"encoder\.layers\.\d+\.(self_attn\.(v_proj|out_proj)|fc1|fc2)\.weight", name):
        return 0.67 * n_enc ** -0.25
    if re.fullmatch(r"decoder\.layers\.\d+\.((self_attn|encoder_attn)\.(v_proj|out_proj)|fc1|fc2)\.weight", name):
        return (9 * n_dec) ** -0.25
    if name == "encoder.embed_tokens.weight":  # a matrix shared by all embeddings: once, the encoder's factor
        return (9 * n_enc) ** -0.25
    if name == "decoder.embed_tokens.weight":
        return (9 * n_dec) ** -0.25
    return 1.0


def plan_table(model):
    """parameter name -> (how, factor) of T-Fixup's plan for a built fairseq model (what build_model executed)."""
    return {name: (how, scale) for name, (how, scale, _) in applier.table(model, tfixup_plan(model)).items()}


PAPER_TABLE = {  # 3 encoder and 7 decoder layers: name -> (how, factor), None: untouched
    # encoder: self-attention v (redrawn plain Xavier = fairseq's gain 1/sqrt(2) times sqrt(2)) and out, MLP
    "encoder.layers.0.self_attn.v_proj.weight": ("xavier", 0.67 * 3 ** -0.25),
    "encoder.layers.2.self_attn.out_proj.weight": ("keep", 0.67 * 3 ** -0.25),
    "encoder.layers.1.fc1.weight": ("xavier", 0.67 * 3 ** -0.25),
    "encoder.layers.1.fc2.weight": ("xavier", 0.67 * 3 ** -0.25),
    "encoder.embed_tokens.weight": ("keep", (9 * 3) ** -0.25),
    # decoder: self and encoder attention, MLP, embedding, all (9 N_dec)^-1/4
    "decoder.layers.6.self_attn.v_proj.weight": ("xavier", (9 * 7) ** -0.25),
    "decoder.layers.0.encoder_attn.v_proj.weight": ("xavier", (9 * 7) ** -0.25),
    "decoder.layers.0.encoder_attn.out_proj.weight": ("keep", (9 * 7) ** -0.25),
    "decoder.layers.3.self_attn.out_proj.weight": ("keep", (9 * 7) ** -0.25),
    "decoder.layers.3.fc2.weight": ("xavier", (9 * 7) ** -0.25),
    "decoder.embed_tokens.weight": ("keep", (9 * 7) ** -0.25),
    # fc biases: zero, like fairseq 0.9's Linear
    "decoder.layers.3.fc1.bias": ("zeros", 1.0),
    # untouched: q/k, attention biases, unshared output projection
    "encoder.layers.0.self_attn.q_proj.weight": None,
    "decoder.layers.0.encoder_attn.k_proj.weight": None,
    "decoder.layers.0.self_attn.v_proj.bias": None,
    "decoder.output_projection.weight": None,
}


def test_the_plan_names_each_weight_as_the_paper(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_tfixup", "--encoder-layers", 3, "--decoder-layers", 7, *SMALL)
    plan = plan_table(model)
    for name, expected in PAPER_TABLE.items():
        if expected is None:
            assert name not in plan, name
        else:
            assert plan[name][0] == expected[0] and plan[name][1] == pytest.approx(expected[1]), name


def _expected_std(name, p, embed_dim):
    """What §3.2 prescribes for this weight, before T-Fixup's factor."""
    if name.endswith("embed_tokens.weight"):
        return embed_dim ** -0.5  # N(0, d^-1/2)
    return tfixup_init.xavier_uniform_std(*_fan(p))  # Xavier (v_proj: plain Xavier, not gain 1/sqrt(2))


@pytest.mark.parametrize("case", list(CASES))
def test_every_weight_has_the_prescribed_init(case, dict_dir, joined_dict_dir):
    n_enc, n_dec, flags, joined = CASES[case]
    data = joined_dict_dir if joined else dict_dir
    layer_flags = ["--encoder-layers", n_enc, "--decoder-layers", n_dec, *SMALL, *flags]
    tfixup, _, _ = build_model(data, "transformer_tfixup", *layer_flags, seed=3)
    stock, _, _ = build_model(data, "transformer", *layer_flags, seed=3)
    stock_params = dict(stock.named_parameters())

    names = [n for n, _ in tfixup.named_parameters()]
    if "--share-all-embeddings" in flags:
        assert "decoder.embed_tokens.weight" not in names  # one tensor, one name, scaled once
        assert tfixup.decoder.embed_tokens.weight is tfixup.encoder.embed_tokens.weight
    if flags:
        assert tfixup.decoder.output_projection.weight is tfixup.decoder.embed_tokens.weight

    checked = {"redrawn": 0, "scaled": 0, "kept": 0}
    plan = plan_table(tfixup)
    for name, p in tfixup.named_parameters():
        how, scale = plan.get(name, ("keep", 1.0))
        factor = paper_factor(name, n_enc, n_dec)
        assert scale == pytest.approx(factor, rel=1e-12), name
        ref = stock_params[name]
        if how == "xavier":
            # drawn again, so compare distributions: std within 5% (thousands of entries; SE ~1%)
            expected = factor * _expected_std(name, p, 64)
            assert p.std().item() == pytest.approx(expected, rel=0.05), name
            assert p.abs().max().item() <= expected * math.sqrt(3) * 1.0001, name  # uniform support
            checked["redrawn"] += 1
        elif how == "zeros":
            assert torch.count_nonzero(p) == 0, name
        elif factor != 1.0:
            # same random draw as stock fairseq, times the factor, exactly
            torch.testing.assert_close(p, ref * factor, rtol=0, atol=1e-7, msg=name)
            expected = factor * _expected_std(name, p, 64)
            rows = p[1:] if "embed_tokens" in name else p  # padding row is zero
            assert rows.std().item() == pytest.approx(expected, rel=0.05), name
            checked["scaled"] += 1
        else:
            torch.testing.assert_close(p, ref, rtol=0, atol=0, msg=name)  # fairseq's init, untouched
            checked["kept"] += 1

    n_embed = 1 if "--share-all-embeddings" in flags else 2
    assert checked["redrawn"] == 3 * n_enc + 4 * n_dec  # v_proj, fc1, fc2 (+ encoder_attn.v_proj)
    assert checked["scaled"] == n_enc + 2 * n_dec + n_embed  # out_proj(s) and token embeddings
    assert checked["kept"] > 0


def test_embedding_factors_for_unequal_depths(dict_dir):
    model, _, _ = build_model(dict_dir, "transformer_tfixup", "--encoder-layers", 2, "--decoder-layers", 8, *SMALL)
    enc = model.encoder.embed_tokens.weight[1:].std().item()
    dec = model.decoder.embed_tokens.weight[1:].std().item()
    assert enc == pytest.approx(64 ** -0.5 * 18 ** -0.25, rel=0.05)
    assert dec == pytest.approx(64 ** -0.5 * 72 ** -0.25, rel=0.05)


TFIXUP_ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "TFixupTransformerModel")


def test_all_architectures_are_registered():
    assert TFIXUP_ARCHS == sorted([
        "transformer_tfixup", "transformer_tfixup_iwslt_de_en", "transformer_tfixup_wmt_en_de",
        "transformer_tfixup_vaswani_wmt_en_de_big", "transformer_tfixup_deep_narrow",
    ])


@pytest.mark.parametrize("arch", TFIXUP_ARCHS)
def test_no_layer_norm_in_any_architecture(arch, dict_dir):
    model, _, args = build_model(dict_dir, arch, "--encoder-layers", 2, "--decoder-layers", 2)
    norms = [n for n, m in model.named_modules() if is_layer_norm(m)]
    assert norms == []
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    assert model.encoder.layernorm_embedding is None and model.decoder.layernorm_embedding is None
    assert not any("layer_norm" in k for k in model.state_dict())
    # the same flags on stock fairseq do build LayerNorms, so the check above can fail
    stock_arch = {"transformer_tfixup_deep_narrow": "transformer"}.get(arch, arch.replace("_tfixup", ""))
    stock, _, _ = build_model(dict_dir, stock_arch, "--encoder-layers", 2, "--decoder-layers", 2)
    assert any(is_layer_norm(m) for m in stock.modules())


@pytest.mark.parametrize("tfixup, stock", [
    ("transformer_tfixup", "transformer"), ("transformer_tfixup_iwslt_de_en", "transformer_iwslt_de_en"),
    ("transformer_tfixup_wmt_en_de", "transformer_wmt_en_de"),
    ("transformer_tfixup_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_de_big"),
])
def test_architectures_are_fairseqs_presets(tfixup, stock, dict_dir):
    """Every setting (sizes, dropout, ...) is fairseq's preset's; explicit flags still win."""
    from fairseq_tfixup.diagnostics.models import parse_train_args

    def settings(arch, *flags):
        return vars(parse_train_args(dict_dir, ["-s", "de", "-t", "en", "--arch", arch, *flags]))

    ours, theirs = settings(tfixup), settings(stock)
    assert {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)} == {"arch"}
    assert settings(tfixup, "--dropout", "0.25", "--encoder-ffn-embed-dim", "96")["encoder_ffn_embed_dim"] == 96


def test_deep_narrow_size(dict_dir):
    _, _, a = build_model(dict_dir, "transformer_tfixup_deep_narrow", "--encoder-layers", 1, "--decoder-layers", 1)
    assert (a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_attention_heads) == (64, 128, 2)
    assert (a.decoder_embed_dim, a.decoder_ffn_embed_dim, a.decoder_attention_heads) == (64, 128, 2)


def _small_eval_model(dict_dir, n_enc=3, n_dec=4):
    model, task, _ = build_model(dict_dir, "transformer_tfixup", "--encoder-layers", n_enc,
                                 "--decoder-layers", n_dec, "--share-decoder-input-output-embed", *SMALL)
    # T-Fixup's small init makes layers near-identity
    return trained_looking_(model), task


def test_incremental_decoding_equals_full_forward(dict_dir):
    model, _ = _small_eval_model(dict_dir)
    assert_incremental_decoding_matches_full(model)


def test_encoder_output_survives_a_state_dict_round_trip(dict_dir):
    """A checkpointed T-Fixup model computes the same function (no LayerNorm) on fairseq 0.12.2 too."""
    model, _ = _small_eval_model(dict_dir)
    assert_encoder_survives_state_dict_round_trip(model)


def test_beam_search_scores_match_teacher_forcing(dict_dir):
    model, task = _small_eval_model(dict_dir)
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_b=12, normalize_scores=False)
    torch.manual_seed(1)
    src = torch.randint(4, 500, (2, 6))
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((2,), 6)}}
    with torch.no_grad():
        hyps = gen.generate([model], sample)
        for i, beam in enumerate(hyps):
            best = beam[0]
            tokens = best["tokens"].unsqueeze(0)  # ends with </s>
            prev = torch.cat([torch.full((1, 1), task.target_dictionary.eos()), tokens[:, :-1]], dim=1)
            logits, _ = model(src[i : i + 1], torch.tensor([6]), prev)
            lprobs = torch.log_softmax(logits.float(), dim=-1)
            positional = lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze()
            torch.testing.assert_close(positional, best["positional_scores"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flag, message", [
    (["--encoder-normalize-before"], "has no LayerNorm: --encoder-normalize-before cannot be used"),
    (["--decoder-normalize-before"], "has no LayerNorm: --decoder-normalize-before cannot be used"),
    (["--layernorm-embedding"], "has no LayerNorm: --layernorm-embedding cannot be used"),
    (["--encoder-layers", 0], "needs --encoder-layers >= 1, got 0"),
    (["--decoder-layers", 0], "needs --decoder-layers >= 1, got 0"),
])
def test_flags_that_defeat_tfixup_are_refused(flag, message, dict_dir):
    with pytest.raises(ValueError, match=message) as err:
        build_model(dict_dir, "transformer_tfixup_iwslt_de_en", *SMALL, *flag)
    assert "\n" not in str(err.value)


def test_zero_attention_bias_and_scaled_positions_options(dict_dir):
    """--tfixup-zero-attn-bias: every q/k/v bias starts at zero, nothing else changes;
    --tfixup-scale-positions: the positional embedding is multiplied by the side's (9N)^-1/4."""
    layers = ["--encoder-layers", 2, "--decoder-layers", 8, *SMALL]
    plain, _, _ = build_model(dict_dir, "transformer_tfixup", *layers, seed=3)
    zb, _, _ = build_model(dict_dir, "transformer_tfixup", *layers, "--tfixup-zero-attn-bias",
                           "--tfixup-scale-positions", seed=3)
    zeroed = 0
    for (name, p), (_, q) in zip(plain.named_parameters(), zb.named_parameters()):
        if any(f"{proj}.bias" in name for proj in ("q_proj", "k_proj", "v_proj")):
            assert p.abs().max() > 0 and q.abs().max() == 0, name  # fairseq draws them nonzero
            zeroed += 1
        else:
            torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert zeroed == 3 * (2 + 2 * 8)  # encoder self-attention; decoder self- and cross-attention
    tokens = torch.randint(4, 500, (2, 6))
    for stack, n in ((plain.encoder, 2), (plain.decoder, 8)):
        other = zb.encoder if stack is plain.encoder else zb.decoder
        torch.testing.assert_close(other.embed_positions(tokens), stack.embed_positions(tokens) * (9 * n) ** -0.25)
    zb.eval()
    assert_incremental_decoding_matches_full(zb)  # the hook sees incremental decoding's positions too
    assert_encoder_survives_state_dict_round_trip(zb)
