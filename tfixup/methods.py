"""The methods the papers compare, as fairseq flags: the method table and the one builder of this
project's fairseq-train arguments.

``METHODS`` maps a method name to its row: fairseq ``--arch`` and flags, optimizer, warmup, label, the
T-Fixup paper's row label, color, the studies that run it, its language model and whether it is
LayerNorm-free. Everything that names a method (configs'
``METHOD``, the benchmarks, ``tfixup-diagnose --model``, the tests) reads this table, so adding a method
is its module plus one row. Plain Python, no fairseq import: the harness reads it on every dry run.
"""

import pathlib
from dataclasses import dataclass
from typing import List, Tuple

# the fairseq plugin, installed beside this package (or beside it in the checkout)
USER_DIR = pathlib.Path(__file__).resolve().parent.parent / "fairseq_tfixup"


STUDIES = ("convergence", "quality", "depth")  # the studies of harness/bench/ that run every method of a table
# the learning-rate study (harness/bench/lr.py) runs the rows that name it: "lr" its translation part, "lr_lm" its
# 24-layer language model
LR = STUDIES + ("lr",)
LR_LM = LR + ("lr_lm",)


@dataclass(frozen=True)
class Method:
    """Everything that names a method: a study, figure, config check or test reads it from its row."""

    arch: str  # fairseq --arch; sizes come from dims_flags
    label: str  # for tables and plots
    color: str  # its color in every benchmark figure
    warmup: bool  # trained with warmup in its own paper (the baselines) or without (T-Fixup, RAdam)
    flags: Tuple[str, ...] = ()  # further fairseq flags that make the method
    optimizer: str = "adam"  # fairseq --optimizer
    paper_label: str = ""  # its row label in the T-Fixup paper's Tables 1-3 ("": not in them)
    studies: Tuple[str, ...] = STUDIES  # the studies that run it
    lm_arch: str = ""  # fairseq --arch of its decoder-only language model (task language_modeling); "": none
    lm_flags: Tuple[str, ...] = ()  # further fairseq flags that make its language model
    # no LayerNorm anywhere (removed, or replaced by another function): the depth study runs it at its
    # deepest depth, and the convergence study asks of it whether it needs warmup (harness/bench/)
    layernorm_free: bool = False


PRE_LN = ("--encoder-normalize-before", "--decoder-normalize-before")

