"""tfixup-diagnose update-size --family torch (tfixup/update_size_stacks.py on the core tfixup/update_size.py),
the numeric check of docs/derivation.md, at a tiny size on real text: the update it measures is first order in
eta and leaves the model as it was; with the biases held fixed, T-Fixup's update does not grow with depth while
Xavier without LayerNorm's does; the command writes its tables, under the name its records carry too."""

import json

import pytest
import torch

from tfixup import update_size_stacks as su


@pytest.fixture(scope="module")
def tokens(shared_data):
    return su.token_batch(shared_data / "multi30k" / "train.en.gz", vocab=200, batch=4, length=16)


def test_the_batch_is_real_text(tokens):
    assert tokens.shape == (4, 17) and tokens.max() < 200
    assert (tokens == 1).any() and len(tokens.unique()) > 30  # sentence ends, many distinct words


def test_update_is_first_order_in_eta_and_the_model_is_restored(tokens):
    model = su.build_torch("tfixup", 200, 32, 64, 2, 3, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small, half = su.sgd_step(model, tokens, 1e-5), su.sgd_step(model, tokens, 5e-6)
    for key in ("logits", "hidden"):
        assert small[key] == pytest.approx(half[key], rel=1e-3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_without_bias_steps_tfixup_is_flat_in_depth_and_xavier_is_not(tokens):
    def size(method, n):
        return su.sgd_step(su.build_torch(method, 200, 32, 64, 2, n, seed=1, untied=True), tokens, 1e-4,
                           biases=False)["hidden"]

    assert 0.7 < size("tfixup", 8) / size("tfixup", 1) < 1.4
    assert size("xavier", 8) / size("xavier", 1) > 100


def test_encoder_decoder_with_the_papers_constants_is_flat_too(tokens):
    def size(n):
        return su.sgd_step(su.build_torch("tfixup", 200, 32, 64, 2, n, seed=1, untied=True, encdec=True), tokens,
                           1e-4, biases=False)["hidden"]

    assert 0.7 < size(4) / size(1) < 1.4


def test_command_writes_tables(shared_data, tmp_path):
    args = ["--out", str(tmp_path), "--methods", "tfixup,postln", "--depths", "1,2", "--inits", "1", "--dim", "32",
            "--ffn", "64", "--heads", "2", "--vocab", "200", "--batch", "4", "--length", "16",
            "--text", str(shared_data / "multi30k" / "train.en.gz")]
    from harness import stack_update_size  # the name the records' commands carry

    meta = stack_update_size.main(args)
    saved = json.loads((tmp_path / "stack_update_size.json").read_text())
    assert saved["command"] == "python -m harness.stack_update_size " + " ".join(args)
    assert saved["methods"].keys() == {"tfixup", "postln"} and saved["depths"] == [1, 2]
    for m in saved["methods"].values():
        assert len(m["hidden"]) == 2 and all(v > 0 for v in m["hidden"] + m["logits_nobias"])
    assert meta["methods"]["tfixup"]["hidden_loglog_slope"] == pytest.approx(saved["methods"]["tfixup"]["hidden_loglog_slope"])
    assert "| tfixup | hidden, biases not stepped |" in (tmp_path / "stack_update_size.md").read_text()


def test_the_diagnose_command_runs_the_torch_family_and_refuses_mixed_flags(shared_data, tmp_path, capsys):
    from fairseq_tfixup.diagnostics import cli

    args = ["update-size", "--family", "torch", "--out", str(tmp_path), "--methods", "tfixup", "--depths", "1,2",
            "--inits", "1", "--dim", "16", "--ffn", "32", "--heads", "2", "--vocab", "100", "--batch", "2",
            "--length", "8", "--encdec", "--text", str(shared_data / "multi30k" / "train.en.gz")]
    assert cli.main(args) == 0
    saved = json.loads((tmp_path / "stack_update_size_encdec.json").read_text())
    assert saved["command"] == "tfixup-diagnose " + " ".join(args) and saved["encdec"]
    with pytest.raises(SystemExit):
        cli.main([*args, "--encoder-only"])
    assert "--encdec and --encoder-only: choose one" in capsys.readouterr().err
