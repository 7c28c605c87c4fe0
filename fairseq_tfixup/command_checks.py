"""Settings of a fairseq command that fairseq rejects late, or with a message naming neither the flag nor
the fix, refused in one line (``errors.Refused``) before fairseq acts on them:

* ``--fp16`` and ``--bf16`` where they cannot run, when the trainer is built (fairseq failed later:
  ``--fp16`` without CUDA with "Torch not compiled with CUDA enabled" from its FP16 optimizer; ``--bf16``,
  which in fairseq 0.12 implies ``--tpu``, with "'NoneType' object has no attribute 'xla_device'");
* a language-model split the data-bin does not have (``fairseq-eval-lm`` reads ``test`` by default; the
  LM study's data-bin has train and valid): the splits it has and the flag to choose one."""

import argparse
import glob
import importlib.util
import os

import torch

from tfixup import errors


def check(cfg) -> None:
    """``errors.Refused`` naming the flag when CFG (fairseq's config) asks for a precision this machine lacks."""
    common = cfg.common
    if common.bf16 or common.memory_efficient_bf16:
        if importlib.util.find_spec("torch_xla") is None:
            raise errors.Refused("--bf16 needs a TPU: in fairseq 0.12 it implies --tpu (torch_xla, not installed "
                                 "here); on a GPU use --fp16 or --amp, on a CPU drop --bf16")
    elif (common.fp16 or common.memory_efficient_fp16) and (common.cpu or not torch.cuda.is_available()):
        where = "--cpu is given" if common.cpu else "this machine has none"
        raise errors.Refused(f"--fp16 needs a CUDA GPU (fairseq's FP16 optimizer keeps its fp32 copy there) and "
                             f"{where}: drop --fp16")


def splits_of(data_path) -> list:
    """The splits a fairseq data-bin holds (its NAME.idx files; a translation pair's NAME.SRC-TGT.SRC.idx)."""
    return sorted({os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(data_path, "*.idx"))})


def install() -> None:
    """``check`` at the start of fairseq's ``Trainer`` (fairseq-train, and anything else that trains); the
    language-modeling task's missing split named with the splits there are. Idempotent."""
    from fairseq import trainer
    from fairseq.tasks.language_modeling import LanguageModelingTask

    build = trainer.Trainer.__init__
    if not getattr(build, "tfixup_checked", False):
        def __init__(self, cfg, *args, **kwargs):
            check(cfg)
            build(self, cfg, *args, **kwargs)

        __init__.tfixup_checked = True
        __init__.__wrapped__ = build
        trainer.Trainer.__init__ = __init__

    load = LanguageModelingTask.load_dataset
    if not getattr(load, "tfixup_checked", False):
        def load_dataset(self, split, epoch=1, combine=False, **kwargs):
            try:
                return load(self, split, epoch=epoch, combine=combine, **kwargs)
            except FileNotFoundError as e:
                if not str(e).startswith("Dataset not found"):
                    raise
                data = self.args.data.split(os.pathsep)[(epoch - 1) % len(self.args.data.split(os.pathsep))]
                have = splits_of(data)
                pick = next((s for s in ("valid", "test", *have) if s in have), None)
                choose = f"--gen-subset {pick}" if pick else "another data-bin"
                raise errors.Refused(f"{data} holds no '{split}' split (it has: {', '.join(have) or 'none'}): "
                                     f"choose one it has, e.g. {choose} for fairseq-eval-lm") from None

        load_dataset.tfixup_checked = True
        load_dataset.__wrapped__ = load
        LanguageModelingTask.load_dataset = load_dataset


# ---------------------------------------------------------------- a config's EXTRA_TRAIN_ARGS

# dests train.sh sets from its own options (devices, processes), kept out of EXTRA_TRAIN_ARGS whatever kind
OWNED_DESTS = ("cpu", "tpu", "fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "amp",
               "distributed_world_size", "distributed_rank", "distributed_port", "distributed_no_spawn",
               "distributed_num_procs", "device_id", "nprocs_per_node", "azureml_logging", "use_plasma_view")