# The methods of the T-Fixup paper's Tables 1-3 (and later ones: DeepNorm, Admin, the LayerNorm-free DyT,
# ReZero and Derf, GI-Adam's optimizer), each with the warmup its own paper trains with
# (fairseq_tfixup/baselines/, docs/baselines.md); Post-LN and Pre-LN with transformers' initialisation; then the arms
# of its Fig. 3c that are no method of its tables (plain SGD; T-Fixup's two steps each alone,
# fairseq_tfixup/baselines/ablations.py), which only the convergence study runs.
METHODS = {
    "tfixup": Method("transformer_tfixup", "T-Fixup", "C3", warmup=False, paper_label="T-Fixup",
                     lm_arch="transformer_lm_tfixup", layernorm_free=True, studies=LR_LM),
    # fairseq's --arch transformer_lm is Post-LN (its config's default); --decoder-normalize-before makes it Pre-LN
    "postln": Method("transformer", "Post-LN", "C0", warmup=True, paper_label="Baseline", lm_arch="transformer_lm",
                     studies=LR),
    "preln": Method("transformer", "Pre-LN", "C1", warmup=True, flags=PRE_LN, paper_label="Pre-LN",
                    lm_arch="transformer_lm", lm_flags=("--decoder-normalize-before",), studies=LR_LM),
    "radam": Method("transformer", "RAdam (Post-LN)", "C4", warmup=False, optimizer="radam",
                    paper_label="RAdam, no warmup"),
    "dsinit": Method("transformer_dsinit", "DS-Init", "C5", warmup=True, paper_label="DS-Init"),
    "rfixup": Method("transformer_rfixup", "R-Fixup", "C6", warmup=True, paper_label="R-Fixup"),
    "dlcl": Method("transformer_dlcl", "DLCL", "C7", warmup=True, paper_label="DLCL", studies=LR),
    "dlcl_preln": Method("transformer_dlcl", "DLCL-Pre-LN", "C8", warmup=True, flags=PRE_LN,
                         paper_label="DLCL-Pre-LN"),
    "deepnorm": Method("transformer_deepnorm", "DeepNorm", "C9", warmup=True, studies=LR),
    "admin": Method("transformer_admin", "Admin", "k", warmup=True, studies=LR),
    "lri": Method("transformer_lri", "LRI", "m", warmup=True, paper_label="LRI"),
    # Pre-LN with every LayerNorm replaced by DyT(x) = gamma * tanh(alpha * x) + beta (its arch sets Pre-LN)
    "dyt": Method("transformer_dyt", "DyT", "darkgoldenrod", warmup=True, lm_arch="transformer_lm_dyt",
                  layernorm_free=True, studies=LR_LM),
    # no LayerNorm, x + alpha * F(x) per sublayer with alpha = 0 at init; its paper trains without warmup
    "rezero": Method("transformer_rezero", "ReZero", "teal", warmup=False, lm_arch="transformer_lm_rezero",
                     layernorm_free=True, studies=LR),
    # T-Fixup with its attention's q/k/v biases zero at init and its positions scaled like its token
    # embedding (flags of transformer_tfixup; results/diagnostics/update_decomposition.md)
    # Post-LN and Pre-LN drawn as HuggingFace transformers draws the same model (weights and embeddings
    # N(0, 0.02), biases 0; fairseq_tfixup/baselines/small_init.py): the initialisation apart from the method
    "postln_si": Method("transformer_smallinit", "Post-LN, small init", "steelblue", warmup=True,
                        studies=("convergence", "quality", "lr")),
    "preln_si": Method("transformer_smallinit", "Pre-LN, small init", "sandybrown", warmup=True, flags=PRE_LN,
                       studies=("convergence", "quality", "lr")),
    # Pre-LN with every LayerNorm replaced by Derf(x) = gamma * erf(alpha * x + s) + beta (DyT's form with erf)
    "derf": Method("transformer_derf", "Derf", "olivedrab", warmup=True, lm_arch="transformer_lm_derf",
                   layernorm_free=True, studies=("convergence", "quality", "lr")),
    # stock Post-LN and Pre-LN with GI-Adam (Adam with v_0 = g_0^2, fairseq_tfixup/baselines/giadam.py), no warmup
    "postln_giadam": Method("transformer", "Post-LN + GI-Adam", "crimson", warmup=False, optimizer="giadam",
                            studies=("convergence", "quality", "lr")),
    "preln_giadam": Method("transformer", "Pre-LN + GI-Adam", "salmon", warmup=False, flags=PRE_LN,
                           optimizer="giadam", studies=("convergence", "quality", "lr")),
    "tfixup_zb": Method("transformer_tfixup", "T-Fixup, zero q/k/v bias + scaled positions", "darkred", warmup=False,
                        flags=("--tfixup-zero-attn-bias", "--tfixup-scale-positions"),
                        layernorm_free=True, studies=("convergence", "depth")),
    "sgd": Method("transformer", "Post-LN + SGD", "tab:olive", warmup=True, optimizer="sgd",
                  studies=("convergence",)),
    "noln": Method("transformer_noln", "no LN, default init", "tab:gray", warmup=True, studies=("convergence",),
                   layernorm_free=True),
    "tfixup_ln": Method("transformer_tfixup_ln", "T-Fixup init + Post-LN", "tab:brown", warmup=False,
                        studies=("convergence",)),
}
ABLATIONS = ("sgd", "noln", "tfixup_ln")  # Fig. 3c's arms: no configs, no paper table rows


def method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)} (tfixup/methods.py)")
    return METHODS[name]


def is_tfixup(name: str) -> bool:
    """T-Fixup or a variant of it (its arch with flags): the method under test, never a baseline."""
    return method(name).arch == METHODS["tfixup"].arch


def studied(study: str) -> List[str]:
    """The methods a study runs, in the table's order."""
    return [name for name, m in METHODS.items() if study in m.studies]


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


def lm_model_flags(name: str, arch: str = "") -> List[str]:
    """``--arch`` of the method's language model (or ``arch``) and its flags."""
    m = method(name)
    if not m.lm_arch:
        raise ValueError(f"method {name!r} has no language model; choose from "
                         f"{', '.join(n for n, r in METHODS.items() if r.lm_arch)} (tfixup/methods.py)")
    return ["--arch", arch or m.lm_arch, *m.lm_flags]


def lm_dims_flags(embed: int, ffn: int, heads: int, layers: int) -> List[str]:
    """A decoder-only stack's sizes as fairseq flags; its input and output dims are the embedding's
    (fairseq's transformer_lm config would otherwise project a 512-dim embedding in and out)."""
    return ["--decoder-embed-dim", str(embed), "--decoder-input-dim", str(embed), "--decoder-output-dim", str(embed),
            "--decoder-ffn-embed-dim", str(ffn), "--decoder-attention-heads", str(heads),
            "--decoder-layers", str(layers)]


def schedule_flags(kind: str, period: int, warmup_init_lr: str = "1e-7", decay_period: int = 4000) -> List[str]:
    """``warmup``: fairseq's inverse_sqrt, linear warmup over ``period`` updates from
    ``warmup_init_lr``, then lr * sqrt(period / t). ``nowarmup``: this plugin's
    inverse_sqrt_nowarmup, lr * sqrt(P / (P + t)) from update 0, P = ``period``.
    ``matched``: this plugin's inverse_sqrt_matched, linear warmup over ``period`` updates onto
    the no-warmup curve with P = ``decay_period``, then that curve.
    ``warmup_init_lr`` is flag text: str(1e-7) would spell it "1e-07", a different command to
    the benchmarks' run store (harness/bench/runs.py keys a run by its command)."""
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
SHARE_FLAGS = {"decoder": ("--share-decoder-input-output-embed",), "all": ("--share-all-embeddings",), "none": ()}
TASKS = ("translation", "language_modeling")


