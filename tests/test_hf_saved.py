"""A T-Fixup HuggingFace model through save_pretrained and from_pretrained (tfixup/hf_auto.py): every family comes
back exactly (the same class, layout, multiplier and weights, logits equal), transformers without tfixup's
registration refuses or warns, a folder without the record loads as before, the record is read by an allow-list,
a model whose config records T-Fixup is not drawn again; wrapped, meta-device and non-finite models are refused in
one line; a T-Fixup class built from its config (also on the meta device, then materialised) is drawn as
apply_tfixup draws; torch.compile and bf16 keep the input multiplier."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the hub

import pytest
import torch
from torch import nn

from tfixup import apply_tfixup, tfixup_init

from hf_available import require_transformers  # noqa: E402

transformers = require_transformers()
from tfixup import hf_auto  # noqa: E402

from test_hf_tfixup import VOCAB, build, norm_modules, std_ratio, xavier  # noqa: E402

AUTO = {"marian": "AutoModelForSeq2SeqLM", "bart": "AutoModelForSeq2SeqLM", "bert": "AutoModelForMaskedLM",
        "roberta": "AutoModelForMaskedLM", "bert-base": "AutoModel", "gpt2": "AutoModelForCausalLM",
        "llama": "AutoModelForCausalLM", "qwen2": "AutoModelForCausalLM", "mistral": "AutoModelForCausalLM"}
CASES = [("marian", {}), ("bart", {}), ("bert", {}), ("roberta", {}), ("bert-base", {}), ("gpt2", {}),
         ("llama", {}), ("llama", {"keep_mlp_norm": True}), ("qwen2", {}), ("mistral", {}),
         ("gpt2", {"input_scale": False}), ("llama", {"gated_mlp": "sigmoid"}), ("llama", {"gated_mlp": "scaled"}),
         ("bert", {"keep_head_norm": True}), ("roberta", {"keep_head_norm": True})]


def logits(model, ids):
    kw = {"decoder_input_ids": ids.roll(1, 1)} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        return model.eval()(input_ids=ids, **kw)[0]


def layout(model):
    """Each module's name and class (with gated_mlp="scaled"'s output factor), and the input multiplier."""
    scale = getattr(model.get_input_embeddings(), "tfixup_input_scale", None)
    return [(n, type(m).__name__, getattr(m, "tfixup_output_scale", None)) for n, m in model.named_modules()], scale


def trained(model):
    """MODEL as after some training: every weight moved off its draw (so a redraw on loading would show)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # not Marian's fixed sinusoids, which transformers computes on loading
                p.add_(torch.randn_like(p) * 0.01)
    return model


@pytest.mark.parametrize("family,options", CASES, ids=[f + "".join(f"-{k}={v}" for k, v in o.items())
                                                       for f, o in CASES])
