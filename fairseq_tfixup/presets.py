"""The models the papers compare, as fairseq flags, and one way to build them.

``METHODS`` maps a method name to its fairseq ``--arch`` and flags; everything
that names a method (``scripts/train.sh`` configs, ``bench/``,
``tfixup-diagnose --model``, the tests) reads this table, so adding a method is
one row. Models are built through fairseq's own parser
(``options.get_training_parser`` + ``parse_args_and_arch``), so every
fairseq-train flag works and the model is the one fairseq-train would train.
"""

import pathlib
from typing import List, NamedTuple, Sequence

USER_DIR = pathlib.Path(__file__).resolve().parent


class Method(NamedTuple):
    arch: str  # fairseq --arch; sizes come from dims_flags
    flags: tuple  # further fairseq flags that make the method
    label: str  # for tables and plots
    warmup: bool  # trained with warmup in the papers' comparison (the baselines) or without (T-Fixup)
    optimizer: str = "adam"  # fairseq --optimizer (RAdam's row differs only here)


PRE_LN = ("--encoder-normalize-before", "--decoder-normalize-before")

# The methods of the T-Fixup paper's Tables 1-3 (and two later ones, DeepNorm and Admin), each with
# the warmup its own paper trains with. The baselines are fairseq_tfixup/baselines/ (docs/baselines.md).
METHODS = {
    "tfixup": Method("transformer_tfixup", (), "T-Fixup", warmup=False),
    "postln": Method("transformer", (), "Post-LN", warmup=True),
    "preln": Method("transformer", PRE_LN, "Pre-LN", warmup=True),
    "radam": Method("transformer", (), "RAdam (Post-LN)", warmup=False, optimizer="radam"),
    "dsinit": Method("transformer_dsinit", (), "DS-Init", warmup=True),
    "rfixup": Method("transformer_rfixup", (), "R-Fixup", warmup=True),
    "dlcl": Method("transformer_dlcl", (), "DLCL", warmup=True),
    "dlcl_preln": Method("transformer_dlcl", PRE_LN, "DLCL-Pre-LN", warmup=True),
    "deepnorm": Method("transformer_deepnorm", (), "DeepNorm", warmup=True),
    "admin": Method("transformer_admin", (), "Admin", warmup=True),
    "lri": Method("transformer_lri", (), "LRI", warmup=True),
}


def method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)} (fairseq_tfixup/presets.py)")
    return METHODS[name]


def dims_flags(embed: int, ffn: int, heads: int, encoder_layers: int, decoder_layers: int) -> List[str]:
    """Encoder and decoder sizes as fairseq flags."""
    return [
        "--encoder-embed-dim", str(embed), "--decoder-embed-dim", str(embed),
        "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
        "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
        "--encoder-layers", str(encoder_layers), "--decoder-layers", str(decoder_layers),
    ]


def model_flags(name: str, arch: str = "") -> List[str]:
    """``--arch`` (the method's, or ``arch``) and the method's flags."""
    m = method(name)
    return ["--arch", arch or m.arch, *m.flags]


def schedule_flags(kind: str, period: int, warmup_init_lr: str = "1e-7", decay_period: int = 4000) -> List[str]:
    """``warmup``: fairseq's inverse_sqrt, linear warmup over ``period`` updates from
    ``warmup_init_lr``, then lr * sqrt(period / t). ``nowarmup``: this plugin's
    inverse_sqrt_nowarmup, lr * sqrt(P / (P + t)) from update 0, P = ``period``.
    ``matched``: this plugin's inverse_sqrt_matched, linear warmup over ``period`` updates onto
    the no-warmup curve with P = ``decay_period``, then that curve.
    ``warmup_init_lr`` is flag text: str(1e-7) would spell it "1e-07", a different command to
    the benchmarks' run store (bench/runs.py keys a run by its command)."""
    if kind == "warmup":
        return ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(period),
                "--warmup-init-lr", str(warmup_init_lr)]
    if kind == "nowarmup":
        return ["--lr-scheduler", "inverse_sqrt_nowarmup", "--decay-period", str(period)]
    if kind == "matched":
        return ["--lr-scheduler", "inverse_sqrt_matched", "--warmup-updates", str(period),
                "--warmup-init-lr", str(warmup_init_lr), "--decay-period", str(decay_period)]
    raise ValueError(f"unknown schedule {kind!r}; choose warmup, matched or nowarmup")


SCHEDULES = ("warmup", "matched", "nowarmup")


def parse_train_args(data_bin, flags: Sequence[str]):
    """fairseq-train's argument namespace for ``fairseq-train DATA_BIN --user-dir <this plugin> FLAGS``."""
    from fairseq import options

    data_bin = pathlib.Path(data_bin)
    if not any(data_bin.glob("dict.*.txt")):
        raise FileNotFoundError(f"not a fairseq data-bin (no dict.*.txt): {data_bin}")
    argv = [str(data_bin), "--task", "translation", "--user-dir", str(USER_DIR), *map(str, flags)]
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def build(data_bin, flags: Sequence[str], seed: int = 1, device: str = "cpu"):
    """(args, task, model, criterion) as fairseq-train builds them, the model seeded
    with ``seed`` and moved to ``device``."""
    import torch
    from fairseq import tasks

    args = parse_train_args(data_bin, [*flags, "--seed", str(seed)])
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    return args, task, model, criterion
