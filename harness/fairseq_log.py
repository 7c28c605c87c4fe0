"""The one reader of fairseq's logs: its progress records (``records``), what the scripts show of a live training
(``python3 -m harness.fairseq_log quiet``, below), and fairseq's code run in this process with what it says kept:
``with captured() as log: validate.main(cfg)`` puts its log lines, formatted as its console scripts do, into
``log.getvalue()``. While the block runs, the root logger has only the capturing handler (fairseq's import leaves a
DEBUG handler on stderr: wav2vec2_classification calls ``logging.basicConfig(level=DEBUG)``), fairseq's loggers log at
INFO (whatever a caller set: tfixup-diagnose quiets them), prints go to the same string, and warnings (hydra's
schema-matching deprecation) are dropped; all is restored afterwards.
"""

import argparse
import contextlib
import io
import json
import logging
import os
import re
import signal
import sys
import warnings

from harness import cpu_load

# fairseq logs "Please install tensorboardX" on import of its tasks (every command, --help included): nothing
# our users need to act on. Quieted here, where a log is captured at INFO, rather than on every import of
# harness: most of the scripts' short Python steps never import logging (a sixth of their start-up)
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's own
LOGGERS = ("", "fairseq", "fairseq_cli", "fairseq_tfixup")


@contextlib.contextmanager
def captured():
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter(FORMAT))
    loggers = [logging.getLogger(name) for name in LOGGERS]  # the root logger first
    handlers, levels = loggers[0].handlers[:], [lg.level for lg in loggers]
    loggers[0].handlers[:] = [handler]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield text
    finally:
        loggers[0].handlers[:] = handlers
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# fairseq-train/-validate log their progress through loggers named after the stats: ``train_inner`` (every
# --log-interval updates), ``valid`` and ``train`` (end of epoch). The line, after the logger's name
# (``| train_inner |``, or ``[train_inner][INFO] -`` under hydra), is either --log-format json:
# ``{"epoch": 1, "update": 0.5, "loss": "9.1", ..., "num_updates": "10"}`` (valid/train prefix their keys:
# ``valid_loss``, ``train_num_updates``), or --log-format simple: ``epoch 001:     10 / 285 loss=9.1, ...,
# num_updates=10`` (train_inner) and ``epoch 001 | valid on 'valid' subset | loss 8.2 | ... | num_updates 285``
# (valid, train). ``records`` reads both into the json form (numbers as floats): every reader here sees one shape.

KINDS = ("train_inner", "valid", "train")
_LINE = re.compile(r"(?:\| (train_inner|valid|train) \| |\[(train_inner|valid|train)\]\[INFO\] - )(.*?)\s*$")
_SIMPLE_INNER = re.compile(r"^epoch (\d+):\s+(\d+) / (\d+) (.*)$")
_SUBSET = re.compile(r"^(?:epoch (\d+) \| )?(?:valid on '([^']*)' subset \| )?(.*)$")


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _kind_body(line: str):
    """(kind, body) of a progress line (``train_inner``, ``valid`` or ``train``); (None, "") for any other."""
    m = _LINE.search(line)
    return (m.group(1) or m.group(2), m.group(3)) if m else (None, "")


def _stats(kind: str, body: str):
    """A progress line's stats as logged (json's own values, the simple format's strings), keyed as the json
    format keys them; None for a json line cut short (a killed run)."""
    if body.startswith("{"):
        try:
            return json.loads(body)
        except ValueError:
            return None
    m = _SIMPLE_INNER.match(body) if kind == "train_inner" else None
    if m:
        rec = {"epoch": int(m.group(1))}
        for pair in m.group(4).split(", "):
            key, _, value = pair.partition("=")
            rec[key.strip()] = value.strip()
        return rec
    m = _SUBSET.match(body)
    prefix = (m.group(2) or "valid") if kind == "valid" else "train"
    rec = {"epoch": int(m.group(1))} if m.group(1) else {}
    for part in m.group(3).split(" | "):
        key, _, value = part.strip().partition(" ")
        if key:
            rec[f"{prefix}_{key}"] = value
    return rec


def records(text: str, kind: str) -> list:
    """fairseq's ``kind`` records (``train_inner``, ``valid`` or ``train``) in the order logged, json or simple
    format, plain or hydra logging; values as floats where they are numbers."""
    stats = (_stats(kind, body) for found, body in map(_kind_body, text.splitlines()) if found == kind)
    return [{k: _number(v) for k, v in rec.items()} for rec in stats if rec is not None]


def parse_train_log(text: str) -> dict:
    """fairseq-train's records: {"train": train_inner, "valid": valid, "epoch": end-of-epoch train}."""
    return {"train": records(text, "train_inner"), "valid": records(text, "valid"), "epoch": records(text, "train")}


def last_value(text: str, key: str, kinds=KINDS) -> str:
    """The last logged value of ``key`` (unprefixed: ``loss`` also finds ``valid_loss``), or "?"."""
    for line in reversed(text.splitlines()):
        kind, body = _kind_body(line)
        rec = _stats(kind, body) if kind in kinds else None
        hits = [v for k, v in (rec or {}).items()
                if k == key or (k.partition("_")[2] == key and k.partition("_")[0] in ("valid", "train"))]
        if hits:
            return str(_number(hits[-1]))
    return "?"


