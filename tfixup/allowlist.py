"""What a loaded checkpoint's config may hold, and what EXTRA_TRAIN_ARGS may set: an allow-list.

A checkpoint's config is data. Every component it names (task, model/arch, criterion, optimizer, lr
scheduler, bpe, tokenizer, scoring) must be one this project trains or evaluates with, and of its fields
only those whose values are plain numbers, booleans, short enums, or strings of a few vetted kinds
(a language code, a BPE separator, generation settings as JSON) are kept, each checked for its kind.
Every other field is set back to fairseq's default, so nothing a loaded checkpoint says names a file
but its data-bin folder (``data``, which fairseq's loader needs when the caller names none): paths
(save_dir, encoder_embed_path, bpe_codes, lang_dict, save_predictions, ...) need no list, being
strings of no vetted kind. Anything else (a component of another kind, a value of the wrong kind,
bytes, a URL in a kept string) is refused in one line naming the field and the fix (``Refused``).

The table (``allowlist_table.py``) is derived from fairseq and this project (``derive``): the components
are those ``tfixup.methods`` builds (its archs and baselines, every arch of their models, its tasks, the
criteria, optimizers and schedulers of its one fairseq-train argument builder) plus the text tools its
pipelines use; a field's kind comes from its fairseq dataclass type (int, float, bool, an enum, a list
of numbers) or, for a model configured by ``add_args``, from its argparse action. The harness checks
checkpoints without importing fairseq (~10 s), so the table is written to a module:
``python -m tfixup.allowlist write`` regenerates it, and tests/test_allowlist.py fails when it drifts.
"""

import argparse
import json
import math
import re
import sys
from typing import Dict

from tfixup import errors

# The text tools the pipelines use (scripts/prepare-*.sh, harness/translate.py, fairseq-train's
# --eval-bleu-detok moses), and the scorers fairseq-generate offers for translation; their fields that
# name files (bpe_codes, sentencepiece_model, ...) are strings of no vetted kind, so they are dropped.
TEXT_TOOLS = {"bpe": ("subword_nmt", "sentencepiece", "gpt2"), "tokenizer": ("moses", "space"),
              "scoring": ("bleu", "sacrebleu")}
# the groups of fairseq's config (FairseqConfig) that name a component of a registry
COMPONENT_GROUPS = ("model", "task", "criterion", "optimizer", "lr_scheduler", "scoring", "bpe", "tokenizer")
# flat (argparse) name of each component's field
COMPONENT_FIELDS = {"arch": "model", "task": "task", "criterion": "criterion", "optimizer": "optimizer",
                    "lr_scheduler": "lr_scheduler", "scoring": "scoring", "bpe": "bpe", "tokenizer": "tokenizer"}

# Strings kept, by field, each of a kind that names no file (its value is checked: fits)
VETTED = {
    "source_lang": "name", "target_lang": "name",  # translation's languages (and moses's)
    "bpe_separator": "symbol",  # subword_nmt's "@@"
    "eval_bleu_remove_bpe": "symbol", "post_process": "symbol",  # "@@ ", "sentencepiece"
    "eval_bleu_detok": "name",  # a tokenizer's name ("moses", "space")
    "eval_bleu_args": "json", "eval_bleu_detok_args": "json",  # generation settings, tokenizer options
    "best_checkpoint_metric": "name",
    # the data-bin folder: fairseq's loader sets its task up from it when the caller names none
    # (load_model_ensemble(paths)); the task reads its dict.LANG.txt there. Every loader of the project
    # (the hub, generate, validate, evaluate.sh, translate.sh) passes its own.
    "data": "folder",
}
# strings fairseq eval()s (literals.EVALUATED) of the kept components: literals of their shape
EVALUATED_KEPT = ("adam_betas", "adaptive_softmax_cutoff", "adaptive_input_cutoff")

MAX_LIST = 4096  # items of a list setting (fairseq's have a few)


class UntrustedConfig(errors.Refused):
    """A checkpoint's config naming a component, or holding a value, outside the allow-list."""


def table():
    """(COMPONENTS, FIELDS) of allowlist_table.py."""
    from tfixup import allowlist_table

    return allowlist_table.COMPONENTS, allowlist_table.FIELDS


