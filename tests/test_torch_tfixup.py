"""tfixup.torch_tfixup.apply_tfixup on torch's Transformer modules and on a custom stack: the weights it draws
have the spreads of tfixup.tfixup_init's rules (the fairseq model's), no LayerNorm is left, what it cannot
handle is refused with the model left as it was, and a deep stack trains without warmup."""

import pathlib
import re

import pytest
import torch
from torch import nn

from tfixup import tfixup_init
from tfixup.torch_tfixup import Layer, apply_tfixup

D, FFN, HEADS = 64, 128, 4
REPO = pathlib.Path(__file__).resolve().parents[1]


def std_ratio(weight: torch.Tensor, expected: float) -> float:
    return float(weight.detach().double().std()) / expected


def xavier(fan_in, fan_out, scale):
    return tfixup_init.xavier_uniform_std(fan_in, fan_out) * scale


def no_layer_norm(model: nn.Module) -> bool:
    return not any(isinstance(m, nn.LayerNorm) for m in model.modules())


def test_transformer_gets_the_fairseq_models_rules_and_spreads():
    torch.manual_seed(0)
    model = nn.Transformer(D, HEADS, num_encoder_layers=3, num_decoder_layers=2, dim_feedforward=FFN)
    src, tgt = nn.Embedding(50, D, padding_idx=1), nn.Embedding(60, D)
    qk_before = model.encoder.layers[0].self_attn.in_proj_weight[:2 * D].clone()
    done = apply_tfixup(model, embeddings=[src], decoder_embeddings=[tgt])

    assert no_layer_norm(model) and model.encoder.norm.__class__ is nn.Identity
    params = dict(model.named_parameters())
    layer_names = [n for n in done if n.startswith(("encoder.", "decoder."))]
    # every v/out/MLP weight of both stacks (2 attentions in a decoder layer), and nothing else
    assert len(layer_names) == 3 * 4 + 2 * 6
    for name in layer_names:
        scale = tfixup_init.encoder_scale(3) if name.startswith("encoder.") else tfixup_init.decoder_scale(2)
        assert done[name] == pytest.approx(scale), name
        weight = params[name.replace("[v]", "")]
        weight = weight[2 * D:] if name.endswith("[v]") else weight
        assert std_ratio(weight, xavier(weight.shape[1], weight.shape[0], scale)) == pytest.approx(1, abs=0.08)
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            assert not layer.linear1.bias.any() and not layer.linear2.bias.any()
    # q and k rows are torch's Xavier draw, untouched
    assert torch.equal(model.encoder.layers[0].self_attn.in_proj_weight[:2 * D], qk_before)
    # input embeddings: N(0, d^-1/2) times the stack's embedding scale; the padding row zero
    assert std_ratio(src.weight[2:], D ** -0.5 * tfixup_init.embedding_scale(3)) == pytest.approx(1, abs=0.08)
    assert std_ratio(tgt.weight, D ** -0.5 * tfixup_init.embedding_scale(2)) == pytest.approx(1, abs=0.08)
    assert not src.weight[1].any()


def test_encoder_alone_is_one_stack_and_a_tied_embedding_is_scaled_once():
    torch.manual_seed(0)
    n = 5
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, batch_first=True), n,
                                  norm=nn.LayerNorm(D), enable_nested_tensor=False)
    embed = nn.Embedding(300, D)
    head = nn.Linear(D, 300, bias=False)
    head.weight = embed.weight  # tied input/output embedding: one parameter
    done = apply_tfixup(stack, embeddings=[embed, head])
    scale = tfixup_init.single_stack_scale(n)

    assert no_layer_norm(stack) and all(v == pytest.approx(scale) for v in done.values())
    assert len(done) == 4 * n + 1  # v, out, fc1, fc2 per layer; the shared embedding once
    assert std_ratio(embed.weight, D ** -0.5 * scale) == pytest.approx(1, abs=0.08)
    v = stack.layers[n - 1].self_attn.in_proj_weight[2 * D:]
    assert std_ratio(v, xavier(D, D, scale)) == pytest.approx(1, abs=0.08)
    assert std_ratio(stack.layers[0].linear2.weight, xavier(FFN, D, scale)) == pytest.approx(1, abs=0.08)
    # evaluation computes what training does (dropout 0): torch's fused Post-LN kernel is never taken
    x, pad = torch.randn(2, 7, D), torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    train_out = stack.train()(x, src_key_padding_mask=pad)
    with torch.no_grad():
        eval_out = stack.eval()(x, src_key_padding_mask=pad)
    assert torch.allclose(train_out[~pad], eval_out[~pad], atol=1e-5)


