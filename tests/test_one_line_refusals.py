"""What the plugin refuses in a fairseq command ends it with one line naming the flag and the fix, not a
traceback: a flag T-Fixup cannot take, --fp16 and --bf16 where they cannot run (fairseq failed later, with
"Torch not compiled with CUDA enabled" and "'NoneType' object has no attribute 'xla_device'")."""

import os
import random
import subprocess

import pytest
import torch

from conftest import USER_DIR, fairseq_command, last_error


@pytest.fixture(scope="module")
def made_up_bin(tmp_path_factory):
    """A tiny translation data-bin of made-up words (fairseq-preprocess)."""
    root = tmp_path_factory.mktemp("made_up")
    rng = random.Random(0)
    for split, n in (("train", 100), ("valid", 10)):
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_text(
                "".join(" ".join(rng.choice("abcdefgh") for _ in range(5)) + "\n" for _ in range(n)))
    fairseq_command("preprocess", "-s", "de", "-t", "en", "--trainpref", root / "train", "--validpref",
                    root / "valid", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def train(data, *flags):
    dims = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
            "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2"]
    return subprocess.run(["fairseq-train", str(data), "--user-dir", str(USER_DIR), "--arch", "transformer_tfixup",
                           *dims, "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt_nowarmup",
                           "--max-tokens", "500", "--max-update", "1", "--no-save", *flags],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_fairseq_train_refuses_in_one_line(made_up_bin):
    """The console script itself: its last line is the refusal alone, without a traceback (the other
    refusals are checked in process, where the plugin raises them: the tests below and the like)."""
    proc = train(made_up_bin, "--encoder-normalize-before")
    last_error(proc, "transformer_tfixup has no LayerNorm: --encoder-normalize-before cannot be used")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("flags, words", [
    (["--bf16"], "--bf16 needs a TPU: in fairseq 0.12 it implies --tpu (torch_xla, not installed here)"),
    (["--memory-efficient-bf16"], "--bf16 needs a TPU"),
    (["--fp16"], "--fp16 needs a CUDA GPU (fairseq's FP16 optimizer keeps its fp32 copy there) and this machine has "
                 "none: drop --fp16"),
    (["--fp16", "--cpu"], "and --cpu is given: drop --fp16"),
])
def test_precision_flags_are_checked_when_the_trainer_is_built(dict_dir, flags, words, monkeypatch):
    from fairseq import options, trainer
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_tfixup import command_checks

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(dict_dir), "--user-dir", str(USER_DIR), "--arch", "transformer_tfixup", "-s", "de", "-t", "en", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    with pytest.raises(command_checks.errors.Refused) as e:
        trainer.Trainer(cfg, None, None, None)  # refused before anything is built
    assert words in str(e.value)
    cfg.common.fp16 = cfg.common.bf16 = cfg.common.memory_efficient_bf16 = cfg.common.memory_efficient_fp16 = False
    command_checks.check(cfg)


def test_a_language_model_split_the_data_bin_lacks_names_the_ones_it_has(tmp_path):
    """fairseq-eval-lm reads 'test' by default; the LM study's data-bin has train and valid only: fairseq
    said `FileNotFoundError: Dataset not found: test`."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_tfixup import command_checks

    for split in ("train", "valid"):
        (tmp_path / f"{split}.txt").write_text("a b c d\nb c d e\n" * 5)
    fairseq_command("preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--validpref",
                    tmp_path / "valid.txt", "--destdir", tmp_path / "bin", "--workers", "1")
    args = options.parse_args_and_arch(options.get_eval_lm_parser(), [
        str(tmp_path / "bin"), "--user-dir", str(USER_DIR), "--task", "language_modeling", "--path", "x.pt"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    with pytest.raises(command_checks.errors.Refused) as e:
        task.load_dataset(args.gen_subset)
    assert str(e.value) == (f"{tmp_path / 'bin'} holds no 'test' split (it has: train, valid): choose one it has, "
                            "e.g. --gen-subset valid for fairseq-eval-lm")
    task.load_dataset("valid")
    assert len(task.dataset("valid")) > 0
