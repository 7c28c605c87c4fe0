"""Config strings that fairseq ``eval()``s, accepted only as Python literals.

fairseq 0.12 runs some config values through Python's ``eval``: a checkpoint (its
``args``/``cfg``, plain strings that safe unpickling cannot refuse) or a command line
holding ``"(__import__('os').system('...'), None)[1]"`` in such a field runs that
code when a model, optimizer or task is built from it. docs/security.md lists every
place. Importing the plugin (which ``--user-dir`` does before fairseq reads any
checkpoint) calls ``install()``, which

* checks every such field of every checkpoint fairseq loads (the ``torch.load`` of
  ``checkpoint_utils.load_checkpoint_to_cpu``, the one loader of fairseq-train's
  resume, fairseq-generate, -interactive, -validate and the hub) and refuses a
  checkpoint holding anything but a literal there, in one line naming the file and
  the field (``UnsafeCheckpoint``); then holds its config to the allow-list of
  allowlist.py (this project's components and plain settings; every other field,
  those naming files among them, set back to fairseq's default);
* checks a command line once parsed, before fairseq composes its config from it;
* replaces fairseq's own ``eval_str_list``/``eval_str_dict``/``eval_bool`` and, in
  each fairseq module that calls ``eval`` on a config value, the name ``eval``, by
  literal-only versions (so a command line or a hydra config is held to the same rule).

A literal here is what ``ast.literal_eval`` reads (numbers, strings, None/True/False,
tuples, lists, dicts and sets of them, a unary sign) plus ``+`` and ``*`` between
them, which fairseq's own defaults use (``"[(512, 3)] * 20"``). Sizes are bounded from the
syntax before anything is built: ``MAX_ITEMS`` elements and characters in all (a list
repeated inside a list counts once per repetition), ``MAX_NESTING`` levels, ``MAX_NODES``
syntax nodes, ``MAX_TEXT`` characters of text, ``MAX_BITS`` bits of a whole number. Fields
with a known shape (``SHAPES``: Adam's betas, xformers' dicts, cutoff lists) must also have
that type and range. This module imports nothing from fairseq at the top:
harness/config.py checks experiment configs with ``literal`` without loading it.
"""

import argparse
import ast
import importlib
import linecache
import re
import sys
import types
from typing import Any, Mapping

from tfixup import errors

# Every config field fairseq 0.12 (and the fairseq-fixed 0.12.3.1 fork) passes to eval(), or to
# utils.eval_str_list / eval_str_dict / eval_bool (which eval() a string): field -> where.
EVALUATED = {
    "adam_betas": "optim/adam.py, optim/cpu_adam.py",
    "adamax_betas": "optim/adamax.py",
    "adafactor_eps": "optim/adafactor.py",
    "lamb_betas": "optim/fused_lamb.py",
    "wer_args": "criterions/ctc.py",
    "encoder_xformers_att_config": "modules/multihead_attention.py (eval_str_dict)",
    "decoder_xformers_att_config": "modules/multihead_attention.py (eval_str_dict)",
    "xformers_att_config": "modules/multihead_attention.py (eval_str_dict)",
    "adaptive_softmax_cutoff": "models/transformer, lstm, lstm_lm, lightconv, fconv_lm (eval_str_list)",
    "adaptive_input_cutoff": "models/transformer_lm.py, lightconv_lm.py (eval_str_list)",
    "character_filters": "models/transformer_lm.py, lightconv_lm.py",
    "encoder_layers": "models/fconv.py, fconv_self_att.py (a string there)",
    "decoder_layers": "models/fconv.py, fconv_lm.py, fconv_self_att.py (a string there)",
    "encoder_attention": "models/fconv_self_att.py",
    "decoder_attention": "models/fconv.py, fconv_lm.py, fconv_self_att.py, lstm.py (eval_bool)",
    "self_attention": "models/fconv_self_att.py",
    "project_input": "models/fconv_self_att.py",
    "gated_attention": "models/fconv_self_att.py",
    "downsample": "models/fconv_self_att.py",
    "pretrained": "models/fconv_self_att.py",
    "conv_feature_layers": "models/wav2vec/wav2vec.py, wav2vec2.py, hubert/hubert.py, "
                           "speech_to_text/s2t_wav_transformer.py",
    "conv_aggregator_layers": "models/wav2vec/wav2vec.py",
    "feature_encoder_spec": "data/audio/raw_audio_dataset.py",
    "left_pad_source": "tasks/multilingual_translation.py, online_backtranslation.py, "
                       "data/multilingual/multilingual_data_manager.py (eval_bool)",
    "left_pad_target": "tasks/multilingual_translation.py, online_backtranslation.py, "
                       "data/multilingual/multilingual_data_manager.py (eval_bool)",
    "pipeline_balance": "distributed/utils.py, model_parallel (eval_str_list)",
    "pipeline_devices": "distributed/utils.py, model_parallel (eval_str_list)",
    "pipeline_encoder_balance": "model_parallel/models/pipeline_parallel_transformer (eval_str_list)",
    "pipeline_encoder_devices": "distributed/utils.py, model_parallel (eval_str_list)",
    "pipeline_decoder_balance": "model_parallel/models/pipeline_parallel_transformer (eval_str_list)",
    "pipeline_decoder_devices": "distributed/utils.py, model_parallel (eval_str_list)",
    "model_overrides": "fairseq_cli/validate.py, eval_lm.py",
    # parsed by argparse types that eval (a string stored in a checkpoint is not evaluated
    # again, but nothing legitimate stores anything but a literal there)
    "encoder_kernel_size_list": "models/lightconv.py (eval_str_list)",
    "decoder_kernel_size_list": "models/lightconv.py, lightconv_lm.py (eval_str_list)",
    "encoder_glu": "models/lightconv.py (eval_bool)",
    "decoder_glu": "models/lightconv.py, lightconv_lm.py (eval_bool)",
    "weight_softmax": "models/lightconv.py, lightconv_lm.py (eval_bool)",
}