@dataclass(frozen=True)
class Recipe:
    """A fairseq-train recipe of this project: the method, its size and how it is trained. Data,
    device and bookkeeping (save dir, logging) are the caller's. Numbers may be given as flag text."""

    method: str
    embed: int
    ffn: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    lr: object
    schedule: str = "auto"  # auto (warmup for a method trained with warmup, else nowarmup), or SCHEDULES
    warmup: object = 4000  # W: warmup updates (warmup, matched)
    decay_period: object = 4000  # P of lr * sqrt(P / (P + t)) (nowarmup, matched)
    warmup_init_lr: str = "1e-7"  # flag text: str(1e-7) spells "1e-07"
    arch: str = ""  # another --arch for the method (e.g. a size preset)
    share: str = "decoder"  # SHARE_FLAGS
    optimizer: str = "auto"  # auto: the method's
    adam_betas: str = "(0.9, 0.98)"
    clip_norm: object = "0.0"
    dropout: object = 0.1
    attention_dropout: object = None  # None: fairseq's default (no flag)
    activation_dropout: object = None
    weight_decay: object = "0.0001"
    label_smoothing: object = "0.1"
    max_tokens: object = 4096
    max_update: object = 0  # 0: no flag
    max_epoch: object = 0
    seed: object = 1
    # language_modeling: a decoder-only LM of the method's lm_arch with decoder_layers layers (encoder_layers
    # unused), trained on blocks of tokens_per_sample tokens with plain cross-entropy (label_smoothing unused)
    task: str = "translation"
    tokens_per_sample: object = 512
    sample_break_mode: str = "none"

    def kind(self) -> str:
        return ("warmup" if method(self.method).warmup else "nowarmup") if self.schedule == "auto" else self.schedule

    def opt(self) -> str:
        return method(self.method).optimizer if self.optimizer == "auto" else self.optimizer


def train_args(recipe: Recipe, user_dir=USER_DIR, cpu: bool = False, log_format: str = "",
               num_workers=None) -> List[str]:
    """The one builder of this project's fairseq-train arguments (after the data folder): the
    benchmarks, scripts/train.sh's configs, the diagnostics and the tests all train through it."""
    r, opt = recipe, recipe.opt()
    kind = r.kind()
    period = r.decay_period if kind == "nowarmup" else r.warmup
    if r.task == "translation":
        model = [*model_flags(r.method, r.arch), *dims_flags(r.embed, r.ffn, r.heads, r.encoder_layers,
                                                             r.decoder_layers)]
        task = ["--task", "translation", *SHARE_FLAGS[r.share]]
        criterion = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(r.label_smoothing)]
    elif r.task == "language_modeling":
        if r.share == "all":
            raise ValueError("a language model has one embedding: share='all' is for translation; use 'decoder' "
                             "(tied input/output embedding) or 'none'")
        model = [*lm_model_flags(r.method, r.arch), *lm_dims_flags(r.embed, r.ffn, r.heads, r.decoder_layers)]
        task = ["--task", "language_modeling", "--tokens-per-sample", str(r.tokens_per_sample),
                "--sample-break-mode", r.sample_break_mode, *SHARE_FLAGS[r.share]]
        criterion = ["--criterion", "cross_entropy"]
    else:
        raise ValueError(f"unknown task {r.task!r}; choose {' or '.join(TASKS)}")
    args = [*model, *schedule_flags(kind, period, r.warmup_init_lr, r.decay_period),
            *(["--cpu"] if cpu else []), "--user-dir", str(user_dir), *task, "--optimizer", opt,
            # plain SGD (the paper's Fig. 3c arm): no momentum; adam and radam take Adam's betas
            *(["--momentum", "0.0"] if opt == "sgd" else ["--adam-betas", r.adam_betas]),
            "--clip-norm", str(r.clip_norm), "--lr", str(r.lr), *criterion, "--dropout", str(r.dropout)]
    for flag, value in (("--attention-dropout", r.attention_dropout), ("--activation-dropout", r.activation_dropout)):
        if value is not None:
            args += [flag, str(value)]
    args += ["--weight-decay", str(r.weight_decay), "--max-tokens", str(r.max_tokens)]
    for flag, value in (("--max-update", r.max_update), ("--max-epoch", r.max_epoch)):
        if str(value) != "0":
            args += [flag, str(value)]
    args += ["--seed", str(r.seed)]
    if log_format:
        args += ["--log-format", log_format]
    if num_workers is not None:
        args += ["--num-workers", str(num_workers)]
    return args
