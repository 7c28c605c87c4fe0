"""Run fairseq's code in this process and keep what it says: its log lines, formatted as its
console scripts format them, go to a string instead of the terminal.

    with fairseq_log.captured() as log:
        validate.main(cfg)
    text = log.getvalue()

While the block runs, the root logger has only the capturing handler (fairseq's import leaves a
DEBUG handler on stderr: wav2vec2_classification calls ``logging.basicConfig(level=DEBUG)``),
fairseq's loggers log at INFO (whatever a caller set before: tfixup-diagnose quiets them), what
is printed goes to the same string, and warnings (hydra's schema-matching deprecation) are
dropped. Everything is restored afterwards.
"""

import contextlib
import io
import json
import logging
import re
import warnings

FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's own
LOGGERS = ("", "fairseq", "fairseq_cli", "fairseq_tfixup")


@contextlib.contextmanager
def captured():
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter(FORMAT))
    loggers = [logging.getLogger(name) for name in LOGGERS]
    root = loggers[0]
    handlers, levels = root.handlers[:], [lg.level for lg in loggers]
    root.handlers[:] = [handler]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield text
    finally:
        root.handlers[:] = handlers
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# ---------------------------------------------------------------- the one reader of fairseq's logs
#
# fairseq-train/-validate log their progress through loggers named after the stats: ``train_inner``
# (every --log-interval updates), ``valid`` and ``train`` (end of epoch). The line, after the
# logger's name (``| train_inner |``, or ``[train_inner][INFO] -`` under hydra), is either
# --log-format json: ``{"epoch": 1, "update": 0.5, "loss": "9.1", ..., "num_updates": "10"}``
#   (valid/train records prefix their keys: ``valid_loss``, ``train_num_updates``), or
# --log-format simple: ``epoch 001:     10 / 285 loss=9.1, ..., num_updates=10`` (train_inner) and
#   ``epoch 001 | valid on 'valid' subset | loss 8.2 | ... | num_updates 285`` (valid, train).
# ``records`` reads both into the json form (numbers as floats), so every reader here sees one shape.

KINDS = ("train_inner", "valid", "train")
_LINE = re.compile(r"(?:\| (train_inner|valid|train) \| |\[(train_inner|valid|train)\]\[INFO\] - )(.*?)\s*$")
_SIMPLE_INNER = re.compile(r"^epoch (\d+):\s+(\d+) / (\d+) (.*)$")
_SUBSET = re.compile(r"^(?:epoch (\d+) \| )?(?:valid on '([^']*)' subset \| )?(.*)$")


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _simple(kind: str, body: str) -> dict:
    """A --log-format simple line's stats, keyed as the json format keys them."""
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
    """fairseq's ``kind`` records (``train_inner``, ``valid`` or ``train``) in the order logged,
    json or simple format, plain or hydra logging; values as floats where they are numbers."""
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if not m or (m.group(1) or m.group(2)) != kind:
            continue
        body = m.group(3)
        if body.startswith("{"):
            try:
                rec = json.loads(body)
            except ValueError:
                continue  # a line cut short (a killed run)
        else:
            rec = _simple(kind, body)
        out.append({k: _number(v) for k, v in rec.items()})
    return out


def parse_train_log(text: str) -> dict:
    """fairseq-train's records: {"train": train_inner, "valid": valid, "epoch": end-of-epoch train}."""
    return {"train": records(text, "train_inner"), "valid": records(text, "valid"), "epoch": records(text, "train")}


def last_value(text: str, key: str, kinds=KINDS) -> str:
    """The last logged value of ``key`` (unprefixed: ``loss`` also finds ``valid_loss``), or "?"."""
    found = []
    for kind in kinds:
        for line_no, line in enumerate(text.splitlines()):
            m = _LINE.search(line)
            if m and (m.group(1) or m.group(2)) == kind:
                rec = records(line, kind)
                hits = [v for k, v in (rec[0].items() if rec else [])
                        if k == key or (k.partition("_")[2] == key and k.partition("_")[0] in ("valid", "train"))]
                if hits:
                    found.append((line_no, hits[-1]))
    return str(max(found)[1]) if found else "?"