# fairseq modules that call the builtin eval() on a config value: their name ``eval`` is
# shadowed by ``literal_only_eval`` (a module's globals come before the builtins)
EVAL_MODULES = (
    "fairseq.optim.adam", "fairseq.optim.cpu_adam", "fairseq.optim.adamax", "fairseq.optim.adafactor",
    "fairseq.optim.fused_lamb", "fairseq.criterions.ctc", "fairseq.models.transformer_lm",
    "fairseq.models.lightconv_lm", "fairseq.models.fconv", "fairseq.models.fconv_lm",
    "fairseq.models.fconv_self_att", "fairseq.models.hubert.hubert", "fairseq.models.wav2vec.wav2vec",
    "fairseq.models.wav2vec.wav2vec2", "fairseq.models.speech_to_text.s2t_wav_transformer",
    "fairseq.data.audio.raw_audio_dataset", "fairseq_cli.validate", "fairseq_cli.eval_lm",
)
# modules holding fairseq.utils' eval helpers (their own name or a `from fairseq.utils import`)
HELPER_MODULES = ("fairseq.utils", "fairseq.options", "fairseq.data.multilingual.multilingual_data_manager")

MAX_ITEMS = 1_000_000  # elements of a value in all, every container and string counted (see _measure)
MAX_TEXT = 10_000  # characters of a value (fairseq's own are under 100)
MAX_NODES = 2_000  # syntax nodes of a value (fairseq's own have under 50)
MAX_NESTING = 16  # containers inside containers (fairseq's own values nest 2 deep)
MAX_BITS = 4096  # of a whole number


class NotALiteral(errors.Refused):
    """A value that fairseq would eval() and that is not a literal, in one line naming the field."""


class TooLarge(NotALiteral):
    """A literal whose value would exceed a limit, in one line naming the field and the limit."""


class BadValue(NotALiteral):
    """A literal of the wrong type or range for its field, in one line naming the field and what it takes."""