# ---------------------------------------------------------------- checking a checkpoint's config

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
_SYMBOL = re.compile(r"[^/\\${}\x00-\x1f\x7f]{0,32}")
# a reference to another value of the same config (fairseq's own defaults: "${dataset.max_tokens}"); no
# resolver (${oc.env:...}), which would read the environment
_REFERENCE = re.compile(r"\$\{[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\}")
_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f]|\$\{")
_WHAT = {"int": "a number", "float": "a number", "bool": "True or False", "numbers": "numbers",
         "literal": "a literal of numbers", "name": "a plain name (letters, digits, _ . + -)",
         "symbol": "a short string without / \\ $ { }", "json": "a JSON object of plain values",
         "folder": "a folder's path (no URL, no ${...})", "group": "a group of settings"}


def describe(kind) -> str:
    """What a value of KIND is, for messages."""
    return "one of " + ", ".join(kind[1]) if isinstance(kind, list) else _WHAT.get(kind, kind)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(v) -> bool:
    return isinstance(v, (int, float))  # bool is an int: fairseq stores 0/1 flags either way


def _json_ok(text) -> bool:
    if not isinstance(text, str) or len(text) > 2000:
        return False
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and all(
        isinstance(k, str) and _NAME.fullmatch(k) and
        (v is None or _number(v) or isinstance(v, str) and _SYMBOL.fullmatch(v)) for k, v in obj.items())


def fits(kind, v) -> bool:
    """V is a value of KIND (None always is: fairseq's Optional fields, and unset ones)."""
    if v is None or isinstance(v, str) and _REFERENCE.fullmatch(v):
        return True
    if isinstance(kind, list):  # ["enum", choices]
        return isinstance(v, str) and v in kind[1]
    if kind in ("int", "float", "bool"):
        return _number(v)
    if kind == "numbers":
        return _number(v) or isinstance(v, (list, tuple)) and len(v) <= MAX_LIST and all(map(_number, v))
    if kind == "literal":  # a string is held to a literal of its shape before (literals.check_state)
        return isinstance(v, str) or isinstance(v, (list, tuple)) and len(v) <= MAX_LIST and all(
            _number(x) or isinstance(x, (list, tuple)) and len(x) <= 16 and all(map(_number, x)) for x in v)
    if kind == "name":
        return isinstance(v, str) and bool(_NAME.fullmatch(v))
    if kind == "symbol":
        return isinstance(v, str) and bool(_SYMBOL.fullmatch(v))
    if kind == "json":
        return _json_ok(v)
    if kind == "folder":
        return isinstance(v, str) and len(v) <= 4096 and "://" not in v and not _UNSAFE_PATH.search(v)
    return False


def _plain(v, depth=0) -> bool:
    """A value any fairseq config field may hold: None, a bool, number or string, or a short list of them."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and depth < 3 and len(v) <= MAX_LIST and all(_plain(x, depth + 1) for x in v)


def _group_name(group, obj) -> str:
    name = obj.get("_name")
    if group == "model" and name is None:
        name = obj.get("arch")
    return name


def _component(group: str, name, where: str, components) -> None:
    allowed = components[group]
    if name is not None and name not in allowed:
        kind = "model (--arch)" if group == "model" else group.replace("_", " ")
        shown = ", ".join(allowed) if len(allowed) <= 8 else "the archs of its methods' models"
        raise UntrustedConfig(f"{where}={_show(name)} is a {kind} this project does not train or evaluate with "
                              f"(it uses {shown}: tfixup/allowlist_table.py)")


def _fields(obj: dict, where: str, components, fields) -> None:
    """Check and filter one group's fields (a dict, or a Namespace's __dict__) in place; a nested group
    (the transformer's encoder and decoder) likewise (depth bounded before: literals.evaluated_fields)."""
    for key, value in list(obj.items()):
        name = f"{where}.{key}"
        if not isinstance(key, str):
            raise UntrustedConfig(f"{where} has a key {_show(key)} that is no name")
        kind, default = fields.get(key, (None, None))
        if kind == "group" and isinstance(value, dict):  # a nested group of settings (encoder, decoder)
            _fields(value, name, components, fields)
            continue
        if not _plain(value):
            raise UntrustedConfig(f"{name}={_show(value)} is a {type(value).__name__}, which no fairseq setting "
                                  "is (they are numbers, booleans, strings or lists of them)")
        if key == "_name":
            if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
                raise UntrustedConfig(f"{name}={_show(value)} is not a plain name")
            continue
        if kind is None:  # no field of fairseq's or the project's components: a number is kept, text dropped
            if not (value is None or _number(value) or
                    isinstance(value, (list, tuple)) and all(map(_number, value))):
                del obj[key]
        elif kind == "component":
            _component(COMPONENT_FIELDS[key], value, name, components)
        elif kind == "drop":
            obj[key] = default
        elif not fits(kind, value):
            raise UntrustedConfig(f"{name}={_show(value)} must be {describe(kind)}")


def check_config(state, components=None, fields=None) -> None:
    """Refuse (``UntrustedConfig``, naming the field) a checkpoint state whose ``args``/``cfg`` name a
    component outside COMPONENTS or hold a value not of its field's kind; set every other field to
    fairseq's default and drop text fairseq does not know, in place. Sizes and depth are bounded before
    (literals.evaluated_fields)."""
    if components is None:
        components, fields = table()
    args = state.get("args")
    if args is not None:
        if not isinstance(args, argparse.Namespace):
            raise UntrustedConfig(f"args is a {type(args).__name__}, not the argparse.Namespace fairseq saves")
        _fields(vars(args), "args", components, fields)
    cfg = state.get("cfg")
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        raise UntrustedConfig(f"cfg is a {type(cfg).__name__}, not the dict fairseq saves")
    for group, obj in list(cfg.items()):
        where = f"cfg.{group}"
        if group == "_name" or obj is None:
            continue
        if not isinstance(group, str) or group not in GROUPS:
            del cfg[group]  # no group of fairseq's config: nothing reads it
            continue
        if isinstance(obj, argparse.Namespace):
            obj = vars(obj)
        elif not isinstance(obj, dict):
            raise UntrustedConfig(f"{where} is a {type(obj).__name__}, not a group of settings")
        if group in COMPONENT_GROUPS:
            _component(group, _group_name(group, obj), f"{where}._name", components)
        _fields(obj, where, components, fields)


# the groups of fairseq 0.12's config (FairseqConfig)
GROUPS = ("common", "common_eval", "distributed_training", "dataset", "optimization", "checkpoint", "bmuf",
          "generation", "eval_lm", "interactive", "ema", *COMPONENT_GROUPS)


# ---------------------------------------------------------------- deriving the table from fairseq


def _kind_of_type(tp, name: str):
    """A dataclass field's kind: "int", "float", "bool", ["enum", choices], "numbers", or "drop"."""
    import enum
    import typing

    origin = getattr(tp, "__origin__", None)
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    if origin is typing.Union and len(args) == 1:
        return _kind_of_type(args[0], name)
    if origin in (list, typing.List, tuple):
        return "numbers" if args and all(a in (int, float) for a in args) else "drop"
    if tp is bool:
        return "bool"
    if tp in (int, float):
        return tp.__name__
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return ["enum", sorted(str(m.value) for m in tp)]
    return _kind_of_string(name)


def _kind_of_string(name: str):
    if name in VETTED:
        return VETTED[name]
    if name in EVALUATED_KEPT:
        return "literal"
    return "drop"


def _kind_of_action(action):
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "bool"
    if action.choices is not None:
        return ["enum", sorted(str(c) for c in action.choices)]
    if action.type in (int, float):
        return action.type.__name__
    return _kind_of_string(action.dest)


def _merge(fields: Dict, name: str, kind, default) -> None:
    """Add NAME's KIND. One name of two kinds: a typed kind wins over "drop" (an argparse flag whose
    type fairseq left out, such as a size defaulting to another's: the value is checked as that type),
    enums join their choices, an int and a float make a float, anything else is dropped."""
    if name not in fields:
        fields[name] = [kind, default]
        return
    old = fields[name][0]
    if old == kind or kind == "drop":
        return
    if old == "drop":
        fields[name][0] = kind
    elif isinstance(old, list) and isinstance(kind, list):
        fields[name][0] = ["enum", sorted(set(old[1]) | set(kind[1]))]
    elif {old, kind} <= {"int", "float"}:
        fields[name][0] = "float"
    else:
        fields[name][0] = "drop"


def _plain_default(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value if not (isinstance(value, float) and not math.isfinite(value)) else None
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    if hasattr(value, "value"):  # an enum member
        return str(value.value)
    return None


def _add_dataclass(fields: Dict, dc) -> None:
    import dataclasses

    for f in dataclasses.fields(dc):
        if f.name.startswith("_"):
            continue
        if dataclasses.is_dataclass(f.type):  # TransformerConfig's encoder/decoder groups: their fields by name
            _merge(fields, f.name, "group", None)
            _add_dataclass(fields, f.type)
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is dataclasses.MISSING or default == "???":  # omegaconf's "missing"
            default = None
        _merge(fields, f.name, _kind_of_type(f.type, f.name), _plain_default(default))


def _add_parser(fields: Dict, add_args) -> None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_args(parser)
    for action in parser._actions:
        if action.dest and action.dest != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            default = action.default if action.default is not argparse.SUPPRESS else None
            _merge(fields, action.dest, _kind_of_action(action), _plain_default(default))


def _project_components() -> Dict[str, list]:
    """What tfixup.methods builds: archs (every arch of its methods' models) and, read from its one
    fairseq-train argument builder, tasks, criteria, optimizers and schedulers."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    from tfixup import methods

    archs = {a for m in methods.METHODS.values() for a in (m.arch, m.lm_arch) if a}
    models = {ARCH_MODEL_NAME_REGISTRY[a] for a in archs}
    found = {"model": sorted(a for a, n in ARCH_MODEL_NAME_REGISTRY.items() if n in models),
             "task": [], "criterion": [], "optimizer": [], "lr_scheduler": []}
    flag = {"--task": "task", "--criterion": "criterion", "--optimizer": "optimizer", "--lr-scheduler": "lr_scheduler"}
    for name, m in methods.METHODS.items():
        for task in methods.TASKS:
            if task == "language_modeling" and not m.lm_arch:
                continue
            for schedule in methods.SCHEDULES:
                args = methods.train_args(methods.Recipe(name, 8, 8, 1, 1, 1, 1e-3, schedule=schedule, task=task))
                for i, word in enumerate(args[:-1]):
                    if word in flag and args[i + 1] not in found[flag[word]]:
                        found[flag[word]].append(args[i + 1])
    found = {k: sorted(v) for k, v in found.items()}
    found.update({k: list(v) for k, v in TEXT_TOOLS.items()})
    return found


def derive():
    """(COMPONENTS, FIELDS) from fairseq (with the plugin registered) and tfixup.methods: COMPONENTS maps
    each group of COMPONENT_GROUPS to the names this project uses; FIELDS maps every field of fairseq's own
    config groups and of those components to [kind, fairseq's default]."""
    import fairseq_tfixup  # noqa: F401  (registers the project's models, schedulers, optimizer)
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    components = _project_components()
    fields: Dict[str, list] = {}
    for name in GROUPS:
        if name not in COMPONENT_GROUPS:
            _add_dataclass(fields, FairseqConfig.__dataclass_fields__[name].type)
    for task in components["task"]:
        cls = TASK_REGISTRY[task]
        if getattr(cls, "__dataclass", None) is not None:
            _add_dataclass(fields, cls.__dataclass)
        _add_parser(fields, cls.add_args)
    from fairseq.models.transformer import TransformerConfig, TransformerModelBase

    for arch in components["model"]:
        cls = ARCH_MODEL_REGISTRY[arch]
        if getattr(cls, "__dataclass", None) is not None:
            _add_dataclass(fields, cls.__dataclass)
        if issubclass(cls, TransformerModelBase):  # its flags are TransformerConfig's, which a hydra config nests
            _add_dataclass(fields, TransformerConfig)
        _add_parser(fields, cls.add_args)
    for group in ("criterion", "optimizer", "lr_scheduler", "scoring", "bpe", "tokenizer"):
        registry = REGISTRIES[group]
        for name in components[group]:
            dc = registry["dataclass_registry"].get(name)
            if dc is not None:
                _add_dataclass(fields, dc)
            cls = registry["registry"][name]
            if "add_args" in vars(cls) or any("add_args" in vars(b) for b in cls.__mro__[1:-1]
                                              if b.__module__.startswith("fairseq_tfixup")):
                _add_parser(fields, cls.add_args)
    for name in COMPONENT_FIELDS:
        fields[name] = ["component", None]
    return components, dict(sorted(fields.items()))


def write(path=None) -> str:
    """Regenerate allowlist_table.py from ``derive()``."""
    import pathlib
    import pprint

    components, fields = derive()
    path = pathlib.Path(path or pathlib.Path(__file__).with_name("allowlist_table.py"))
    text = ('"""Generated by `python -m tfixup.allowlist write` from fairseq and tfixup.methods (see allowlist.py);\n'
            'tests/test_allowlist.py fails when it no longer matches. Do not edit."""\n\n'
            f"COMPONENTS = {pprint.pformat(components, width=118, compact=True)}\n\n"
            f"FIELDS = {pprint.pformat(fields, width=118, compact=True)}\n")
    from tfixup import atomic

    atomic.write_text(path, text)
    return str(path)


if __name__ == "__main__":
    if sys.argv[1:] == ["write"]:
        print(write())
    elif sys.argv[1:] == ["show"]:
        c, f = derive()
        print(json.dumps(c, indent=1))
        for k, v in f.items():
            print(k, v)
    else:
        sys.exit("usage: python -m tfixup.allowlist write|show")
