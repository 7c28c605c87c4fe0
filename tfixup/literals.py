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
  the field (``UnsafeCheckpoint``);
* checks a command line once parsed, before fairseq composes its config from it;
* replaces fairseq's own ``eval_str_list``/``eval_str_dict``/``eval_bool`` and, in
  each fairseq module that calls ``eval`` on a config value, the name ``eval``, by
  literal-only versions (so a command line or a hydra config is held to the same rule).

A literal here is what ``ast.literal_eval`` reads (numbers, strings, None/True/False,
tuples, lists, dicts and sets of them, a unary sign) plus ``+`` and ``*`` between
them, which fairseq's own defaults use (``"[(512, 3)] * 20"``), with results capped
at ``MAX_ITEMS`` elements. This module imports nothing from fairseq at the top:
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

MAX_ITEMS = 1_000_000  # the longest list or string ``+``/``*`` may build
MAX_TEXT = 100_000  # characters of a value


class NotALiteral(ValueError):
    """A value that fairseq would eval() and that is not a literal, in one line naming the field."""


class UnsafeCheckpoint(NotALiteral):
    """A checkpoint holding such a value, in one line naming the file and the field."""


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def literal(text: str, field: str = "value") -> Any:
    """The value of TEXT when it is a Python literal (see the module's docstring); else
    ``NotALiteral`` naming FIELD. Nothing in TEXT is ever run."""
    def bad(why=""):
        return NotALiteral(f"{field}={_show(text)} is not a Python literal{': ' + why if why else ''}; fairseq "
                           "eval()s this field, so only numbers, strings, None/True/False and tuples, lists or "
                           "dicts of them are accepted (anything else could run code)")

    if not isinstance(text, str):
        raise TypeError(f"{field}: expected a string, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise bad(f"longer than {MAX_TEXT} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _value(tree.body)
    except NotALiteral as e:
        raise bad(str(e)) from None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        raise bad() from None


def _sized(value):
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > MAX_ITEMS:
        raise NotALiteral(f"more than {MAX_ITEMS} items")
    if isinstance(value, int) and value.bit_length() > 4096:
        raise NotALiteral("a number of more than 4096 bits")
    return value


def _value(node):
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise NotALiteral("'...'")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(e) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):  # {**x}
            raise NotALiteral("'**'")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, bool) or not isinstance(operand, (int, float, complex)):
            raise NotALiteral("a sign before a non-number")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Mult):
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                    if len(seq) * max(n, 0) > MAX_ITEMS:
                        raise NotALiteral(f"more than {MAX_ITEMS} items")
                    return seq * n
        if all(isinstance(x, (int, float, complex)) and not isinstance(x, bool) for x in (left, right)) or (
                isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, (str, list, tuple))):
            return _sized(left + right if isinstance(node.op, ast.Add) else left * right)
        raise NotALiteral(f"'{'+' if isinstance(node.op, ast.Add) else '*'}' between "
                          f"{type(left).__name__} and {type(right).__name__}")
    what = f"the name {node.id}" if isinstance(node, ast.Name) else f"an expression ({type(node).__name__})"
    raise NotALiteral(what)


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
    """Refuse a checkpoint's state (``torch.load``'s dict) whose args/cfg hold, in a field
    fairseq evaluates, anything but a literal: ``UnsafeCheckpoint`` naming WHERE and the field."""
    if not isinstance(state, Mapping):
        return
    try:
        for part in ("args", "cfg"):
            for name, value in evaluated_fields(state.get(part), f"{part}."):
                literal(value, name)
    except NotALiteral as e:
        raise UnsafeCheckpoint(f"{where}: refused: {e}; not a checkpoint fairseq wrote (or altered "
                               "since): delete it or replace it with a trusted copy") from None


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
    return literal(source, _caller_field())


def eval_str_list(x, type=float):  # noqa: A002  (fairseq's signature)
    """fairseq.utils.eval_str_list, literal only."""
    if x is None:
        return None
    if isinstance(x, str):
        x = literal(x, _caller_field())
    try:
        return list(map(type, x))
    except TypeError:
        return [type(x)]


def eval_str_dict(x, type=dict):  # noqa: A002
    """fairseq.utils.eval_str_dict, literal only."""
    if x is None:
        return None
    if isinstance(x, str):
        x = literal(x, _caller_field())
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
    """torch, as fairseq.checkpoint_utils sees it: ``torch.load`` checks the state it returns
    (``check_state``, naming the file). Everything else is torch's own. Checking there, and not
    by wrapping fairseq's loader, keeps the plugin's frames off the stack while fairseq goes on
    to build from the state (hydra's warnings point so many frames up that an extra frame moves
    them from "sys:1" onto another file's line)."""

    def __init__(self, real):
        super().__init__(real.__name__)
        self.__real = real

    def __getattr__(self, name):
        return getattr(self.__real, name)

    def load(self, f, *args, **kwargs):
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
    _one_line_errors()


def check_args(args) -> None:
    """A command line's arguments (argparse.Namespace): every field fairseq evaluates holds a literal,
    or ``NotALiteral`` naming its flag."""
    for name, value in evaluated_fields(args):
        literal(value, "--" + name.replace("_", "-"))


def _one_line_errors() -> None:
    """A refused value ends a command line tool (fairseq-generate ...) with one line, not a traceback."""
    if getattr(sys.excepthook, "tfixup", False):
        return
    previous = sys.excepthook

    def hook(kind, error, tb):
        if isinstance(error, NotALiteral):
            print(f"error: {error}", file=sys.stderr)
        else:
            previous(kind, error, tb)

    hook.tfixup = True
    sys.excepthook = hook
