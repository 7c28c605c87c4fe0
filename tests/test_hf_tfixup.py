"""apply_tfixup(model) on HuggingFace models built from tiny configs (no download): no normalisation module is
left, each weight it draws has the spread of tfixup_init's rules, only GPT-2's value columns are touched, HF's
own init is replaced rather than multiplied, train() and eval() compute the same, tied embeddings are scaled
once, and a refused model is left as it was."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the hub

import pytest
import torch
from torch import nn

from tfixup import Layer, apply_tfixup, tfixup_init

from hf_available import require_transformers  # noqa: E402

transformers = require_transformers()

D, FFN, HEADS, VOCAB = 64, 128, 4, 300
TOL = 0.12  # relative error of a std estimated from a 64 x 64 (or larger) matrix


def build(family: str, layers: int = 3, decoder_layers: int = 2, **kw):
    """A tiny model of FAMILY, dropout 0, seeded."""
    torch.manual_seed(0)
    t = transformers
    encdec = dict(d_model=D, encoder_layers=layers, decoder_layers=decoder_layers, encoder_attention_heads=HEADS,
                  decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=64)
    bert = dict(hidden_size=D, num_hidden_layers=layers, num_attention_heads=HEADS, intermediate_size=FFN,
                vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                max_position_embeddings=64, pad_token_id=1)
    llama = dict(hidden_size=D, intermediate_size=FFN, num_hidden_layers=layers, num_attention_heads=HEADS,
                 num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    model = {
        "marian": lambda: t.MarianMTModel(t.MarianConfig(**encdec, scale_embedding=True, **kw)),
        "bart": lambda: t.BartForConditionalGeneration(t.BartConfig(**encdec, **kw)),
        "bert": lambda: t.BertForMaskedLM(t.BertConfig(**bert, **kw)),
        "bert-base": lambda: t.BertModel(t.BertConfig(**bert, **kw)),
        "roberta": lambda: t.RobertaForMaskedLM(t.RobertaConfig(**bert, **kw)),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_embd=D, n_layer=layers, n_head=HEADS, vocab_size=VOCAB,
                                                       n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                                       attn_pdrop=0.0, bos_token_id=0, eos_token_id=2, **kw)),
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**llama, **kw)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**llama, **kw)),
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**llama, **kw)),
    }[family]()
    return model


FAMILIES = ("marian", "bart", "bert", "bert-base", "roberta", "gpt2", "llama", "qwen2", "mistral")


def norm_modules(model: nn.Module):
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.LayerNorm) or type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]


def std_ratio(weight: torch.Tensor, expected: float) -> float:
    return float(weight.detach().double().std()) / expected


def xavier(weight: torch.Tensor, scale: float) -> float:
    return tfixup_init.xavier_uniform_std(*weight.shape) * scale


def expected(family: str, name: str, n: int, n_dec: int) -> float:
    """The scale tfixup_init's rules give parameter NAME (the paper's, by stack, for an encoder-decoder)."""
    if family in ("marian", "bart"):
        encoder = name.startswith(("model.encoder.", "model.shared."))  # a shared embedding: the encoder's
        return tfixup_init.stack_factors("encoder" if encoder else "decoder", n if encoder else n_dec)[
            1 if "embed_tokens" in name or "shared" in name else 0]
    return tfixup_init.single_stack_scale(n)


# what each family's report must name per layer (suffixes), and its token embedding
PER_LAYER = {
    "marian": (4, 6), "bart": (4, 6),  # encoder layer: v, out, fc1, fc2; decoder layer: 2 attentions more
    "bert": (4,), "bert-base": (4,), "roberta": (4,), "gpt2": (4,),
    "llama": (5,), "qwen2": (5,), "mistral": (5,),  # v, o, gate, up, down
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_norm_goes_every_scaled_weight_has_the_rules_spread_and_train_equals_eval(family):
    n, n_dec = 3, 2
    model = build(family, n, n_dec)
    assert norm_modules(model)
    done = apply_tfixup(model)

    assert norm_modules(model) == []
    counts = PER_LAYER[family]
    layer_weights = counts[0] * n + (counts[1] * n_dec if len(counts) > 1 else 0)
    assert len(done) == layer_weights + 1, sorted(done)  # one token embedding (tied or shared: once)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, scale in done.items():
        assert scale == pytest.approx(expected(family, name, n, n_dec)), name
        weight = params[name.replace("[v]", "")]
        if name.endswith("[v]"):
            weight = weight[:, 2 * D:]
        if "embed" in name or "wte" in name or "shared" in name:
            padding = getattr(model.get_input_embeddings(), "padding_idx", None)
            rows = [r for r in range(weight.shape[0]) if r != padding]
            assert std_ratio(weight[rows], D ** -0.5 * scale) == pytest.approx(1, abs=TOL), name
            if padding is not None:
                assert not weight[padding].any()
        else:
            assert std_ratio(weight, xavier(weight, scale)) == pytest.approx(1, abs=TOL), name
    # dropout 0: train() and eval() compute the same (no kernel of eval() brings a norm back)
    ids = torch.randint(3, VOCAB, (2, 10))
    kw = {"decoder_input_ids": ids.roll(1, 1)} if family in ("marian", "bart") else {}
    with torch.no_grad():
        model.train()
        a = model(input_ids=ids, **kw)[0]
        model.eval()
        b = model(input_ids=ids, **kw)[0]
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)


def test_gpt2_value_columns_only_and_c_proj_not_compounded():
    n = 4
    model = build("gpt2", n)
    qk = [layer.attn.c_attn.weight[:, :2 * D].clone() for layer in model.transformer.h]
    attn_bias = [layer.attn.c_attn.bias.clone() for layer in model.transformer.h]
    wpe = model.transformer.wpe.weight.clone()
    done = apply_tfixup(model)
    scale = tfixup_init.single_stack_scale(n)
    for i, layer in enumerate(model.transformer.h):
        assert torch.equal(layer.attn.c_attn.weight[:, :2 * D], qk[i])  # q and k columns: bitwise HF's draw
        assert torch.equal(layer.attn.c_attn.bias, attn_bias[i])
        assert done[f"transformer.h.{i}.attn.c_attn.weight[v]"] == pytest.approx(scale)
        # c_proj: Xavier x (6N)^-1/4, not HF's 0.02/sqrt(2L) draw multiplied by it
        for proj in (layer.attn.c_proj.weight, layer.mlp.c_proj.weight):
            assert std_ratio(proj, xavier(proj, scale)) == pytest.approx(1, abs=TOL)
            hf_then_scaled = model.config.initializer_range / (2 * n) ** 0.5 * scale
            assert float(proj.detach().std()) > 2 * hf_then_scaled
    assert torch.equal(model.transformer.wpe.weight, wpe)  # positions: HF's
    assert model.lm_head.weight is model.transformer.wte.weight


def test_llama_grouped_value_heads_and_untied_head():
    model = build("llama", 2)
    head = model.lm_head.weight.clone()
    q = model.model.layers[0].self_attn.q_proj.weight.clone()
    apply_tfixup(model)
    v = model.model.layers[0].self_attn.v_proj.weight
    assert tuple(v.shape) == (D // 2, D)  # 2 KV heads of 4: v_proj is its own (kv_dim, d) matrix
    assert std_ratio(v, xavier(v, tfixup_init.single_stack_scale(2))) == pytest.approx(1, abs=TOL)
    assert torch.equal(model.lm_head.weight, head) and torch.equal(model.model.layers[0].self_attn.q_proj.weight, q)


@pytest.mark.parametrize("family", ["llama", "bert", "marian"])
def test_tied_embedding_is_scaled_once(family):
    kw = {"tie_word_embeddings": True} if family == "llama" else {}
    model = build(family, 2, 2, **kw)
    apply_tfixup(model)
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is emb
    scale = expected(family, "model.shared.weight" if family == "marian" else "embed", 2, 2)
    assert std_ratio(emb[3:], D ** -0.5 * scale) == pytest.approx(1, abs=TOL)


def test_marian_shared_embedding_takes_the_encoders_factor_and_keeps_its_sqrt_d():
    model = build("marian", 3, 2)
    done = apply_tfixup(model)
    assert done["model.shared.weight"] == pytest.approx(tfixup_init.embedding_scale(3))
    assert model.model.encoder.embed_scale == pytest.approx(D ** 0.5)  # Marian's multiplier, as fairseq keeps it


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(model, before):
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_refusals_name_the_model_and_leave_it_unchanged():
    t = transformers
    cases = [
        (t.GPTNeoXForCausalLM(t.GPTNeoXConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS,
                                              intermediate_size=FFN, vocab_size=VOCAB)), "interleaves"),
        (t.BloomForCausalLM(t.BloomConfig(hidden_size=D, n_layer=2, n_head=HEADS, vocab_size=VOCAB)), "(heads, 3"),
        (t.GPTJForCausalLM(t.GPTJConfig(n_embd=D, n_layer=2, n_head=HEADS, vocab_size=VOCAB, rotary_dim=8)),
         "'gptj') is not one of"),
        (build("gpt2", 2, add_cross_attention=True), "add_cross_attention"),
        (t.MarianForCausalLM(t.MarianConfig(d_model=D, decoder_layers=2, decoder_attention_heads=HEADS,
                                            decoder_ffn_dim=FFN, vocab_size=VOCAB, pad_token_id=1,
                                            decoder_start_token_id=2)), "not an encoder-decoder"),
    ]
    odd = build("llama", 2)
    del odd.model.layers[1].self_attn.v_proj  # a layout tfixup.hf does not know
    cases.append((odd, "not laid out as tfixup.hf reads it"))
    for model, words in cases:
        before = state(model)
        with pytest.raises(ValueError, match="layers=") as err:
            apply_tfixup(model)
        assert words in str(err.value) and "\n" not in str(err.value)
        assert_unchanged(model, before)


def test_applied_twice_is_refused_and_embeddings_arg_is_refused():
    model = build("llama", 2)
    apply_tfixup(model)
    before = state(model)
    with pytest.raises(ValueError, match="applied to it already"):
        apply_tfixup(model)
    assert_unchanged(model, before)
    fresh = build("gpt2", 2)
    before = state(fresh)
    with pytest.raises(ValueError, match="without embeddings="):
        apply_tfixup(fresh, embeddings=[fresh.transformer.wte])
    assert_unchanged(fresh, before)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_keep_mlp_norm_keeps_the_norm_before_each_gated_mlp_only(family):
    """keep_mlp_norm: the Llama family keeps each post_attention_layernorm (the RMSNorm before its gated MLP),
    loses every other norm, and is scaled as without it; other families refuse it unchanged; a second call
    is refused although a norm is left."""
    model, plain = build(family, 3), build(family, 3)
    torch.manual_seed(0)
    scaled = apply_tfixup(model, keep_mlp_norm=True)
    torch.manual_seed(0)
    assert scaled == apply_tfixup(plain)
    kept = [n for n, m in model.named_modules() if "norm" in type(m).__name__.lower()]
    assert kept == [f"model.layers.{i}.post_attention_layernorm" for i in range(3)]
    weights, plain_weights = dict(model.named_parameters()), dict(plain.named_parameters())
    assert all(torch.equal(weights[n], plain_weights[n]) for n in scaled)  # the same draws
    before = state(model)
    for again in (dict(), dict(keep_mlp_norm=True)):
        with pytest.raises(ValueError, match="applied to it already"):
            apply_tfixup(model, **again)
        assert_unchanged(model, before)
    gpt2 = build("gpt2", 2)
    before = state(gpt2)
    with pytest.raises(ValueError, match=r"keep_mlp_norm keeps the RMSNorm before the gated MLP of the Llama family "
                                         r"\(llama, qwen2, mistral\); GPT2LMHeadModel \(model type 'gpt2'\) has none"):
        apply_tfixup(gpt2, keep_mlp_norm=True)
    assert_unchanged(gpt2, before)


def test_gpt2_block_as_a_pair_names_the_way_forward():
    model = build("gpt2", 2)
    before = state(model)
    spec = [Layer(attention=[(b.attn.c_attn, b.attn.c_proj)], mlp=[b.mlp.c_fc, b.mlp.c_proj])
            for b in model.transformer.h]
    with pytest.raises(ValueError, match=r"apply_tfixup\(model\)"):
        apply_tfixup(model, layers=spec)
    assert_unchanged(model, before)


def test_fairseq_and_transformers_work_in_one_environment():
    """scripts/install.sh installs both; a torchaudio that cannot load (fairseq-fixed pulls one built for another
    torch) would break every transformers model, so an installed one must load."""
    import importlib.util

    if importlib.util.find_spec("torchaudio") is not None:
        import torchaudio  # noqa: F401  (scripts/install.sh removes one that does not load)
    pytest.importorskip("fairseq")
    import fairseq_tfixup  # noqa: F401  (registers the plugin)
    from fairseq.models import ARCH_MODEL_REGISTRY

    assert "transformer_tfixup" in ARCH_MODEL_REGISTRY
    assert apply_tfixup(build("llama", 1))


def test_marian_unshared_embeddings_take_their_own_sides_factor():
    model = build("marian", 3, 2, share_encoder_decoder_embeddings=False)
    done = apply_tfixup(model)
    enc, dec = model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight
    assert enc is not dec and model.lm_head.weight is dec
    assert done["model.encoder.embed_tokens.weight"] == pytest.approx(tfixup_init.embedding_scale(3))
    assert done["model.decoder.embed_tokens.weight"] == pytest.approx(tfixup_init.embedding_scale(2))


def test_saved_state_loads_into_a_model_built_and_fixed_the_same_way(tmp_path):
    model = build("gpt2", 2)
    apply_tfixup(model)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    again = build("gpt2", 2)
    apply_tfixup(again)
    again.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    ids = torch.randint(3, VOCAB, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, again(input_ids=ids).logits)


def test_tfixup_imports_without_transformers_for_torch_models():
    import subprocess
    import sys

    code = ("import sys; import torch; from tfixup import apply_tfixup; "
            "m = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, 32), 2, enable_nested_tensor=False); "
            "apply_tfixup(m, embeddings=[torch.nn.Embedding(10, 16)]); assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docs_huggingface_block_runs_as_written():
    """docs/beyond-fairseq.md's HuggingFace block: a Llama from a config, apply_tfixup, the optimizer."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "beyond-fairseq.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "transformers" in b]
    assert len(blocks) == 1
    scope = {}
    exec(blocks[0], scope)
    n = scope["config"].num_hidden_layers
    assert len(scope["report"]) == 5 * n + 1 and norm_modules(scope["model"]) == []
    assert scope["report"]["model.layers.0.self_attn.v_proj.weight"] == pytest.approx(0.408, abs=5e-4)


