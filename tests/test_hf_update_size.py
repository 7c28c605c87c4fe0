"""tfixup-diagnose update-size --family hf (tfixup/update_size_stacks.py), the numeric check of docs/derivation.md's HuggingFace blocks, at a tiny size on real
text: after apply_tfixup a Llama-style stack's update (no biases: RMSNorm gone, SwiGLU, rotary, grouped KV) does
not grow with depth while the stock pre-norm one's does; the command writes its tables."""

import json

import pytest

pytest.importorskip("transformers")

from tfixup import update_size_stacks as su  # noqa: E402


@pytest.fixture(scope="module")
def tokens(shared_data):
    return su.token_batch(shared_data / "multi30k" / "train.en.gz", vocab=200, batch=4, length=16)


def test_llama_with_tfixup_is_flat_in_depth_and_stock_is_not(tokens):
    def size(method, n):
        return su.sgd_step(su.build_hf("llama", method, 200, 32, 64, 2, n, seed=1), tokens, 1e-4)["hidden"]

    assert 0.7 < size("tfixup", 4) / size("tfixup", 1) < 1.4
    assert size("stock", 4) / size("stock", 1) > 2


def test_command_writes_tables(shared_data, tmp_path):
    su.main(["--family", "hf", "--out", str(tmp_path), "--families", "gpt2,bert", "--depths", "1,2", "--inits", "1",
             "--dim", "32", "--ffn", "64", "--heads", "2", "--vocab", "200", "--batch", "4", "--length", "16",
             "--text", str(shared_data / "multi30k" / "train.en.gz")])
    saved = json.loads((tmp_path / "hf_update_size.json").read_text())
    assert saved["methods"].keys() == {"gpt2 tfixup", "gpt2 stock", "bert tfixup", "bert stock"}
    assert all(len(m["hidden"]) == 2 and all(v > 0 for v in m["hidden"]) for m in saved["methods"].values())
    assert "| gpt2 tfixup | hidden, biases not stepped |" in (tmp_path / "hf_update_size.md").read_text()


def test_one_part_stepped_leaves_the_others_without_gradient():
    model = su.build_hf("llama", "tfixup-mlp", 200, 32, 64, 2, 2, seed=1)
    stepped = {n for n, p in model.named_parameters() if p.requires_grad}
    assert stepped and all(".mlp." in n for n in stepped)
    assert len(stepped) == 3 * 2  # gate, up, down of 2 layers
    attention = {n for n, p in su.build_hf("bert", "tfixup-attention", 200, 32, 64, 2, 1, seed=1).named_parameters()
                 if p.requires_grad}
    assert attention and all(".attention." in n for n in attention)