def training_parser(base_args):
    """fairseq-train's own parser for the command BASE_ARGS (after the program name), with every
    argument of its task, arch, criterion, optimizer and scheduler added, as fairseq builds it."""
    from fairseq import options

    # this plugin is imported already (this module is part of it): its --user-dir is left out, which fairseq
    # would import again and log that it has
    words = list(base_args)
    for i, word in enumerate(words):
        if word == "--user-dir" and i + 1 < len(words):
            del words[i:i + 2]
            break
    built = []
    options.parse_args_and_arch(options.get_training_parser(), words, modify_parser=built.append)
    return built[-1]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting (an error, -h)."""

    def error(self, message):
        raise errors.Refused(message)

    def print_help(self, file=None):
        pass

    def exit(self, status=0, message=None):
        raise errors.Refused("-h/--help is no setting")


def given_dests(parser, words) -> tuple:
    """(dest -> value of each option WORDS give, words left over) by PARSER's own parse: every spelling of
    a flag (--source-lang, -s en, -sen, --source-lang=en) is its one dest. A placeholder fills the data
    positional."""
    quiet = _Parser(add_help=False, allow_abbrev=parser.allow_abbrev, parents=[parser])
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    quiet._defaults.clear()  # a parent's set_defaults: only what WORDS give is wanted
    placeholder = "\0data"
    ns, left = quiet.parse_known_args([placeholder, *words])
    given = {k: v for k, v in vars(ns).items() if v != placeholder}
    return given, left


def check_extra_train_args(base_args, extra, owned_flags=None, key_of=None) -> None:
    """``errors.Refused`` naming the flag unless every flag of EXTRA (a config's EXTRA_TRAIN_ARGS) sets a
    setting of the allow-list (tfixup/allowlist.py: a number, boolean, enum or vetted string of a component
    this project uses) to a value of its kind, that neither train.sh (OWNED_DESTS; OWNED_FLAGS: flag -> why)
    nor BASE_ARGS (the command the config makes; KEY_OF: flag -> its config key) sets."""
    from tfixup import allowlist

    components, fields = allowlist.table()
    parser = training_parser(base_args)
    flags = {}  # dest -> its long flag, for messages
    for action in parser._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if long:
            flags.setdefault(action.dest, long[0])
    base, _ = given_dests(parser, base_args[1:] if base_args and not base_args[0].startswith("-") else base_args)
    try:
        given, left = given_dests(parser, extra)
    except errors.Refused as e:
        raise errors.Refused(f"{e} (fairseq-train's parser)") from None
    if left:
        raise errors.Refused(f"{left[0]!r} is not a fairseq-train option of this command: remove it from "
                             "EXTRA_TRAIN_ARGS")
    owned_flags = owned_flags or {}
    for dest, value in given.items():
        flag = flags.get(dest, "--" + dest.replace("_", "-"))
        if flag in owned_flags:
            raise errors.Refused(f"{flag} {owned_flags[flag]}: remove it from EXTRA_TRAIN_ARGS")
        if dest in OWNED_DESTS:
            raise errors.Refused(f"{flag} is set by train.sh from its --cpu/--nproc/--nnodes options and the FP16 "
                                 "key: remove it from EXTRA_TRAIN_ARGS")
        if dest in base:
            key = (key_of or {}).get(flag)
            how = f"set {key} instead (--set {key.split()[0]}=...)" if key else "it cannot be changed here"
            spelled = _spelling(extra, parser, dest)
            shown = flag if spelled.split("=")[0] == flag else f"{flag} (given as {spelled})"
            raise errors.Refused(f"{shown} is already in the command the config makes: {how}")
        kind = fields.get(dest, ("drop", None))[0]
        if kind in ("drop", "component"):
            raise errors.Refused(f"{flag} is not among the settings a config may add (numbers, switches and "
                                 "choices of this project's components; tfixup/allowlist.py): remove it from "
                                 "EXTRA_TRAIN_ARGS, or set it on train.sh's own command line after --")
        if isinstance(value, str) and kind not in ("literal",) and not isinstance(kind, list) \
                and not allowlist.fits(kind, value):
            raise errors.Refused(f"{flag}={value!r} must be {allowlist.describe(kind)}")


def _spelling(words, parser, dest) -> str:
    """How WORDS spell DEST's flag (-sen, -s, --source-lang=...), for the message."""
    for i, word in enumerate(words):
        if word.startswith("-"):
            try:
                got, _ = given_dests(parser, words[i:i + 2])
            except errors.Refused:
                continue
            if dest in got:
                return word
    return "--" + dest.replace("_", "-")
