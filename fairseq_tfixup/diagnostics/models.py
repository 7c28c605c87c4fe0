"""The diagnostics' model: a method of ``tfixup.methods`` at a size, built the way fairseq-train does
(fairseq's own parser, ``options.get_training_parser`` + ``parse_args_and_arch``, then the task's
``build_model``), so every fairseq-train flag works and the model is the one fairseq-train would train."""

import pathlib
from dataclasses import dataclass, field
from typing import List, Sequence

from tfixup import methods

@dataclass
class ModelSpec:
    """The method and size of the model and anything else, as fairseq flags."""

    model: str = "postln"  # a name of tfixup.methods.METHODS
    dim: int = 128
    ffn_dim: int = 256
    heads: int = 4
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.0
    extra: List[str] = field(default_factory=list)  # free-form fairseq flags, applied last (they win)

    def flags(self, schedule: str = "auto", period: int = 4000, cpu: bool = True) -> List[str]:
        """fairseq-train's flags through the project's one builder (tfixup.methods.train_args): the
        authors' Adam (0.9, 0.98), lr 5e-4, no label smoothing, weight decay or sharing; ``schedule``
        over ``period`` updates (warmup W, or decay period P, as the diagnostics' --warmup-updates)."""
        recipe = methods.Recipe(self.model, self.dim, self.ffn_dim, self.heads, self.encoder_layers,
                                self.decoder_layers, lr="5e-4", schedule=schedule, warmup=period,
                                decay_period=period, share="none", dropout=self.dropout, attention_dropout=0,
                                activation_dropout=0, weight_decay=0, label_smoothing=0, max_tokens=2048)
        return [*methods.train_args(recipe, cpu=cpu), *self.extra]


def parse_train_args(data_bin, flags: Sequence[str]):
    """fairseq-train's argument namespace for ``fairseq-train DATA_BIN --user-dir <this plugin> FLAGS``."""
    from fairseq import options

    data_bin = pathlib.Path(data_bin)
    if not any(data_bin.glob("dict.*.txt")):
        raise FileNotFoundError(f"not a fairseq data-bin (no dict.*.txt): {data_bin}")
    argv = [str(data_bin), "--task", "translation", "--user-dir", str(methods.USER_DIR), *map(str, flags)]
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def build_from_flags(data_bin, flags: Sequence[str], seed: int = 1, device: str = "cpu"):
    """(args, task, model, criterion) as fairseq-train builds them, the model seeded with ``seed`` and
    moved to ``device``."""
    import torch
    from fairseq import tasks

    args = parse_train_args(data_bin, [*flags, "--seed", str(seed)])
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    return args, task, model, criterion


def build(data_bin, spec: ModelSpec, seed: int = 1, device: str = "cpu", schedule: str = "auto",
          period: int = 4000):
    """(args, task, model, criterion), the model seeded with ``seed`` and moved to ``device``."""
    return build_from_flags(data_bin, spec.flags(schedule, period), seed=seed, device=device)
