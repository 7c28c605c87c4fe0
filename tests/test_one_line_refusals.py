"""What the plugin refuses in a fairseq command ends it with one line naming the flag and the fix, not a
traceback: a flag T-Fixup cannot take, --fp16 and --bf16 where they cannot run (fairseq failed later, with
"Torch not compiled with CUDA enabled" and "'NoneType' object has no attribute 'xla_device'")."""

import os
import random
import subprocess

import pytest
import torch

from conftest import USER_DIR, last_error


@pytest.fixture(scope="module")
def made_up_bin(tmp_path_factory):
    """A tiny translation data-bin of made-up words (fairseq-preprocess)."""
    root = tmp_path_factory.mktemp("made_up")
    rng = random.Random(0)
    for split, n in (("train", 100), ("valid", 10)):
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_text(
                "".join(" ".join(rng.choice("abcdefgh") for _ in range(5)) + "\n" for _ in range(n)))
    subprocess.run(["fairseq-preprocess", "-s", "de", "-t", "en", "--trainpref", str(root / "train"),
                    "--validpref", str(root / "valid"), "--destdir", str(root / "bin"), "--workers", "1"],
                   check=True, capture_output=True)
    return root / "bin"


def train(data, *flags):
    dims = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
            "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2"]
    return subprocess.run(["fairseq-train", str(data), "--user-dir", str(USER_DIR), "--arch", "transformer_tfixup",
                           *dims, "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt_nowarmup",
                           "--max-tokens", "500", "--max-update", "1", "--no-save", *flags],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("flags, words", [
    (["--encoder-normalize-before"], "transformer_tfixup has no LayerNorm: --encoder-normalize-before cannot be used"),
    (["--fp16", "--cpu"], "--fp16 needs a CUDA GPU (fairseq's FP16 optimizer keeps its fp32 copy there) and --cpu "
                          "is given: drop --fp16"),
])
def test_fairseq_train_refuses_in_one_line(made_up_bin, flags, words):
    proc = train(made_up_bin, *flags)
    last_error(proc, words)
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

    from fairseq_tfixup import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(dict_dir), "--user-dir", str(USER_DIR), "--arch", "transformer_tfixup", "-s", "de", "-t", "en", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    with pytest.raises(precision.errors.Refused) as e:
        trainer.Trainer(cfg, None, None, None)  # refused before anything is built
    assert words in str(e.value)
    cfg.common.fp16 = cfg.common.bf16 = cfg.common.memory_efficient_bf16 = cfg.common.memory_efficient_fp16 = False
    precision.check(cfg)