def test_readme_huggingface_block_runs_as_written(tmp_path, monkeypatch):
    """README's block: a Llama from a config, apply_tfixup (every norm gone, each block's five matrices scaled),
    Trainer on T-Fixup's schedule (here on 8 rows of random ids: `train` is the reader's), save_pretrained, and
    the Auto class gives the same model back."""
    import pathlib
    import re

    pytest.importorskip("accelerate", reason="accelerate (Trainer's dependency, requirements-hf.txt) is not installed")
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "transformers" in b]
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) <= 8
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    rows = torch.randint(3, 1000, (8, 16))
    scope = {"train": [{"input_ids": r, "labels": r} for r in rows]}
    exec(blocks[0], scope)  # as written: 3 epochs of one batch
    model, again = scope["model"], scope["again"]
    n = model.config.num_hidden_layers
    assert len(scope["scaled"]) == 5 * n + 1 and norm_modules(model) == [] and norm_modules(again) == []
    assert type(again) is type(model) and model.config.tfixup == again.config.tfixup
    with torch.no_grad():
        assert torch.equal(model.eval()(rows[:2]).logits, again.eval()(rows[:2]).logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_without_an_embedding_multiplier_gets_fairseqs_sqrt_d(family):
    """BERT, RoBERTa, GPT-2 and the Llama family have no embedding multiplier: apply_tfixup multiplies the token
    embedding's output by sqrt(d), as fairseq's embed_scale does (the tied output projection reads the weight
    itself, unmultiplied); Marian and BART keep their config's own; input_scale=False leaves it out."""
    model = build(family)
    apply_tfixup(model)
    embedding = model.get_input_embeddings()
    ids = torch.tensor([[3, 4, 5]])
    factor = getattr(embedding, "tfixup_input_scale", 1.0)
    assert factor == (1.0 if family in ("marian", "bart") else pytest.approx(D ** 0.5)), family
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * factor)
    head = model.get_output_embeddings()
    if head is not None and head.weight is embedding.weight:  # tied: the head's logits use the bare weight
        h = torch.randn(1, D)
        torch.testing.assert_close(head(h)[..., :VOCAB], (h @ embedding.weight.T)[..., :VOCAB]
                                   + (head.bias[:VOCAB] if getattr(head, "bias", None) is not None else 0))
    plain = build(family)
    apply_tfixup(plain, input_scale=False)
    assert not hasattr(plain.get_input_embeddings(), "tfixup_input_scale")
    torch.testing.assert_close(plain.get_input_embeddings()(ids), plain.get_input_embeddings().weight[ids])
