"""Experiment configs: the one reader of ``configs/``.

``KEY=value`` lines (the value as written: no quotes, expansion or inline comments; ``#`` starts a comment line).
``configs/defaults.conf`` names every key with its default; ``configs/NAME.conf`` (or a base,
``configs/base/NAME.conf``) may start with ``BASE=NAME`` to build on ``configs/base/NAME.conf``. Later wins:
defaults < base chain < the file < environment variable < ``--set``. Bash never reads configs: scripts/*.sh ask
this module for values and arguments (NUL-separated, for ``mapfile -d ''``); train.sh records the resolved config
and the command in ``OUT/config.resolved.json``, which evaluation reads.

    python -m harness.config get EXPERIMENT [--set K=V]... --keys KEY...
    python -m harness.config get --run OUT_DIR [--set K=V]... --keys KEY...
    python -m harness.config train-args EXPERIMENT DATA OUT --world N [--device cpu|cuda] [--per-process-batch]
    python -m harness.config record EXPERIMENT --commands FILE --out OUT_DIR/config.resolved.json [--data DIR]
    python -m harness.config check-data --run OUT_DIR DATA   (evaluation data: the training data's dictionaries)
    python -m harness.config list
"""

import argparse
import json
import math
import os
import pathlib
import re
import shlex
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

# plain Python, no fairseq import: a config check or dry run stays fast (train_args imports fairseq for a
# config that has EXTRA_TRAIN_ARGS, to parse them with fairseq-train's own parser)
from tfixup import literals, methods

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG_DIR = pathlib.Path(os.environ.get("TFIXUP_CONFIGS", REPO / "configs"))
RECORD = "config.resolved.json"
_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
# what the evaluation may change on a trained run; every other key is the run's
EVAL_KEYS = ("AVG_CANDIDATES", "BEAM", "LENPEN", "COMPOUND_SPLIT", "LOWERCASE", "PAPER_METRIC", "PAPER_BLEU",
             "TABLE", "ROW")
INT_KEYS = ("ENCODER_LAYERS", "DECODER_LAYERS", "EMBED_DIM", "FFN_DIM", "HEADS", "MAX_TOKENS", "BATCH_SHARDS",
            "MAX_EPOCH", "MAX_UPDATE", "SAVE_INTERVAL_UPDATES", "KEEP_LAST", "SEED", "BEAM", "DECAY_PERIOD",
            "WARMUP_UPDATES", "LOG_INTERVAL")
FLOAT_KEYS = ("LR", "DROPOUT", "ATTENTION_DROPOUT", "ACTIVATION_DROPOUT", "WEIGHT_DECAY", "LABEL_SMOOTHING",
              "CLIP_NORM", "LENPEN", "WARMUP_INIT_LR")
# the range of a number of FLOAT_KEYS, in words and as a test: LR, the probabilities, the rest >= 0
RANGES = {"LR": ("> 0", lambda x: x > 0),
          **dict.fromkeys(("DROPOUT", "ATTENTION_DROPOUT", "ACTIVATION_DROPOUT", "LABEL_SMOOTHING"),
                          ("in [0, 1)", lambda x: 0 <= x < 1)),
          **dict.fromkeys(("WEIGHT_DECAY", "CLIP_NORM", "WARMUP_INIT_LR"), (">= 0", lambda x: x >= 0))}
# plain names: they become a path component (DATASET) or a single word of a command
NAME_KEYS = ("DATASET", "TEST_SET", "SRC", "TGT", "ARCH", "METHOD")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# PREPARE: a script of scripts/ and plain words (no glob, quote or expansion characters)
_PREPARE_SCRIPT = re.compile(r"prepare-[a-z0-9-]+\.sh")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.,:=+@%/-]+")
CHOICES = {"SHARE_EMBED": ("decoder", "all", "none"), "SCHEDULE": ("auto", "warmup", "matched", "nowarmup"),
           "FP16": ("0", "1"), "COMPOUND_SPLIT": ("0", "1"), "LOWERCASE": ("0", "1"),
           "PAPER_METRIC": ("tok", "detok"),
           # auto: the method's own; else an optimizer of the method table (tfixup/methods.py)
           "OPTIMIZER": ("auto", *sorted({m.optimizer for m in methods.METHODS.values()}))}


