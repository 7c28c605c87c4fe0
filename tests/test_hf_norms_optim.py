"""tfixup/hf_norms.py (DyT and Derf in place of a Llama's RMSNorms) and tfixup/optim.py (GI-Adam's start), on a
tiny Llama built from its config and on one tensor."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tfixup.hf_norms import Pointwise, pointwise_norms_  # noqa: E402
from tfixup.optim import gi_adam_init_  # noqa: E402


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_pointwise_norms_replace_every_rmsnorm_and_scale_the_input(kind):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16))
    ids = torch.randint(0, 40, (2, 5))
    assert pointwise_norms_(model, kind, {"attention": 0.8, "mlp": 0.2, "final": 0.3}, 0.1) == 5
    assert not [m for m in model.modules() if "rmsnorm" in type(m).__name__.lower()]
    norm = model.model.layers[1].post_attention_layernorm
    assert isinstance(norm, Pointwise) and norm.alpha.item() == pytest.approx(0.2)
    assert model.model.norm.alpha.item() == pytest.approx(0.3) and (norm.shift is not None) == (kind == "derf")
    assert model.model.embed_tokens.learned_scale.item() == pytest.approx(16 ** 0.5)
    x = torch.linspace(-3, 3, 16)
    expect = torch.tanh(0.2 * x) if kind == "dyt" else torch.erf(0.2 * x + 0.1)
    assert torch.allclose(norm(x), expect)
    model(input_ids=ids).logits.sum().backward()
    assert norm.alpha.grad is not None and model.model.embed_tokens.learned_scale.grad is not None
    with pytest.raises(ValueError, match="unknown element-wise norm 'ln'"):
        Pointwise("ln", 4, 1.0)
    with pytest.raises(ValueError, match="not laid out as a Llama"):
        pointwise_norms_(torch.nn.Linear(2, 2), kind, {})


def test_gi_adam_starts_the_second_moment_at_the_first_gradient_squared():
    """The first update of GI-Adam is lr * sqrt(1 - beta2) * sign(g) per weight (m = (1 - beta1) g, bias-corrected
    to g; v = g^2, bias-corrected to g^2 / (1 - beta2)), not Adam's lr * sign(g)."""
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.9, 0.98), eps=0.0, weight_decay=0.0)
    (w * torch.tensor([0.5, -4.0, 1e-3])).sum().backward()
    assert gi_adam_init_(opt) == 1
    opt.step()
    step = torch.tensor([1.0, -2.0, 3.0]) - w.detach()
    assert torch.allclose(step, 0.1 * 0.02 ** 0.5 * torch.tensor([1.0, -1.0, 1.0]), rtol=1e-5)
    with pytest.raises(ValueError, match="before its first step"):
        gi_adam_init_(opt)