def last_saved_update(text: str) -> str:
    """The update of the last checkpoint saved ("Saved checkpoint ... (epoch E @ N updates, ..."); "" when none was."""
    found = re.findall(r"@ ([0-9]*) updates", text)
    return found[-1] if found else ""


def last_run(text: str) -> str:
    """The last fairseq-train run's part of a log every run appends to (train.log): from the last config dump on
    (fairseq_cli.train logs one at its start, plain or hydra logging); all of TEXT when there is none."""
    starts = [m.start() for m in re.finditer(r"fairseq_cli\.train \| \{|fairseq_cli.train\].*\{'_name'", text)]
    return text[starts[-1]:] if starts else text


# what fairseq-train's log says when it fails (harness/recover.py turns each into one line and the fix)
NAN = re.compile(r"gradients are Nan/Inf|Minimum loss scale reached|NaN or Inf found in input tensor|"
                 r"loss is nan|FloatingPointError")
DATA = re.compile(r"Dataset not found|Unable to infer|index out of range in self|Tried to load .* but found|"
                  r"No such file or directory: .*\.(idx|bin)|mmap length is greater than file size|"
                  r"buffer is smaller than requested size|cannot mmap an empty file")
CKPT = re.compile(r"Cannot load model parameters from checkpoint|PytorchStreamReader failed|"
                  r"Weights only load failed|UnpicklingError|failed finding central directory")
LOAD_MODEL = re.compile(r"Cannot load model parameters from checkpoint")
SIZE = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from "
                  r"checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")
DISK = re.compile(r"No space left on device|Errno 28|ENOSPC|file write failed|Disk quota exceeded")
# fairseq's batch_by_size: a sentence longer than --max-tokens
TOKENS = re.compile(r"sentence at index \d+ of size \d+ exceeds max_tokens limit of \d+|"
                    r"The dataset is empty\. This could indicate that all elements in the dataset have been skipped")
# the shell could not start the command: too long an argument list (E2BIG), no such program
NOT_RUN = re.compile(r"Argument list too long|fairseq-train: (?:command )?not found")
ARGS = re.compile(r"^\S*(?:fairseq-train|train\.py|__main__\.py): error: (.*)$", re.M)
# the plugin's one-line refusal of a setting or an input (tfixup/errors.py), and an exception's line
REFUSED = re.compile(r"^error: (.*)$", re.M)
EXCEPTION = re.compile(r"^[ \t]*\w*(?:Error|Exception)\b.*:.*$", re.M)


# ``python3 -m harness.fairseq_log quiet [--max-update N] [--max-epoch E]`` (scripts/pipeline-lib.sh's quiet): fairseq's
# output from stdin, each shown line flushed at once (progress must not arrive in blocks; train.log keeps everything),
# less the config dump (~15 KB), the model's structure, data-loader notes, start-up bookkeeping and the dependencies'
# warnings with their source lines. Progress (train_inner, json or simple) is one short line,
#   DATE TIME | epoch E | update N of TOTAL | loss L | lr LR | U updates/s | ETA M min
# a json epoch summary "epoch E done: ..." / "epoch E valid: ..." (a simple one is shown as written). The ETA is at the
# mean rate since the first progress line (each line's "ups" is its interval's alone, which other jobs swing many-fold)
# to MAX_UPDATE, else to the end of epoch MAX_EPOCH (a json line's "update" is epochs done, e.g. 5.645: the total is
# num_updates * MAX_EPOCH / update). Once, a line when the machine became oversubscribed after the training chose its
# threads (harness/cpu_load.py busy_later).