class ConfigError(ValueError):
    """A bad config or override, in one line naming the file and the fix."""


class Config(NamedTuple):
    name: str  # the experiment's name (file name without .conf)
    path: str  # the experiment file
    values: Dict[str, str]  # every key of defaults.conf, resolved
    sources: Dict[str, str] = {}  # where a key's value came from, when not the file (the environment, --set)


def _read(path: pathlib.Path) -> Dict[str, str]:
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}): "
                          "save the file as UTF-8") from None
    values, lines = {}, {}
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _LINE.match(stripped)
        if not m:
            raise ConfigError(f"{path}:{n}: expected KEY=value, got {stripped!r}")
        key = m.group(1)
        if key in values:
            raise ConfigError(f"{path}:{n}: {key} is set twice (lines {lines[key]} and {n}): keep one")
        values[key], lines[key] = m.group(2).strip(), n
    return values


def experiment_path(name: str) -> pathlib.Path:
    """``configs/NAME.conf`` for a name, or the file itself for a path."""
    path = pathlib.Path(name) if "/" in name or name.endswith(".conf") else CONFIG_DIR / f"{name}.conf"
    if not path.is_file():
        raise ConfigError(f"unknown experiment '{name}' (no {path}; see python -m harness.config list)")
    return path


def experiment_names() -> List[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.conf") if p.name != "defaults.conf")


def _chain(path: pathlib.Path, seen=()) -> Dict[str, str]:
    """The file's values on top of its BASE chain."""
    own = _read(path)
    base = own.pop("BASE", "")
    if not base:
        return own
    base_path = CONFIG_DIR / "base" / f"{base}.conf"
    if base_path in seen:
        raise ConfigError(f"{path}: BASE={base} loops back")
    if not base_path.is_file():
        raise ConfigError(f"{path}: BASE={base}, but there is no {base_path}")
    return {**_chain(base_path, (*seen, path)), **own}


def parse_sets(sets: Sequence[str]) -> Dict[str, str]:
    bad = [s for s in sets if not _LINE.match(s)]
    if bad:
        raise ConfigError(f"--set expects KEY=VALUE with an upper-case KEY, got {bad[0]!r}")
    return dict(s.split("=", 1) for s in sets)


def resolve(experiment: str, sets: Mapping[str, str] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """The experiment's values: defaults < base chain < file < environment < sets."""
    environ = os.environ if environ is None else environ
    defaults = _read(CONFIG_DIR / "defaults.conf")
    path = experiment_path(experiment)
    values = {**defaults, **_chain(path)}
    sources = {key: f"{path} ({key} from the environment)" for key in values if key in environ}
    values.update({key: environ[key] for key in sources})
    values.update(sets or {})
    sources.update({key: f"{path} (--set {key})" for key in sets or {}})
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]} (the keys are those of {CONFIG_DIR / 'defaults.conf'})")
    check(values, str(path), sources)
    return Config(path.stem, str(path.resolve()), values, sources)


def check(values: Mapping[str, str], where: str, sources: Optional[Mapping[str, str]] = None) -> None:
    """Every value that reaches a command, a path or a fairseq ``eval()`` is of its kind, or one ``ConfigError``
    line naming WHERE (or, for a value from elsewhere, SOURCES[key]), the key and what it must be."""
    def at(key):
        return (sources or {}).get(key, where)

    def refuse(key, must, got=None):  # GOT: the value as the message shows it (default: quoted)
        raise ConfigError(f"{at(key)}: {key} must be {must}, got {repr(values[key]) if got is None else got}")

    for key in INT_KEYS:
        if not re.fullmatch(r"\d+", values[key]):
            refuse(key, "a whole number >= 0")
    for key in FLOAT_KEYS:
        try:
            finite = math.isfinite(float(values[key]))
        except ValueError:
            finite = False
        if not finite:
            refuse(key, "a finite number")
    for key, choices in CHOICES.items():
        if values[key] not in choices:
            refuse(key, f"one of {', '.join(choices)}")
    for key, (must, within) in RANGES.items():
        if not within(float(values[key])):
            refuse(key, must, values[key])
    for key in NAME_KEYS:
        if values[key] and not (_NAME.fullmatch(values[key]) and ".." not in values[key]):
            refuse(key, "a plain name (letters, digits, _ . + -)")
    candidates = values["AVG_CANDIDATES"].split()
    if not candidates or not all(re.fullmatch(r"[1-9]\d*", k) for k in candidates):
        refuse("AVG_CANDIDATES", "whole numbers >= 1 separated by spaces (e.g. 1 5 10)")
    try:  # what fairseq's Adam eval()s: a literal pair of numbers in [0, 1)
        betas = literals.literal(values["ADAM_BETAS"], "ADAM_BETAS")
    except ValueError as e:
        raise ConfigError(f"{at('ADAM_BETAS')}: {e}") from None
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        refuse("ADAM_BETAS", "two numbers in [0, 1) such as (0.9,0.98)")
    prepare_words(values["PREPARE"], at("PREPARE"))
    extra_where = f"{at('EXTRA_TRAIN_ARGS')}: EXTRA_TRAIN_ARGS"
    try:
        extra = shlex.split(values["EXTRA_TRAIN_ARGS"])
    except ValueError as e:
        raise ConfigError(f"{extra_where}: {e}") from None
    evaluated_flags(extra, extra_where)
    owned_flags(extra, extra_where)