def test_decoder_alone_keeps_the_papers_decoder_rule():
    torch.manual_seed(0)
    stack = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, HEADS, FFN), 4)
    embed = nn.Embedding(40, D)
    done = apply_tfixup(stack, decoder_embeddings=[embed])
    assert no_layer_norm(stack) and len(done) == 6 * 4 + 1
    assert all(v == pytest.approx(tfixup_init.decoder_scale(4)) for v in done.values())
    w = stack.layers[2].multihead_attn.out_proj.weight
    assert std_ratio(w, xavier(D, D, tfixup_init.decoder_scale(4))) == pytest.approx(1, abs=0.08)


class Block(nn.Module):
    """A user's own residual block: separate q/k/v, no LayerNorm."""

    def __init__(self, dim, ffn, norm=False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()

    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / x.shape[-1] ** 0.5, -1)
        x = self.norm(x + self.o(a @ self.v(x)))
        return x + self.fc2(torch.relu(self.fc1(x)))


class Custom(nn.Module):
    def __init__(self, n, norm_at=None):
        super().__init__()
        self.embed = nn.Embedding(30, D)
        self.blocks = nn.ModuleList(Block(D, FFN, norm=(i == norm_at)) for i in range(n))

    def spec(self):
        return [Layer(attention=[(b.v, b.o)], mlp=[b.fc1, b.fc2]) for b in self.blocks]