class UnsafeCheckpoint(NotALiteral):
    """A checkpoint holding such a value, in one line naming the file and the field."""


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def literal(text: str, field: str = "value") -> Any:
    """The value of TEXT when it is a Python literal (see the module's docstring); else
    ``NotALiteral`` naming FIELD. Nothing in TEXT is ever run, and its size is bounded
    from the syntax alone before anything is built (``TooLarge``)."""
    def bad(why=""):
        return NotALiteral(f"{field}={_show(text)} is not a Python literal{': ' + why if why else ''}; fairseq "
                           "eval()s this field, so only numbers, strings, None/True/False and tuples, lists or "
                           "dicts of them are accepted (anything else could run code)")

    if not isinstance(text, str):
        raise TypeError(f"{field}: expected a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise TooLarge(f"{field}={_show(text)} is refused: longer than {MAX_TEXT} characters (the limit, "
                       "MAX_TEXT); no fairseq setting needs that")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        nodes = sum(1 for _ in ast.walk(tree))
        if nodes > MAX_NODES:
            raise TooLarge(f"{nodes} syntax nodes, more than {MAX_NODES} (the limit, MAX_NODES)")
        _measure(tree.body, 0)  # types and sizes, before anything is built
        return _value(tree.body)
    except TooLarge as e:
        raise TooLarge(f"{field}={_show(text)} is refused: its value would hold {e}; no fairseq setting "
                       "needs that") from None
    except NotALiteral as e:
        raise bad(str(e)) from None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        raise bad() from None


_SEQUENCES = {ast.Tuple: "tuple", ast.List: "list", ast.Set: "set", ast.Dict: "dict"}


def _measure(node, depth):
    """(kind, length, size) of NODE's value, from its syntax alone: kind "number" (length: the value
    itself), "str", "bytes", a container's ("list", ...) or a constant's type ("NoneType", "bool"); size counts every element of every container
    and every character, as often as it occurs (``[[0] * 1000] * 1000`` is 1,001,000: a shared list
    is walked once per reference by whatever reads the value). ``TooLarge`` past MAX_ITEMS,
    MAX_NESTING or MAX_BITS; ``NotALiteral`` for what ``_value`` refuses too."""
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, (str, bytes)):
            return type(v).__name__, len(v), _cap(len(v))
        if isinstance(v, (int, float, complex)) and not isinstance(v, bool):
            return "number", _bits(v), 0
        return type(v).__name__, 0, 0  # None, True, False; Ellipsis is refused by _value
    if type(node) in _SEQUENCES:
        if depth >= MAX_NESTING:
            raise TooLarge(f"containers nested more than {MAX_NESTING} deep (the limit, MAX_NESTING)")
        parts = [*node.keys, *node.values] if isinstance(node, ast.Dict) else node.elts
        size = len(node.values if isinstance(node, ast.Dict) else node.elts)
        for part in parts:
            if part is None:  # {**x}
                raise NotALiteral("'**'")
            size = _cap(size + _measure(part, depth + 1)[2])
        return _SEQUENCES[type(node)], len(parts), size
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        kind, value, _ = _measure(node.operand, depth)
        if kind != "number":
            raise NotALiteral("a sign before a non-number")
        return kind, -value if isinstance(node.op, ast.USub) else value, 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        (lk, lv, ls), (rk, rv, rs) = _measure(node.left, depth), _measure(node.right, depth)
        if lk == rk == "number":
            return "number", _bits(lv + rv if isinstance(node.op, ast.Add) else lv * rv), 0
        if isinstance(node.op, ast.Add) and lk == rk and lk in ("str", "bytes", "list", "tuple"):
            return lk, lv + rv, _cap(ls + rs)
        if isinstance(node.op, ast.Mult):
            for (sk, sv, ss), (nk, nv, _) in (((lk, lv, ls), (rk, rv, rs)), ((rk, rv, rs), (lk, lv, ls))):
                if sk in ("str", "bytes", "list", "tuple") and nk == "number" and isinstance(nv, int):
                    n = max(nv, 0)
                    return sk, sv * n, _cap(ss * n)
        raise NotALiteral(f"'{'+' if isinstance(node.op, ast.Add) else '*'}' between {lk} and {rk}")
    what = f"the name {node.id}" if isinstance(node, ast.Name) else f"an expression ({type(node).__name__})"
    raise NotALiteral(what)


def _cap(size: int) -> int:
    if size > MAX_ITEMS:
        raise TooLarge(f"more than {MAX_ITEMS} elements in all, counting each element and character once per "
                       "occurrence (the limit, MAX_ITEMS)")
    return size


def _bits(value):
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise TooLarge(f"a whole number of more than {MAX_BITS} bits (the limit, MAX_BITS)")
    return value


def _value(node):
    """NODE's value; its sizes are bounded already (_measure)."""
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise NotALiteral("'...'")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(e) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise NotALiteral(f"an expression ({type(node).__name__})")  # _measure refused it already