# fairseq-train flags the scripts set themselves, which a config (a file people share) may not:
# one loads code, the others move the run's outputs (or its starting weights) out of OUT_DIR and
# its lock, or contradict train.sh's devices and processes. fairseq takes the last of a flag given
# twice, so EXTRA_TRAIN_ARGS, which comes last, would win.
OWNED_FLAGS = {
    "--user-dir": "imports the Python code of that folder (the scripts load the plugin, fairseq_tfixup)",
    **dict.fromkeys(("--save-dir", "--restore-file", "--finetune-from-model", "--checkpoint-suffix",
                     "--log-file", "--tensorboard-logdir", "--wandb-project", "--azureml-logging", "--aim-repo",
                     "--aim-run-hash"),
                    "names files outside the run folder OUT_DIR (train.sh writes the checkpoints and logs there)"),
    **dict.fromkeys(("--cpu", "--tpu", "--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16",
                     "--distributed-world-size", "--distributed-rank", "--distributed-init-method",
                     "--distributed-port", "--distributed-backend", "--distributed-no-spawn", "--device-id",
                     "--local-rank", "--nprocs-per-node"),
                    "is set by train.sh from its --cpu/--nproc/--nnodes options and the FP16 key"),
}
# The config key behind a flag of the command train_args builds: EXTRA_TRAIN_ARGS naming the flag again
# would override the key while config.resolved.json still recorded the key's value.
KEY_FLAGS = {
    "ARCH or METHOD": ("--arch",), "EMBED_DIM": ("--encoder-embed-dim", "--decoder-embed-dim"),
    "FFN_DIM": ("--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"),
    "HEADS": ("--encoder-attention-heads", "--decoder-attention-heads"), "ENCODER_LAYERS": ("--encoder-layers",),
    "DECODER_LAYERS": ("--decoder-layers",), "SCHEDULE": ("--lr-scheduler",), "DECAY_PERIOD": ("--decay-period",),
    "WARMUP_UPDATES": ("--warmup-updates",), "WARMUP_INIT_LR": ("--warmup-init-lr",), "OPTIMIZER": ("--optimizer",),
    "ADAM_BETAS": ("--adam-betas",), "CLIP_NORM": ("--clip-norm",), "LR": ("--lr",), "DROPOUT": ("--dropout",),
    "ATTENTION_DROPOUT": ("--attention-dropout",), "ACTIVATION_DROPOUT": ("--activation-dropout",),
    "WEIGHT_DECAY": ("--weight-decay",), "LABEL_SMOOTHING": ("--label-smoothing",), "MAX_TOKENS": ("--max-tokens",),
    "BATCH_SHARDS": ("--update-freq",), "MAX_EPOCH": ("--max-epoch",), "MAX_UPDATE": ("--max-update",),
    "SAVE_INTERVAL_UPDATES": ("--save-interval-updates",), "SEED": ("--seed",), "LOG_INTERVAL": ("--log-interval",),
    "KEEP_LAST": ("--keep-last-epochs", "--keep-interval-updates"), "SRC": ("--source-lang", "-s"),
    "TGT": ("--target-lang", "-t"),
}
KEY_OF = {flag: key for key, flags in KEY_FLAGS.items() for flag in flags}