_DROP = re.compile("|".join([
    r"\| \{.?_name.?: ", r"Please install tensorboardX",
    r" \| fairseq\.tasks\.fairseq_task \| ", r" \| fairseq\.data\.iterators \| ",
    # start-up bookkeeping: data loaded, devices, the model's parts
    r" \| INFO \| fairseq\.(data\.data_utils|tasks\.[a-z_]+) \| ",
    r" \| INFO \| fairseq_cli\.train \| (task|criterion|num\. expert model params|training on|max tokens per device"
    r"|begin dry-run|Start iterating)",
    r" \| INFO \| fairseq\.trainer \| (detected shared parameter|Preparing to load checkpoint|loading train data"
    r"|begin training epoch)",
]))
# the model printed by fairseq_cli.train: "... | Name(" then indented lines, then ")"
_MODEL = re.compile(r" \| fairseq_cli\.train \| [A-Za-z0-9_]+\($")
# a dependency's warning: "/.../site-packages/M.py:N: Category: text", more text lines, then its
# source line (indented); "sys:1: ..." ones have none and end at a log line
_WARNING = re.compile(r"^(/[^ ]*site-packages/[^ ]*|sys):[0-9]+: [A-Za-z]*Warning: ")
_WARNING_END = re.compile(r"^([0-9]{4}-[0-9]{2}-[0-9]{2} |Traceback|\[)")
_STAMP = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2} ")
_LEADING_NUMBER = re.compile(r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def _float(value) -> float:
    """VALUE's leading number, 0 when it has none (a field absent or not a number)."""
    m = _LEADING_NUMBER.match(str(value))
    return float(m.group(0)) if m else 0.0


class Screen:
    """The lines shown of one training's output: ``show(line)`` gives the line to show, or None."""

    def __init__(self, max_update: int = 0, max_epoch: int = 0):
        self.max_update, self.max_epoch = max_update, max_epoch
        self.in_model = self.in_warning = False
        # the mean rate: updates and seconds summed over intervals (the first as long as the second)
        self.first_ups = self.prev = self.sum_n = self.sum_t = 0.0
        self.seen = self.said_busy = False

    def show(self, line: str):
        if _DROP.search(line):
            return None
        if _MODEL.search(line):  # the model's structure, to its closing ")"
            self.in_model = True
            return None
        if self.in_model:
            self.in_model = line != ")"
            return None
        if _WARNING.search(line):
            self.in_warning = True
            return None
        if self.in_warning and line.startswith("  "):  # its indented source line ends it
            self.in_warning = False
            return None
        if self.in_warning and _WARNING_END.search(line):  # a warning without one ends at a log line
            self.in_warning = False
        if self.in_warning:
            return None
        kind, body = _kind_body(line)
        rec = _stats(kind, body) if kind == "train_inner" or (kind and body.startswith("{")) else None
        if rec is None:
            return line
        stamp = line[:19] + " | " if _STAMP.search(line) else ""
        field = lambda key: "" if rec.get(key) is None else str(rec[key])
        if kind == "train_inner" and field("num_updates"):
            return stamp + self._progress(rec, field)
        if kind == "train":
            return (f"{stamp}epoch {field('epoch')} done: train loss {field('train_loss')}, "
                    f"{field('train_num_updates')} updates, {field('train_ups')} updates/s")
        if kind == "valid":
            return (f"{stamp}epoch {field('epoch')} valid: loss {field('valid_loss')}" + "".join(
                label.format(field(key)) for key, label in (("valid_bleu", ", BLEU {}"),
                                                            ("valid_best_loss", " (best loss {})")) if field(key)))
        return line

    def _progress(self, rec: dict, field) -> str:
        n, ups = _float(rec["num_updates"]), _float(rec.get("ups"))
        if ups > 0:
            if not self.seen:
                self.seen, self.first_ups = True, ups
            elif n > self.prev:
                if not self.sum_n:
                    self.sum_n, self.sum_t = n - self.prev, (n - self.prev) / self.first_ups
                self.sum_n += n - self.prev
                self.sum_t += (n - self.prev) / ups
            self.prev = n
        rate = self.sum_n / self.sum_t if self.sum_n > 0 else ups
        total, done = self.max_update, _float(rec.get("update"))
        if not total and self.max_epoch > 0 and done > 0:
            total = int(n * self.max_epoch / done + 0.5)
        shown = f"epoch {field('epoch')} | update {int(n) if n.is_integer() else f'{n:.6g}'}"  # 710, not 710.0
        if total > 0:
            shown += f" of {'' if self.max_update > 0 else '~'}{total}"
        labels = (("loss", "loss {}"), ("lr", "lr {}"), ("ups", "{} updates/s"))
        shown += "".join(" | " + label.format(field(key)) for key, label in labels if field(key))
        if total > 0 and rate > 0 and n < total:
            shown += f" | ETA {(total - n) / rate / 60:.0f} min"
        if not self.said_busy and hasattr(os, "getloadavg"):  # other work started after this training: once
            threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
            note = cpu_load.busy_later(os.getloadavg()[0], os.cpu_count() or 1, threads)
            self.said_busy = bool(note)
            shown += f"\n{note}" if note else ""
        return shown


def quiet(max_update: int = 0, max_epoch: int = 0) -> None:
    """stdin -> stdout through a Screen, line by line; bytes that are not UTF-8 pass unchanged. Ends as
    awk would: at a closed pipe or SIGINT, by the signal, with no traceback."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # ignored (a background job): stays so
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape", newline="\n")
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="surrogateescape", newline="\n")
    screen = Screen(max_update, max_epoch)
    for line in iter(stdin.readline, ""):
        shown = screen.show(line.rstrip("\n"))
        if shown is not None:
            stdout.write(shown + "\n")
            stdout.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.fairseq_log",
                                     description="What the scripts show of fairseq's output (stdin -> stdout).")
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quiet", help="short progress lines with an ETA; the rest of fairseq's noise dropped")
    q.add_argument("--max-update", type=int, default=0, help="the run's MAX_UPDATE (0: none)")
    q.add_argument("--max-epoch", type=int, default=0, help="the run's MAX_EPOCH (0: none), for the ETA without one")
    args = parser.parse_args(argv)
    quiet(args.max_update, args.max_epoch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