# ---------------------------------------------------------------- types and ranges


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _betas(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(_real(b) and 0 <= b < 1 for b in v)


def _eps_pair(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(_real(e) and e >= 0 for e in v)


def _attention_config(v) -> bool:
    return v is None or isinstance(v, dict) and all(isinstance(k, str) for k in v)


def _cutoffs(v) -> bool:
    items = v if isinstance(v, (tuple, list)) else [v]
    return v is None or all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in items)


_BETAS = (_betas, "two numbers in [0, 1) such as (0.9, 0.98)")
_ATTENTION = (_attention_config, "a dict of xFormers attention settings such as {'name': 'scaled_dot_product'} "
                                 "(or left unset)")
_CUTOFFS = (_cutoffs, "positive whole numbers such as 10000,50000 (or left unset)")
# field -> (accepts the value, what it takes): checked wherever the literal is (command lines, checkpoints,
# fairseq's eval), so a wrong type stops the command at once and not at the first update
SHAPES = {
    "adam_betas": _BETAS, "adamax_betas": _BETAS, "lamb_betas": _BETAS,
    "adafactor_eps": (_eps_pair, "two numbers of at least 0 such as (1e-30, 1e-3)"),
    "encoder_xformers_att_config": _ATTENTION, "decoder_xformers_att_config": _ATTENTION,
    "xformers_att_config": _ATTENTION,
    "adaptive_softmax_cutoff": _CUTOFFS, "adaptive_input_cutoff": _CUTOFFS,
}


def field_value(text: str, key: str, field: str = None) -> Any:
    """``literal(text)`` of the config field KEY (``adam_betas``), refused (``BadValue``) when it has not
    the type and range fairseq uses that field with (SHAPES). FIELD names it in messages (default KEY)."""
    field = field or key
    value = literal(text, field)
    accepts, what = SHAPES.get(key, (None, ""))
    if accepts is not None and not accepts(value):
        raise BadValue(f"{field}={_show(text)} must be {what}")
    return value


# ---------------------------------------------------------------- checkpoints


def _plain(obj):
    """omegaconf containers as plain ones, interpolations unresolved (nothing is looked up)."""
    if type(obj).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=False)
    return obj


MAX_DEPTH = 32  # fairseq's configs nest 3 levels