def owned_flags(words: Sequence[str], where: str, command: Sequence[str] = ()) -> None:
    """WORDS (EXTRA_TRAIN_ARGS) name no flag of OWNED_FLAGS, nor one COMMAND (the config's command) has."""
    given = {w for w in command if w.startswith("-")}
    for flag in (word.split("=", 1)[0] for word in words):
        if flag in OWNED_FLAGS:
            raise ConfigError(f"{where}: {flag} {OWNED_FLAGS[flag]}: remove it from EXTRA_TRAIN_ARGS")
        if flag in given:
            key = KEY_OF.get(flag)
            how = f"set {key} instead (--set {key.split()[0]}=...)" if key else "it cannot be changed here"
            raise ConfigError(f"{where}: {flag} is already in the command the config makes: {how}")


def evaluated_flags(words: Sequence[str], where: str) -> None:
    """fairseq flags whose value fairseq eval()s (``--adam-betas``, ``--adaptive-softmax-cutoff``, ...:
    literals.EVALUATED) must hold literals, of the type and range their field takes (literals.SHAPES)."""
    for i, word in enumerate(words):
        name, eq, value = word[2:].partition("=")
        field = name.replace("-", "_")
        # a flag without its value is left to fairseq's parser, which names the missing value
        if word.startswith("--") and field in literals.EVALUATED and (eq or i + 1 < len(words)):
            try:
                literals.field_value(value if eq else words[i + 1], field, f"--{name}")
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None


def prepare_words(text: str, where: str = "PREPARE") -> List[str]:
    """PREPARE as words: a script scripts/prepare-*.sh that runs on its own (not the bodies they source, which
    start with a comment instead of a shebang), then plain-word arguments."""
    words = text.split()
    if not words:
        return words
    scripts = sorted(p.name for p in (REPO / "scripts").glob("prepare-*.sh")
                     if _PREPARE_SCRIPT.fullmatch(p.name) and p.read_text(encoding="utf-8").startswith("#!"))
    if words[0] not in scripts:
        raise ConfigError(f"{where}: PREPARE must start with a script of scripts/ ({', '.join(scripts)}), "
                          f"got {words[0]!r}")
    for word in words[1:]:
        if not _PLAIN_WORD.fullmatch(word):
            raise ConfigError(f"{where}: PREPARE's arguments must be plain words (letters, digits and "
                              f"_ . , : = + @ % / -), got {word!r}")
    return words


def read_record(run_dir) -> Dict:
    path = pathlib.Path(run_dir) / RECORD
    if not path.is_file():
        raise ConfigError(f"no {path}: train this run with scripts/train.sh, which records its config there")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


