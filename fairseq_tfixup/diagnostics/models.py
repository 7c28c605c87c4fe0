"""Build a fairseq translation model, task and criterion the way fairseq-train does.

Everything goes through fairseq's own parser (``options.get_training_parser`` +
``parse_args_and_arch``), so any flag fairseq-train accepts works here, and the
model is exactly the one fairseq-train would train. ``--model`` presets name the
three variants the papers compare:

* ``postln``: stock ``--arch transformer`` (LayerNorm after each residual add);
* ``preln``:  the same with ``--encoder-normalize-before --decoder-normalize-before``;
* ``tfixup``: ``--arch transformer_tfixup`` from this plugin (no LayerNorm, T-Fixup init).
"""

import pathlib
from dataclasses import dataclass, field
from typing import List, Sequence

import torch

USER_DIR = pathlib.Path(__file__).resolve().parents[1]

MODEL_FLAGS = {
    "postln": ["--arch", "transformer"],
    "preln": ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before"],
    "tfixup": ["--arch", "transformer_tfixup"],
}

# The learning-rate schedules of the papers' "with / without warmup" comparison, as fairseq flags.
SCHEDULE_FLAGS = {
    "warmup": lambda w: ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(w), "--warmup-init-lr", "1e-7"],
    "nowarmup": lambda w: ["--lr-scheduler", "inverse_sqrt_nowarmup", "--decay-period", str(w)],
}


@dataclass
class ModelSpec:
    """The size of the model and anything else, as fairseq flags."""

    model: str = "postln"
    dim: int = 128
    ffn_dim: int = 256
    heads: int = 4
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.0
    extra: List[str] = field(default_factory=list)  # free-form fairseq flags, applied last (they win)

    def flags(self) -> List[str]:
        if self.model not in MODEL_FLAGS:
            raise ValueError(f"unknown --model {self.model!r}; choose from {', '.join(MODEL_FLAGS)}")
        d, f, h = str(self.dim), str(self.ffn_dim), str(self.heads)
        return MODEL_FLAGS[self.model] + [
            "--encoder-embed-dim", d, "--decoder-embed-dim", d,
            "--encoder-ffn-embed-dim", f, "--decoder-ffn-embed-dim", f,
            "--encoder-attention-heads", h, "--decoder-attention-heads", h,
            "--encoder-layers", str(self.encoder_layers), "--decoder-layers", str(self.decoder_layers),
            "--dropout", str(self.dropout), "--attention-dropout", "0", "--activation-dropout", "0",
        ] + list(self.extra)


def parse_fairseq_args(data_bin: str, flags: Sequence[str]):
    """fairseq-train's argument namespace for ``fairseq-train DATA_BIN FLAGS --user-dir <plugin>``."""
    from fairseq import options

    data_bin = pathlib.Path(data_bin)
    if not any(data_bin.glob("dict.*.txt")):
        raise FileNotFoundError(f"not a fairseq data-bin (no dict.*.txt): {data_bin}")
    argv = [str(data_bin), "--task", "translation", "--user-dir", str(USER_DIR), "--cpu",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
            "--criterion", "cross_entropy", "--max-tokens", "2048"] + list(flags)
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=argv)


def build(data_bin: str, spec: ModelSpec, seed: int = 1, device: str = "cpu", extra_flags: Sequence[str] = ()):
    """(args, task, model, criterion), the model seeded with ``seed`` and moved to ``device``."""
    from fairseq import tasks

    args = parse_fairseq_args(data_bin, spec.flags() + ["--seed", str(seed)] + list(extra_flags))
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    return args, task, model, criterion


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