def evaluated_fields(obj, prefix="", depth=0):
    """(dotted name, value) of every string field of a checkpoint's args/cfg whose name
    fairseq evaluates, at any depth (argparse.Namespace, dicts, omegaconf, lists)."""
    if depth > MAX_DEPTH:
        raise NotALiteral(f"{prefix.rstrip('.')} nests more than {MAX_DEPTH} levels deep, which no fairseq config does")
    obj = _plain(obj)
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            name = f"{prefix}{key}"
            if key in EVALUATED and isinstance(value, str):
                yield name, value
            else:
                yield from evaluated_fields(value, name + ".", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from evaluated_fields(value, f"{prefix}{i}.", depth + 1)


def check_state(state, where) -> None:
    """Refuse a checkpoint's state (``torch.load``'s dict) whose args/cfg hold, in a field fairseq
    evaluates, anything but a literal of the field's type, or anything outside the allow-list
    (allowlist.check_config: a component this project does not use, a value not of its field's kind);
    ``UnsafeCheckpoint`` naming WHERE and the field. Every field the allow-list does not keep (those
    naming files among them) is set back to fairseq's default, in place."""
    from tfixup import allowlist

    if not isinstance(state, Mapping):
        return
    try:
        for part in ("args", "cfg"):
            for name, value in evaluated_fields(state.get(part), f"{part}."):
                field_value(value, name.rsplit(".", 1)[-1], name)
        allowlist.check_config(state)
    except (NotALiteral, allowlist.UntrustedConfig) as e:
        raise UnsafeCheckpoint(f"{where}: refused: {e}; fairseq-tfixup loads only checkpoints of its own models "
                               "and tasks that hold plain settings (docs/security.md): rebuild it with this "
                               "project, or replace it with a trusted copy") from None


# ---------------------------------------------------------------- fairseq's eval helpers, literal only

_EVAL_ARG = re.compile(r"eval\w*\(\s*(?:[\w.]*\.)?(\w+)\s*[,)]")


def _caller_field(depth=2) -> str:
    """The field a fairseq line eval()s (``eval(self.cfg.adam_betas)`` -> adam_betas), for the message."""
    frame = sys._getframe(depth)
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    m = _EVAL_ARG.search(line)
    return m.group(1) if m else f"the value eval()'d at {frame.f_code.co_filename}:{frame.f_lineno}"


def literal_only_eval(source, globals=None, locals=None):  # noqa: A002  (eval's own signature)
    """``eval`` for fairseq's modules: literals only."""
    if not isinstance(source, str):
        raise TypeError(f"eval() arg 1 must be a string, got {type(source).__name__} (literal-only eval)")
    field = _caller_field()
    return field_value(source, field)


def eval_str_list(x, type=float):  # noqa: A002  (fairseq's signature)
    """fairseq.utils.eval_str_list, literal only."""
    if x is None:
        return None
    if isinstance(x, str):
        x = field_value(x, _caller_field())
    try:
        return list(map(type, x))
    except TypeError:
        return [type(x)]


def eval_str_dict(x, type=dict):  # noqa: A002
    """fairseq.utils.eval_str_dict, literal only."""
    if x is None:
        return None
    if isinstance(x, str):
        x = field_value(x, _caller_field())
    return x


def eval_bool(x, default=False):
    """fairseq.utils.eval_bool, literal only."""
    if not isinstance(x, str):  # fairseq's eval(x) raises TypeError for these: the default
        return default
    return bool(literal(x, _caller_field()))


SAFE_HELPERS = {"eval_str_list": eval_str_list, "eval_str_dict": eval_str_dict, "eval_bool": eval_bool}
# (module, name) -> fairseq's own helper that install() replaced (for tests that show what it did)
FAIRSEQ_ORIGINALS = {}


class _TorchWithCheckedLoad(types.ModuleType):
    """torch, as fairseq.checkpoint_utils sees it: ``torch.load`` loads with ``weights_only=True``,
    always, and checks the state it returns (``check_state``, naming the file). Everything else is torch's own. Checking there, and not
    by wrapping fairseq's loader, keeps the plugin's frames off the stack while fairseq goes on
    to build from the state (hydra's warnings point so many frames up that an extra frame moves
    them from "sys:1" onto another file's line)."""

    def __init__(self, real):
        super().__init__(real.__name__)
        self.__real = real

    def __getattr__(self, name):
        return getattr(self.__real, name)

    def load(self, f, *args, **kwargs):
        # safe unpickling always, whatever torch's default (False before torch 2.6, or switched by
        # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD, which an explicit argument overrides)
        kwargs["weights_only"] = True
        state = self.__real.load(f, *args, **kwargs)
        check_state(state, getattr(f, "name", f))
        return state


def _checked_override_module_args(override):
    def override_module_args(args):
        check_args(args)  # before fairseq composes its config from them
        return override(args)

    override_module_args.__wrapped__ = override
    override_module_args.tfixup_checked = True
    return override_module_args


def install() -> None:
    """Hold fairseq (already importable) to literals wherever it evaluates config values. Idempotent."""
    from fairseq import checkpoint_utils

    for name in (*HELPER_MODULES, *EVAL_MODULES):
        if name.startswith("fairseq_cli."):
            # a command's own module: loaded before --user-dir when that command runs; importing it
            # here would configure logging for every program that imports the plugin. A program that
            # imports one later calls install() again (harness/average.py)
            module = sys.modules.get(name)
            if module is None:
                continue
        else:
            try:
                module = importlib.import_module(name)  # loaded with fairseq already (its registries)
            except ImportError:  # a module of an optional part of fairseq that cannot load here
                continue
        if name in HELPER_MODULES:
            for helper, safe in SAFE_HELPERS.items():
                if hasattr(module, helper):
                    if getattr(module, helper) is not safe:
                        FAIRSEQ_ORIGINALS.setdefault((name, helper), getattr(module, helper))
                    setattr(module, helper, safe)
        else:
            module.eval = literal_only_eval
    # every checkpoint fairseq loads: checkpoint_utils.load_checkpoint_to_cpu's torch.load
    if not isinstance(checkpoint_utils.torch, _TorchWithCheckedLoad):
        checkpoint_utils.torch = _TorchWithCheckedLoad(checkpoint_utils.torch)
    # a command line, once parsed, before fairseq composes its config from it (the first step of
    # convert_namespace_to_omegaconf, which every fairseq_cli command calls)
    from fairseq.dataclass import utils as dataclass_utils

    if not getattr(dataclass_utils.override_module_args, "tfixup_checked", False):
        dataclass_utils.override_module_args = _checked_override_module_args(dataclass_utils.override_module_args)
    errors.one_line_errors()


def check_args(args) -> None:
    """A command line's arguments (argparse.Namespace): every field fairseq evaluates holds a literal,
    or ``NotALiteral`` naming its flag."""
    for name, value in evaluated_fields(args):
        field_value(value, name, "--" + name.replace("_", "-"))