def resolve_run(run_dir, sets: Mapping[str, str] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """The config a run trained with, plus evaluation overrides (EVAL_KEYS) from the environment or ``sets``.
    Overriding anything else is refused: it would describe another run than the one that happened."""
    environ = os.environ if environ is None else environ
    record = read_record(run_dir)
    values = dict(record["values"])
    env = {k: environ[k] for k in values if k in environ}
    for source, overrides in (("environment", env), ("--set", dict(sets or {}))):
        for key, value in overrides.items():
            if key not in values:
                raise ConfigError(f"{source}: unknown key {key}")
            if key in EVAL_KEYS:
                values[key] = value
            elif value != values[key]:
                raise ConfigError(f"{source} {key}={value}, but {run_dir} trained with {key}={values[key]} "
                                  f"(only {', '.join(EVAL_KEYS)} can change after training)")
    check(values, str(pathlib.Path(run_dir) / RECORD))
    return Config(record["experiment"], record["config_file"], values)


def train_args(cfg: Config, data: str, out: str, world: int = 1, device: str = "cpu",
               per_process_batch: bool = False) -> List[str]:
    """fairseq-train's arguments for this config (after the program name; no distributed flags): MAX_TOKENS x
    BATCH_SHARDS tokens per update on WORLD processes (PER_PROCESS_BATCH: MAX_TOKENS each, no accumulation).
    ``device``: cpu or cuda (fp16 when FP16=1; fairseq 0.12's --bf16 means TPU, so no bf16 here)."""
    v = cfg.values
    if not (v["SRC"] and v["TGT"]):
        raise ConfigError(f"{cfg.path}: set SRC and TGT")
    if v["MAX_EPOCH"] == "0" and v["MAX_UPDATE"] == "0":
        raise ConfigError(f"{cfg.path}: set MAX_EPOCH or MAX_UPDATE")
    tokens, shards = int(v["MAX_TOKENS"]), int(v["BATCH_SHARDS"])
    update_freq = 1 if per_process_batch else -(-shards // world)
    tokens = tokens if per_process_batch else tokens * shards // (world * update_freq)
    recipe = methods.Recipe(  # the project's one fairseq-train argument builder
        v["METHOD"], v["EMBED_DIM"], v["FFN_DIM"], v["HEADS"], v["ENCODER_LAYERS"], v["DECODER_LAYERS"], v["LR"],
        schedule=v["SCHEDULE"], warmup=v["WARMUP_UPDATES"], decay_period=v["DECAY_PERIOD"],
        warmup_init_lr=v["WARMUP_INIT_LR"], arch=v["ARCH"], share=v["SHARE_EMBED"], optimizer=v["OPTIMIZER"],
        adam_betas=v["ADAM_BETAS"], clip_norm=v["CLIP_NORM"], dropout=v["DROPOUT"],
        attention_dropout=v["ATTENTION_DROPOUT"], activation_dropout=v["ACTIVATION_DROPOUT"],
        weight_decay=v["WEIGHT_DECAY"], label_smoothing=v["LABEL_SMOOTHING"], max_tokens=tokens,
        max_update=v["MAX_UPDATE"], max_epoch=v["MAX_EPOCH"], seed=v["SEED"])
    args = [data, *methods.train_args(recipe, log_format="simple"),
            "--source-lang", v["SRC"], "--target-lang", v["TGT"], "--update-freq", str(update_freq),
            "--save-dir", f"{out}/checkpoints", "--keep-last-epochs", v["KEEP_LAST"],
            "--log-interval", v["LOG_INTERVAL"],
            # fairseq's default multiple of 8 drops the last sentences of the valid set (fairseq
            # issue #5036): checkpoint_best would be chosen on fewer sentences than K is
            "--required-batch-size-multiple", "1"]
    if v["SAVE_INTERVAL_UPDATES"] != "0":
        args += ["--save-interval-updates", v["SAVE_INTERVAL_UPDATES"], "--keep-interval-updates", v["KEEP_LAST"]]
    args += {"cpu": ["--cpu"], "cuda": ["--fp16"] if v["FP16"] == "1" else []}[device]
    extra = shlex.split(v["EXTRA_TRAIN_ARGS"])
    where = f"{cfg.sources.get('EXTRA_TRAIN_ARGS', cfg.path)}: EXTRA_TRAIN_ARGS"
    owned_flags(extra, where, args)
    if extra:
        # parsed by fairseq-train's own parser for the command ARGS, so that every spelling of a flag (-s en,
        # -sen, --source-lang=en) is the one setting it is: each must be a setting of the allow-list
        # (tfixup/allowlist.py) that neither train.sh nor the config's command sets (imports fairseq)
        from fairseq_tfixup import command_checks
        from tfixup import errors

        try:
            command_checks.check_extra_train_args(list(args), list(extra), OWNED_FLAGS, KEY_OF)
        except errors.Refused as e:
            raise ConfigError(f"{where}: {e}") from None
    return args + extra


def data_identity(data) -> Dict:
    """The data-bin's path and its dictionaries' sha256: what a model trained on it can be evaluated on."""
    from harness.manifest import sha256

    data = pathlib.Path(data)
    return {"path": str(data.resolve()), "dictionaries": {p.name: sha256(p) for p in sorted(data.glob("dict.*.txt"))}}


def check_data(run_dir, data) -> str:
    """The data-bin an evaluation of RUN_DIR uses must have the dictionaries it trained with (its record's).
    Returns the line that says which data is used; ``ConfigError`` otherwise."""
    now, trained = data_identity(data), read_record(run_dir).get("data")
    if trained is None:
        return f"evaluating on {now['path']} (the training data is unknown: its dictionaries are not compared)"
    ours, theirs = now["dictionaries"], trained["dictionaries"]
    differ = sorted(k for k in {*ours, *theirs} if ours.get(k) != theirs.get(k))
    if differ:
        raise ConfigError(f"{data}: {differ[0]} differs from the dictionary {run_dir} was trained with (in "
                          f"{trained['path']}): evaluate on that data-bin, or on one made with the same dictionaries")
    if now["path"] == trained["path"]:
        return f"evaluating on {now['path']} (the data-bin the run trained on)"
    return f"evaluating on {now['path']} (the dictionaries of the data-bin the run trained on, {trained['path']})"


def record(cfg: Config, commands: Sequence[str], path, data=None) -> None:
    """Write OUT/config.resolved.json: the resolved config, the exact command(s) and the data-bin's identity
    (``data_identity``). Once the run has a checkpoint, a rerun (resume) may change only how long it trains."""
    from tfixup import atomic

    path = pathlib.Path(path)
    # a checkpoint fairseq-train can resume from (crash.pt, fairseq's dump of a NaN step, is none)
    if path.is_file() and any((path.parent / "checkpoints").glob("checkpoint*.pt")):
        old = read_record(path.parent)["values"]
        may_change = {"MAX_UPDATE", "MAX_EPOCH", "LOG_INTERVAL", "KEEP_LAST", *EVAL_KEYS}
        changed = sorted(k for k in cfg.values if k not in may_change and old.get(k) != cfg.values[k])
        if changed:
            k = changed[0]
            raise ConfigError(f"{path.parent} holds checkpoints trained with {k}={old.get(k)}, now "
                              f"{k}={cfg.values[k]}: use a new OUT_DIR (a resumed run must keep its config)")
    content = {"experiment": cfg.name, "config_file": cfg.path, "values": cfg.values,
               "train_commands": list(commands), **({} if data is None else {"data": data_identity(data)})}
    atomic.write_json(path, content, sort_keys=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.config", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("get", help="values of KEYs, NUL-separated")
    g.add_argument("experiment", nargs="?")
    g.add_argument("--run", help="a trained run's OUT_DIR: its recorded config instead of the experiment's")
    g.add_argument("--keys", nargs="+", required=True)
    t = sub.add_parser("train-args", help="fairseq-train's arguments, NUL-separated")
    for name in ("experiment", "data", "out"):
        t.add_argument(name)
    t.add_argument("--world", type=int, default=1)
    t.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    t.add_argument("--per-process-batch", action="store_true")
    r = sub.add_parser("record", help="write OUT_DIR/config.resolved.json")
    r.add_argument("experiment")
    r.add_argument("--commands", required=True, help="file with the command line(s), one per process")
    r.add_argument("--out", required=True)
    r.add_argument("--data", help="the data-bin it trains on (its dictionaries' sha256 are recorded)")
    c = sub.add_parser("check-data", help="an evaluation's data-bin has the run's dictionaries")
    c.add_argument("--run", required=True)
    c.add_argument("data")
    sub.add_parser("list", help="experiment names")
    for q in (g, t, r):
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args(argv)
    try:
        sets = parse_sets(getattr(a, "set", []))
        if a.cmd == "list":
            print("\n".join(experiment_names()))
        elif a.cmd == "check-data":
            print(check_data(a.run, a.data), file=sys.stderr)
        elif a.cmd == "record":
            commands = pathlib.Path(a.commands).read_text().splitlines()
            record(resolve(a.experiment, sets), commands, a.out, a.data)
        elif a.cmd == "train-args":
            out = train_args(resolve(a.experiment, sets), a.data, a.out, a.world, a.device, a.per_process_batch)
        else:  # get
            if a.experiment:
                experiment_path(a.experiment)  # unknown names first
            cfg = resolve_run(a.run, sets) if a.run else resolve(a.experiment, sets)
            values = {**cfg.values, "EXPERIMENT": cfg.name}
            missing = [k for k in a.keys if k not in values]
            if missing:
                raise ConfigError(f"unknown key {missing[0]}")
            if a.run and a.experiment and experiment_path(a.experiment).stem != cfg.name:
                raise ConfigError(f"{a.run} was trained as {cfg.name}, not {a.experiment}")
            out = [values[k] for k in a.keys]
        if a.cmd in ("get", "train-args"):  # NUL-separated
            sys.stdout.write("".join(f"{x}\0" for x in out))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
