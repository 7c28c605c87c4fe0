"""examples/hf_trainer.py at a tiny size on the first lines of the real Multi30k: transformers' Trainer trains a
T-Fixup GPT-2 and a Llama with keep_mlp_norm on T-Fixup's schedule (transformers' inverse_sqrt, timescale P, no
warmup), a run resumed from its middle checkpoint logs the uninterrupted run's losses bit for bit, the best
checkpoint is the model at the end, and pipeline() on the saved folder continues a prompt with the in-memory model's
tokens; Seq2SeqTrainer trains Marian, and the folder's translations (and BLEU) are the in-memory model's."""

import pytest
import torch

from test_hf_examples import example

from hf_available import require_transformers  # noqa: E402

transformers = require_transformers()
pytest.importorskip("accelerate", reason="accelerate (Trainer's dependency, requirements-hf.txt) is not installed")

from tfixup.schedules import nowarmup_lr  # noqa: E402

TINY = ["--train-lines", "120", "--valid-lines", "16", "--steps", "4", "--eval-every", "2", "--layers", "2",
        "--dim", "32", "--batch", "4"]
P, LR = 4000, 1e-3


@pytest.fixture(autouse=True)
def shared(shared_data, monkeypatch):
    monkeypatch.setenv("TFIXUP_SHARED_DATA", str(shared_data))
    monkeypatch.setattr(example("multi30k"), "DATA", shared_data / "multi30k")


def test_transformers_inverse_sqrt_without_warmup_is_tfixups_schedule():
    """get_scheduler("inverse_sqrt", num_warmup_steps=0, timescale=P), what TrainingArguments(lr_scheduler_type=
    "inverse_sqrt", lr_scheduler_kwargs={"timescale": P}, warmup_steps=0) builds: lr * sqrt(P / (P + t))."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    schedule = transformers.get_scheduler("inverse_sqrt", opt, num_warmup_steps=0,
                                          scheduler_specific_kwargs={"timescale": P})
    assert schedule.get_last_lr()[0] == pytest.approx(LR, rel=1e-12)
    for t in range(0, 100001, 7):  # the factor the schedule multiplies lr by after t updates
        assert LR * schedule.lr_lambdas[0](t) == pytest.approx(nowarmup_lr(LR, P, t), rel=1e-12), t


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_trainer_resumes_exactly_ends_on_the_best_checkpoint_and_serves_from_the_folder(model, tmp_path, capsys):
    from safetensors.torch import load_file

    flags = ["--model", model] + (["--keep-mlp-norm"] if model == "llama" else [])
    whole = example("hf_trainer").main([*TINY, *flags, "--out", str(tmp_path / "whole")])
    out = capsys.readouterr().out
    assert "same tokens: True" in out and whole["same"]
    # T-Fixup's curve: update k at lr * sqrt(P / (P + k - 1)), as Trainer logs it
    assert all(lr == pytest.approx(nowarmup_lr(LR, P, k - 1), rel=1e-9) for k, lr in whole["lr"].items())
    assert sorted(whole["losses"]) == [1, 2, 3, 4]

    resumed = example("hf_trainer").main([*TINY, *flags, "--out", str(tmp_path / "resumed"),
                                          "--resume-from-checkpoint", str(tmp_path / "whole" / "checkpoint-2")])
    assert sorted(resumed["losses"]) == [3, 4]
    assert all(resumed["losses"][k] == whole["losses"][k] for k in (3, 4)), (resumed["losses"], whole["losses"])

    trainer = whole["trainer"]
    evals = {h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h and h["step"] <= 4}
    best_step = min(evals, key=evals.get)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    best = load_file(str(tmp_path / "whole" / f"checkpoint-{best_step}" / "model.safetensors"))
    state = whole["model"].state_dict()
    assert all(torch.equal(state[k], best[k]) for k in best) and whole["best"] == evals[best_step]


def test_seq2seq_trainer_marian_translates_the_same_from_its_folder(tmp_path, capsys):
    result = example("hf_trainer").main([*TINY, "--model", "marian", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "TFixupMarianMTModel" in out and "translations equal: True" in out and result["same"]
    assert result["bleu"]["in memory"] == result["bleu"]["loaded"]


def test_resuming_from_what_is_not_a_checkpoint_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as done:
        example("hf_trainer").main([*TINY, "--out", str(tmp_path / "out"), "--resume-from-checkpoint",
                                    str(tmp_path / "checkpoint-9")])
    assert str(done.value.code) == (f"error: --resume-from-checkpoint {tmp_path / 'checkpoint-9'}: not a Trainer "
                                    f"checkpoint (no trainer_state.json): pass one of {tmp_path / 'out'}/checkpoint-N")
    assert not (tmp_path / "out").exists()