def test_custom_stack_from_its_spec():
    torch.manual_seed(0)
    model = Custom(6)
    q_before = model.blocks[3].q.weight.clone()
    done = apply_tfixup(model, layers=model.spec(), embeddings=[model.embed])
    scale = tfixup_init.single_stack_scale(6)
    assert set(done) == {f"blocks.{i}.{p}.weight" for i in range(6) for p in ("v", "o", "fc1", "fc2")} | {
        "embed.weight"}
    for p, (fan_in, fan_out) in {"v": (D, D), "o": (D, D), "fc1": (D, FFN), "fc2": (FFN, D)}.items():
        w = torch.cat([getattr(b, p).weight.flatten() for b in model.blocks])
        assert std_ratio(w, xavier(fan_in, fan_out, scale)) == pytest.approx(1, abs=0.05), p
    assert torch.equal(model.blocks[3].q.weight, q_before)
    assert not model.blocks[0].fc1.bias.any()
    assert std_ratio(model.embed.weight, D ** -0.5 * scale) == pytest.approx(1, abs=0.1)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def unchanged(model, before) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("case, message", [
    ("layer norm left", r"blocks\.2\.norm is a LayerNorm; T-Fixup trains without LayerNorm: replace it with nn\.Identity"),
    ("pre-ln", r"norm_first=True \(Pre-LN.*build the layers with norm_first=False"),
    ("fused qkv linear", r"value projection gives 192 features, 3 x the 64 the output projection takes: a fused qkv "
                         r"Linear; if its output rows are \[q \| k \| v\] \(nanoGPT's c_attn\), pass "
                         r"Layer\(\.\.\., qkv=True\)"),
    ("qkv=True on a plain value", r"Layer\(qkv=True\) but the fused projection gives 64 features"),
    ("swapped pair", r"value projection gives 128 features but the output projection takes 64"),
    ("no spec", r"unknown layout Custom: pass layers="),
    ("two attentions in one stack", r"has 2 attentions"),
    ("not a linear", r"an attention must be nn\.MultiheadAttention or a \(value, output\) pair"),
    ("custom encoder in nn.Transformer", r"the encoder is a custom Linear, not torch's"),
    ("keep_mlp_norm on a described stack", r"keep_mlp_norm is for HuggingFace Llama-family models; Custom is described"),
])
def test_refusals_are_one_line_and_change_nothing(case, message):
    torch.manual_seed(0)
    if case == "pre-ln":
        model = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, FFN, norm_first=True), 3,
                                      enable_nested_tensor=False)
        kwargs = {}
    elif case == "custom encoder in nn.Transformer":
        model = nn.Transformer(D, HEADS, 1, 2, FFN, custom_encoder=nn.Linear(D, D))
        kwargs = {}
    else:
        model = Custom(3, norm_at=2 if case == "layer norm left" else None)
        kwargs = {"layers": model.spec()}
        if case == "fused qkv linear":
            model.blocks[1].qkv = nn.Linear(D, 3 * D)
            kwargs["layers"][1] = Layer(attention=[(model.blocks[1].qkv, model.blocks[1].o)])
        elif case == "qkv=True on a plain value":
            b = model.blocks[1]
            kwargs["layers"][1] = Layer(attention=[(b.v, b.o)], qkv=True)
        elif case == "swapped pair":
            b = model.blocks[1]
            kwargs["layers"][1] = Layer(attention=[(nn.Linear(D, 2 * D), b.o)])
        elif case == "no spec":
            kwargs = {}
        elif case == "two attentions in one stack":
            b = model.blocks[0]
            kwargs["layers"][0] = Layer(attention=[(b.v, b.o), (b.v, b.o)])
        elif case == "not a linear":
            kwargs["layers"][0] = Layer(attention=[model.blocks[0]])
        elif case == "keep_mlp_norm on a described stack":
            kwargs["keep_mlp_norm"] = True
    before = snapshot(model)
    with pytest.raises(ValueError) as err:
        apply_tfixup(model, **kwargs)
    text = str(err.value)
    assert "\n" not in text and re.search(message, text), text
    assert unchanged(model, before)
    if case == "pre-ln":
        assert not no_layer_norm(model)  # its norms are still there


def test_deep_encoder_trains_without_warmup_or_nan():
    """24 layers, no LayerNorm, Adam at a constant lr from the first step: a toy task (the next symbol of
    each token in a cyclic alphabet) is learnt, and the loss never goes NaN."""
    torch.manual_seed(0)
    vocab, dim, n = 16, 32, 24
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 2, 64, dropout=0.0, batch_first=True), n,
                                  enable_nested_tensor=False)
    embed, pos = nn.Embedding(vocab, dim), nn.Embedding(12, dim)
    apply_tfixup(stack, embeddings=[embed, pos])
    params = [*stack.parameters(), *embed.parameters(), *pos.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    losses = []
    for _ in range(25):
        x = torch.randint(0, vocab, (16, 12))
        h = stack(embed(x) + pos.weight)
        logits = h @ embed.weight.t()
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), ((x + 1) % vocab).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.75 * losses[0], losses  # from ln(16) = 2.77 toward 0


def python_blocks(text: str) -> list:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_docs_python_blocks_are_the_example_or_run():
    """docs/beyond-fairseq.md: its first plain-PyTorch block is an excerpt of examples/tfixup_lm.py as it is (the
    example itself runs in test_docs_commands); the custom-stack block runs on a model with those names. (The
    HuggingFace block runs in test_hf_tfixup.)"""
    blocks = [b for b in python_blocks((REPO / "docs" / "beyond-fairseq.md").read_text()) if "transformers" not in b]
    assert len(blocks) == 2
    assert blocks[0] in (REPO / "examples" / "tfixup_lm.py").read_text()
    model = Custom(4)
    model.tok_emb = model.embed
    before = model.blocks[2].v.weight.clone()
    exec(blocks[1], {"model": model})
    assert not torch.equal(model.blocks[2].v.weight, before)
    assert std_ratio(model.tok_emb.weight, D ** -0.5 * tfixup_init.single_stack_scale(4)) == pytest.approx(1, abs=0.1)