def test_saved_folder_loads_back_the_same_model(family, options, tmp_path):
    model = build(family)
    apply_tfixup(model, **options)
    trained(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    kind = family.split("-")[0]
    assert saved["model_type"] == f"tfixup_{kind}" and saved["architectures"] == [type(model).__name__]
    multiplier = options.get("input_scale", True) and kind not in ("marian", "bart")  # those keep their own
    assert saved["tfixup"] == {"format": 1, "family": kind, "input_scale": multiplier,
                               "keep_mlp_norm": options.get("keep_mlp_norm", False),
                               "gated_mlp": options.get("gated_mlp"),
                               "keep_head_norm": options.get("keep_head_norm", False)}

    again = getattr(transformers, AUTO[family]).from_pretrained(tmp_path)
    assert type(again) is type(model) and type(again).__name__.startswith("TFixup")
    assert layout(again) == layout(model)
    state, again_state = model.state_dict(), again.state_dict()
    assert state.keys() == again_state.keys() and all(torch.equal(state[k], again_state[k]) for k in state)
    ids = torch.randint(3, VOCAB, (2, 9))
    assert (logits(again, ids) - logits(model, ids)).abs().max().item() <= 1e-6
    with pytest.raises(ValueError, match="applied to it already"):  # a loaded model is never drawn again
        apply_tfixup(again)
    again.init_weights()
    assert all(torch.equal(state[k], again.state_dict()[k]) for k in state)


def test_a_config_shared_with_another_model_stays_the_others():
    """Models built from one config object share it: apply_tfixup gives its model a T-Fixup copy and leaves the
    config and the other model stock (saved, the other is a stock folder)."""
    config = build("llama").config
    stock, fixed = transformers.LlamaForCausalLM(config), transformers.LlamaForCausalLM(config)
    apply_tfixup(fixed)
    assert type(config) is transformers.LlamaConfig and stock.config is config and not hasattr(config, "tfixup")
    assert all(m.config is fixed.config for m in fixed.modules() if hasattr(m, "config"))
    assert type(fixed.config).__name__ == "TFixupLlamaConfig"


def test_plain_transformers_refuses_the_folder_or_warns(tmp_path, monkeypatch):
    """Without tfixup.hf_auto's registration (as in a process that never imported tfixup) the Auto classes refuse
    the model type tfixup_llama; the stock class warns in one line naming it (and reports the missing norms)."""
    from transformers.models.auto import configuration_auto

    model = build("llama")
    apply_tfixup(model)
    model.save_pretrained(tmp_path)
    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING._extra_content, "tfixup_llama")
    with pytest.raises(ValueError, match="model type `tfixup_llama` but Transformers does not recognize"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tfixup_llama"):
        transformers.pipeline("text-generation", model=str(tmp_path))
    warned = []
    monkeypatch.setattr(transformers.configuration_utils.logger, "warning", warned.append)
    stock = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert any("model of type `tfixup_llama` to instantiate a model of type `llama`" in w and "\n" not in w
               for w in warned), warned
    with pytest.raises(ValueError, match="applied to it already"):  # its config still holds the record
        apply_tfixup(stock)


def test_a_folder_without_the_record_loads_as_before(tmp_path):
    """A stock model, and a T-Fixup model saved before the record existed (stock model type, no norm weights): the
    stock class, its norms built again as transformers builds them."""
    stock = build("gpt2")
    stock.save_pretrained(tmp_path / "stock")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "stock")
    assert type(again) is transformers.GPT2LMHeadModel and "tfixup" not in again.config.to_dict()
    ids = torch.randint(3, VOCAB, (1, 6))
    assert torch.equal(logits(again, ids), logits(stock, ids))

    old = build("gpt2")
    apply_tfixup(old)
    old.save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["tfixup"]
    config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "old")
    assert type(loaded) is transformers.GPT2LMHeadModel and len(norm_modules(loaded)) == 2 * 3 + 1


@pytest.mark.parametrize("record,words", [
    ({"format": 1, "family": "llama", "input_scale": True, "keep_mlp_norm": False, "load": "/etc/passwd"},
     "unknown fields 'load'"),
    ({"format": 1, "family": "gpt2"}, "expected format 1 and family 'llama'"),
    ({"format": 2, "family": "llama"}, "expected format 1"),
    ({"format": True, "family": "llama"}, "expected format 1"),
    ({"format": 1, "family": "llama", "input_scale": "yes"}, "input_scale must be true or false"),
    ("llama", "is not a mapping"),
])
def test_a_tampered_record_is_refused_in_one_line(record, words, tmp_path):
    model = build("llama")
    apply_tfixup(model)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tfixup"] = record
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json's tfixup record") as err:
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_keep_head_norm_keeps_the_masked_lm_heads_norm_only():
    """keep_head_norm: BERT keeps its masked-LM head's LayerNorm (the one norm outside the base model) and loses
    the others; a model without that head, or outside BERT/RoBERTa, is refused in one line, as is such a record."""
    model = build("bert")
    apply_tfixup(model, keep_head_norm=True)
    assert norm_modules(model) == ["cls.predictions.transform.LayerNorm"]
    for family in ("bert-base", "gpt2"):
        with pytest.raises(ValueError, match="keep_head_norm keeps the masked-LM head's LayerNorm"):
            apply_tfixup(build(family), keep_head_norm=True)
    with pytest.raises(ValueError, match="keep_head_norm is for bert, roberta, not gpt2"):
        hf_auto.config_class("gpt2")(n_embd=64, n_layer=2, n_head=4, tfixup={"format": 1, "family": "gpt2",
                                                                             "keep_head_norm": True})


def test_keep_mlp_norm_in_a_record_outside_the_llama_family_is_refused():
    with pytest.raises(ValueError, match="keep_mlp_norm is for the Llama family"):
        hf_auto.config_class("gpt2")(n_embd=64, n_layer=2, n_head=4, tfixup={"format": 1, "family": "gpt2",
                                                                             "keep_mlp_norm": True})


def test_a_t_fixup_class_built_from_its_config_is_drawn_as_apply_tfixup_draws():
    """from_config on a T-Fixup config: the stock initialisation, then T-Fixup's draws, as apply_tfixup on the stock
    model from the same seed."""
    reference = build("llama")
    apply_tfixup(reference)
    torch.manual_seed(0)
    fresh = transformers.AutoModelForCausalLM.from_config(reference.config)
    assert type(fresh) is type(reference)
    state, fresh_state = reference.state_dict(), fresh.state_dict()
    assert state.keys() == fresh_state.keys() and all(torch.equal(state[k], fresh_state[k]) for k in state)
    assert layout(fresh) == layout(reference)