def test_importable_without_fairseq():
    import subprocess
    import sys

    code = ("import sys; sys.modules['fairseq'] = None\n"  # any import of fairseq now fails
            "import torch; from tfixup.torch_tfixup import apply_tfixup\n"
            "apply_tfixup(torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), 2, "
            "enable_nested_tensor=False))\n"
            "assert 'fairseq_tfixup' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_fused_qkv_linear_with_qkv_true_draws_only_its_value_rows():
    """nanoGPT's block: c_attn = nn.Linear(d, 3d) whose output rows are [q | k | v]."""
    torch.manual_seed(0)
    n = 3
    model = Custom(n)
    fused = [nn.Linear(D, 3 * D) for _ in range(n)]
    qk = [f.weight[:2 * D].clone() for f in fused]
    spec = [Layer(attention=[(f, b.o)], mlp=[b.fc1, b.fc2], qkv=True) for f, b in zip(fused, model.blocks)]
    holder = nn.ModuleDict({"model": model, "fused": nn.ModuleList(fused)})
    done = apply_tfixup(holder, layers=spec, embeddings=[model.embed])
    scale = tfixup_init.single_stack_scale(n)
    for i, f in enumerate(fused):
        assert torch.equal(f.weight[:2 * D], qk[i])
        assert done[f"fused.{i}.weight[v]"] == pytest.approx(scale)
        assert std_ratio(f.weight[2 * D:], xavier(D, D, scale)) == pytest.approx(1, abs=0.1)


def test_grouped_value_heads_are_their_own_matrix():
    torch.manual_seed(0)
    model = Custom(2)
    grouped = [nn.Linear(D, D // 4, bias=False) for _ in range(2)]  # 1 KV head for 4 query heads
    spec = [Layer(attention=[(g, b.o)], mlp=[b.fc1, b.fc2]) for g, b in zip(grouped, model.blocks)]
    holder = nn.ModuleDict({"model": model, "grouped": nn.ModuleList(grouped)})
    apply_tfixup(holder, layers=spec, embeddings=[model.embed])
    scale = tfixup_init.single_stack_scale(2)
    assert std_ratio(grouped[0].weight, xavier(D, D // 4, scale)) == pytest.approx(1, abs=0.12)


def test_embeddings_outside_the_model_are_each_named_by_their_argument():
    """nn.Transformer holds no embedding: both were scaled but reported under one key
    ('embedding Embedding.weight'), the decoder's scale overwriting the encoder's."""
    model = nn.Transformer(D, HEADS, num_encoder_layers=3, num_decoder_layers=2, dim_feedforward=FFN)
    src, tgt = nn.Embedding(50, D), nn.Embedding(60, D)
    done = apply_tfixup(model, embeddings=[src], decoder_embeddings=[tgt])
    assert done["embeddings[0].weight"] == pytest.approx(tfixup_init.embedding_scale(3))
    assert done["decoder_embeddings[0].weight"] == pytest.approx(tfixup_init.embedding_scale(2))
    # a custom stack's projections outside the model: by their place in layers=
    blocks = Custom(2)
    done = apply_tfixup(nn.Module(), layers=blocks.spec())
    assert set(done) == {f"layers[{i}].{p}" for i in range(2)
                         for p in ("attention[0].value.weight", "attention[0].output.weight", "mlp[0].weight",
                                   "mlp[1].weight")}


@pytest.mark.parametrize("case", ["parametrized weight norm", "legacy weight norm", "long embedding"])
def test_what_it_cannot_set_is_refused_before_anything_changes(case):
    """A weight-normed Linear was listed as scaled but kept its weight (the tensor changed is recomputed from
    weight_g and weight_v); a Long embedding failed after the LayerNorms were already gone."""
    import warnings

    torch.manual_seed(0)
    if case == "long embedding":
        model = nn.Transformer(D, HEADS, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=FFN)
        embed = nn.Embedding(10, D)
        embed.weight = nn.Parameter(torch.zeros(10, D, dtype=torch.long), requires_grad=False)
        kwargs, message = {"embeddings": [embed]}, r"embeddings\[0\] \(Embedding\) has a torch\.int64 weight"
    else:
        model = Custom(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the legacy weight_norm
            if case == "parametrized weight norm":
                model.blocks[1].fc1 = nn.utils.parametrizations.weight_norm(model.blocks[1].fc1)
            else:
                model.blocks[1].fc1 = nn.utils.weight_norm(model.blocks[1].fc1)
        kwargs, message = {"layers": model.spec()}, r"layers\[1\]\.mlp\[0\] has a weight computed by weight norm"
    before = snapshot(model)
    with pytest.raises(ValueError, match=message) as err:
        apply_tfixup(model, **kwargs)
    assert "\n" not in str(err.value) and unchanged(model, before)
    if case == "long embedding":
        assert not no_layer_norm(model)  # checked before the LayerNorms were removed


def test_the_example_lm_trains_in_fp32_and_bf16_autocast_and_overlays_them(shared_data, tmp_path):
    """examples/tfixup_lm.py --precision fp32,bf16 --out DIR: both runs from the same seed, their curves in
    tfixup_lm_precision.json and .png; an unknown precision is refused."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("tfixup_lm", REPO / "examples" / "tfixup_lm.py")
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    common = ["--text", str(shared_data / "multi30k" / "train.en.gz"), "--valid", str(shared_data / "multi30k" / "val.en.gz"),
              "--train-lines", "200", "--valid-lines", "20", "--vocab", "300", "--layers", "1", "--steps", "3",
              "--evals", "1"]
    lm.main([*common, "--precision", "fp32,bf16", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "tfixup_lm_precision.json").read_text())
    assert list(record["runs"]) == ["fp32", "bf16"]
    fp32, bf16 = record["runs"]["fp32"], record["runs"]["bf16"]
    assert [s for s, _ in fp32["valid_ppl"]] == [0, 3] and len(bf16["train_loss"]) == 3
    assert fp32["valid_ppl"][0][1] == pytest.approx(bf16["valid_ppl"][0][1], rel=0.02)  # the same init, bf16 matmuls
    assert fp32["valid_ppl"][0][1] != bf16["valid_ppl"][0][1]
    assert (tmp_path / "tfixup_lm_precision.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        lm.main([*common, "--precision", "fp16"])


def test_a_wrapped_meta_device_or_non_finite_torch_model_is_refused_in_one_line():
    """torch's own stacks as HuggingFace models: a wrapper (DataParallel, torch.compile) names the way forward; a
    model on the meta device or holding NaN (to_empty without an init) is refused before anything changes."""
    def encoder():
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32), 2, enable_nested_tensor=False)

    with torch.device("meta"):
        meta = encoder()
    nan = encoder()
    with torch.no_grad():
        nan.layers[1].linear1.weight[0, 0] = float("nan")
    cases = [(nn.DataParallel(encoder()), "DataParallel wraps the model: apply it before wrapping, or pass "
                                          "model.module"),
             (meta, "layers.0.self_attn.in_proj_weight is on the meta device (not allocated)"),
             (nan, "layers.1.linear1.weight holds NaN or inf")]
    for model, message in cases:
        norms = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            apply_tfixup(model, embeddings=[nn.Embedding(10, 16)])
        assert "\n" not in str(err.value) and sum(isinstance(m, nn.LayerNorm) for m in model.modules()) == norms