def test_meta_device_apply_is_refused_and_a_t_fixup_class_materialises_with_its_draws():
    with torch.device("meta"):
        stock = build("llama")
    with pytest.raises(ValueError, match=r"on the meta device \(not allocated\).*to_empty") as err:
        apply_tfixup(stock)
    assert "\n" not in str(err.value)

    config = hf_auto.config_class("llama")(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert norm_modules(model) == [] and model.model.embed_tokens.tfixup_input_scale == pytest.approx(8.0)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight.fill_(float("nan"))  # what unset memory may hold
    model.init_weights()  # the stock initialisation, then T-Fixup's draws
    assert all(torch.isfinite(p).all() for p in model.parameters())
    scale = tfixup_init.single_stack_scale(3)
    for w in (model.model.layers[0].self_attn.v_proj.weight, model.model.layers[2].mlp.down_proj.weight):
        assert std_ratio(w, xavier(w, scale)) == pytest.approx(1, abs=0.12)
    emb = model.model.embed_tokens.weight
    assert std_ratio(emb, 64 ** -0.5 * scale) == pytest.approx(1, abs=0.12)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.init_weights()  # initialised already: left as it is, as transformers leaves its own models
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_accelerates_big_model_loading_of_a_saved_folder_gives_the_saved_model(tmp_path):
    """accelerate's init_empty_weights (the meta device) builds the T-Fixup class from the folder's config, laid out
    as saved, and load_checkpoint_and_dispatch fills in the folder's weights: the saved model's logits."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed")
    model = trained(build("llama"))
    apply_tfixup(model, keep_mlp_norm=True)
    model.save_pretrained(tmp_path)
    with accelerate.init_empty_weights():
        empty = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    assert type(empty) is type(model) and layout(empty) == layout(model)
    loaded = accelerate.load_checkpoint_and_dispatch(empty, str(tmp_path), device_map={"": "cpu"})
    ids = torch.randint(3, VOCAB, (2, 9))
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def test_a_model_holding_nan_is_refused_in_one_line():
    model = build("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.fill_(float("nan"))  # to_empty without an init, say
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.q_proj\.weight holds NaN or inf"):
        apply_tfixup(model)


def test_a_model_partitioned_by_deepspeed_zero3_is_refused_in_one_line():
    model = build("gpt2")
    model.transformer.h[0].attn.c_attn.weight.ds_id = 7  # what deepspeed.zero.Init leaves on each parameter
    with pytest.raises(ValueError, match=r"h\.0\.attn\.c_attn\.weight is partitioned by DeepSpeed ZeRO-3: "
                                         r"apply it before deepspeed\.initialize"):
        apply_tfixup(model)


def test_a_wrapped_model_is_refused_in_one_line():
    class PeftModel(nn.Module):  # what peft's get_peft_model returns, as far as apply_tfixup sees
        __module__ = "peft.peft_model"

    compiled = torch.compile(build("gpt2"))  # compiles lazily: nothing is compiled here
    for wrapped, words in ((nn.DataParallel(build("gpt2")), "pass model.module"),
                           (compiled, "pass model._orig_mod"), (PeftModel(), "before get_peft_model")):
        with pytest.raises(ValueError, match="wraps the model: apply it before wrapping") as err:
            apply_tfixup(wrapped)
        assert words in str(err.value) and "\n" not in str(err.value)


def test_torch_compile_matches_eager_and_bf16_keeps_the_multiplier():
    """The input multiplier is a forward hook: torch.compile traces it into one graph (fullgraph=True: no graph
    break) and matches eager within 1e-5; model.to(torch.bfloat16) keeps it. The backend here is aot_eager (dynamo's
    graph and AOTAutograd without code generation, seconds); the default inductor backend takes a minute on 2 CPU
    cores (docs/beyond-fairseq.md, "torch.compile and bf16")."""
    import time

    model = build("gpt2", 1)
    apply_tfixup(model)
    ids = torch.randint(3, VOCAB, (2, 8))
    eager = logits(model, ids)
    start = time.monotonic()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        out = compiled(input_ids=ids).logits
    print(f"torch.compile: first call {time.monotonic() - start:.1f} s")
    assert (out - eager).abs().max().item() <= 1e-5
    plain = build("gpt2", 1)
    apply_tfixup(plain, input_scale=False)
    assert (logits(plain, ids) - eager).abs().max().item() > 1e-3  # the multiplier is in the compiled graph

    model.to(torch.bfloat16)
    embedding = model.get_input_embeddings()
    assert embedding.weight.dtype == torch.bfloat16 and embedding.tfixup_input_scale == pytest.approx(8.0)
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * 8.0)
