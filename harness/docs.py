"""Every number in the docs comes from a results record, and each paragraph names the record.

    python -m harness.docs check [FILE ...]   list each number of the docs that its paragraph's records do not hold
    python -m harness.docs write [FILE ...]   rewrite each generated block of the docs from the records

FILE defaults to README.md, docs/measurements.md and results/diagnostics/README.md. The records: ``results/**/*.json``
(their numbers, list lengths, the numbers of their prose fields, the flag values of their commands), the count of
records in each folder (key ``(count)``), and what a job printed at its end (``results/**/summary.txt``).

A number written by hand sits in a *block* (lines between blank lines: a paragraph, a table, a list without blank
lines) that names where its numbers come from, in a line at its end::

    T-Fixup reaches valid perplexity 39.3, ReZero 41.8 and DyT 52 at 24 layers.
    <!-- numbers: bench/lm.json: headline.*.best_ppl, config.depths -->

Entries are separated by ``;``: a record (a path under results/, globs allowed: ``bench/lm/runs/*.json``), then
after ``: `` the keys of its values (comma-separated, list indices left out, globs allowed; ``best_ppl`` is any key
ending in it; no keys: every value of the record; with indices, the values at those only: ``arms[*].steps[0].mlp``).
A number is *recorded* when one of those values, rounded to the precision the doc shows, is the number (``8.22`` for
8.2237; ``1.91 %`` for 0.0191, or for 1.91 at a key naming a percent or in prose followed by ``%``; ``0.88M`` for
876,032; ``10.3-10.6 min`` and ``20 min 45 s`` for a time key's value, read in the unit its name says: seconds
(wall_s, s_per_update), minutes (train_wall_min), hours (train_wall_hours); a perplexity also for 2 ** a loss in
bits), or "X of Y runs": a study's runs recorded and planned. A source that would also take every number whose last
digit differs from the shown one by 1 to 5 (a whole trace or curve) is too wide: such a number fails until its block
names the keys it comes from. A block whose source line also says ``derived`` may show the difference, ratio or mean
of the values behind two recorded numbers of it, at the precision shown (``+16.5 BLEU (30.7 vs 14.2)``; not a
duration or a percentage). Any other number is not recorded, whatever the records hold: one in a block with no
source line, one its named records do not hold, an invented one, one whose record changed under it.

A generated block, ``<!-- generated: python -m harness.docs write (studies) -->`` ... ``<!-- end generated -->``, is
written from the records by ``write`` (atomically, in place) and not checked number by number. Exempt, and nothing
else: code (fenced and indented blocks, `spans`: commands, flags, paths), link targets, comments, dates and times of
day, version numbers, years of citations, section/table/figure numbers, a model's sizes written D-F-H (128-256-4),
the 95 % of an interval, the paper's constants (``PAPER_CONSTANTS``) and the exponents of its rules (``^-1/4``).
tests/test_doc_numbers.py runs ``check`` on the docs: each unrecorded number, its file:line, why, and the record
values near it.
"""

import argparse
import bisect
import collections
import decimal
import fnmatch
import functools
import json
import math
import os
import pathlib
import re
import sys
from typing import Dict, List, NamedTuple, Optional

from harness.bench import common
from tfixup import atomic, tfixup_init

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
DOCS = ("README.md", "docs/measurements.md", "results/diagnostics/README.md")

# T-Fixup's constants (tfixup_init: 0.67 N^-1/4, (9N)^-1/4; a single stack's (6N)^-1/4), its schedule's
# default P = 4000, and the sqrt(2) of fairseq's v_proj gain: the paper's numbers, not measurements
PAPER_CONSTANTS = {tfixup_init.ENCODER_CONSTANT, 9, 6, 4000, 2}


class Value(NamedTuple):
    value: float
    source: str  # file:key path


def _walk(obj, path: str):
    """(|number|, its key path) of each number of a record: its numbers and list lengths, the numbers of its prose
    and the flag values of its commands."""
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        if math.isfinite(obj):
            yield abs(float(obj)), path
    elif isinstance(obj, str):
        if path.rsplit(".", 1)[-1].endswith("command"):  # a command: the values of its flags (--lr 5e-4)
            found = [(num, "") for num in re.findall(r"--[\w-]+[ =]'?\(?([-+]?\d[\d.]*(?:e[-+]?\d+)?)", obj)]
        else:  # prose ("29000 lines ... 1.91% of valid tokens"), a count as text ("0/3"), a number as text; not ids,
            # hashes or paths
            found = (re.findall(r"(?<![\w.])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)( ?%)?", obj)
                     if " " in obj or re.fullmatch(r"\d+(?:\.\d+)?(?:/\d+)?", obj.strip()) else [])
        # a number of prose followed by "%" is a percentage as it is shown (1.91% of tokens)
        yield from ((abs(float(num)), path + (" (percent)" if pct else "")) for num, pct in found)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        yield float(len(obj)), f"{path} (length)"
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")


_RECORDS: dict = {}  # results folder -> [the stat of its records, their values, a pool of them all once asked for]


def record_values(results: pathlib.Path = RESULTS, every: bool = False):
    """record file (relative to the repo) -> key (list indices left out) -> its numbers (a folder of records also has
    their count: FOLDER/*.json, key (count)), read again when a record changes; EVERY: a pool of all of them."""
    files = sorted([*results.rglob("*.json"), *results.rglob("summary.txt")])
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    if _RECORDS.get(results, (None,))[0] != stamp:
        out: Dict[str, Dict[str, List[Value]]] = {}
        for f in files:
            rel = str(f.relative_to(results.parent))
            if f.name == "summary.txt":  # what a job printed at its end (the main job's wall time)
                vals = [Value(float(m.group()), f"{rel}:{line.strip()[:60]}") for line in f.read_text().splitlines()
                        for m in re.finditer(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", line)]
            else:
                try:
                    data = json.loads(f.read_text())
                except ValueError:
                    continue
                vals = [Value(v, f"{rel}:{key}") for v, key in _walk(data, "")]
            for v in vals:
                out.setdefault(rel, {}).setdefault(key_of(v), []).append(v)
        for folder in sorted({f.parent for f in files if f.suffix == ".json"}):
            rel = f"{folder.relative_to(results.parent)}/*.json"
            out[rel] = {"(count)": [Value(float(len(list(folder.glob("*.json")))), f"{rel}:(count)")]}
        _RECORDS[results] = [stamp, out, None]
    held = _RECORDS[results]
    if every and held[2] is None:
        held[2] = pool_of([v for by_key in held[1].values() for vals in by_key.values() for v in vals])
    return held[2] if every else held[1]


def planned(res: dict) -> int:
    """The runs a study report plans: its own count, in whichever field the study keeps it."""
    return (res.get("runs_planned") or res.get("config", {}).get("n_runs") or res.get("n_runs")
            or res["runs_recorded"])


class Number(NamedTuple):
    file: str
    line: int
    text: str  # as shown, with its unit
    value: float
    error: float  # half a unit of its last digit
    scale: tuple  # what a record value is multiplied by to read as shown (1, 100 for %, 1/60 for min, ...)
    para: int  # block of the file (lines between blank lines: a paragraph, a table, a list without gaps)
    source: tuple  # the block's <!-- numbers: ... --> line, parsed: ((record glob, (key patterns)), ...)
    runs: tuple = ()  # "X of Y runs": (X, Y), a study's runs recorded and planned
    perplexity: bool = False  # a perplexity: also 2 ** a loss in bits
    time: bool = False  # a duration (s, min, h)
    percent: bool = False  # a percentage: a fraction x 100, or a value as it is from a key naming a percent


GENERATED = re.compile(r"<!-- generated: (.*?) -->\n.*?<!-- end generated -->", re.S)
# a block's source, on a line of its own: the records (paths under results/, globs allowed) and the keys its
# numbers come from (not one shown in `code`, as this project's docs show the rule)
SOURCE = re.compile(r"^[ \t]*<!-- numbers: (.*?) -->", re.S | re.M)
_CODE_SPAN = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")  # Markdown's: it may wrap, within a paragraph
_LINK_TARGET = re.compile(r"\]\([^)]*\)|https?://\S+|<!--.*?-->")
_EXEMPT = [
    re.compile(r"\b\d{4}-\d{2}-\d{2}(?:/\d{2})?(?:T[\d:+]*)?"),  # dates (2026-11-22/23)
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:-\d{1,2}:\d{2})?"),  # times of day
    re.compile(r"\b\d+\.\d+\.\d+(?:\.\d+)?(?:\+\w+)?"),  # versions a.b.c
    re.compile(r"(?i:python|torch|fairseq|pip|numpy|matplotlib|omegaconf|version|bash)[ <>=]*"
               r"\d+(?:\.\d+)*(?:-\d+(?:\.\d+)*)?"),  # versions: Python 3.8-3.12, pip < 26.2, fairseq 0.12
    re.compile(r"(?:ICML|ICLR|EMNLP|NeurIPS|ACL|al\.,?) \d{4}"),  # citations' years
    re.compile(r"(?:§|Tables? |Fig\. |Figure |Section |Algorithm |#|issue #)\d+(?:\.\d+)*[a-z]?"
               r"(?:[-–]\d+[a-z]?)?"),  # section, table and figure numbers
    re.compile(r"^#+ \d+\."),  # a numbered heading
    re.compile(r"\^\(?[-−]?\d+/\d+\)?"),  # exponents of the paper's rules: ^-1/4, ^(-1/2)
    re.compile(r"[A-Za-z]+'\d+"),  # corpora: IWSLT'14, WMT'17
    re.compile(r"(?<![\w.])\d+-\d+-\d+(?![\w.])"),  # a model's sizes, embed-FFN-heads (128-256-4), as in commands
    re.compile(r"\b95 ?% (?=paired[- ]bootstrap|confidence|interval)"),  # the convention of an interval
]
_NUMBER = re.compile(
    r"(?<![\w.\d/])[+\-−]?(?P<num>\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"(?P<unit>\s?(?:%|x\b|×|M\b|k\b|K\b|min\b|h\b|hours?\b|s\b))?(?![\w])")
_MIN_S = re.compile(r"(?<![\w.])(\d+) min (\d+) s\b")
_RUNS = re.compile(r"(?<![\w.])(\d+) of (\d+)(?: runs\b)")
# what a record value is multiplied by to read in a unit: seconds as minutes or hours, a fraction as percent
# (a time's record values are in seconds here: pool_of reads each in the unit its key names)
_SCALES = {"%": (100.0, 1.0), "M": (1e-6,), "k": (1e-3,), "K": (1e-3,), "min": (1 / 60,),
           "h": (1 / 3600,), "hour": (1 / 3600,), "hours": (1 / 3600,)}


def _blank(text: str, pattern) -> str:
    """TEXT with every match of PATTERN replaced by spaces (positions kept)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def doc_text(text: str) -> str:
    """The prose of a Markdown text, positions kept: code, links, comments, generated blocks, exempt numbers blanked."""
    lines, fence, prev_blank, indented = _blank(_blank(text, GENERATED), SOURCE).split("\n"), False, True, False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = not fence
            lines[i] = ""
            continue
        indented = line.startswith("    ") and (indented or prev_blank) and not re.match(r"\||[-*] ", line.lstrip())
        if fence or indented:
            lines[i] = ""
            continue
        prev_blank = not line.strip()
    text = "\n".join(lines)
    for pattern in (_CODE_SPAN, _LINK_TARGET, *_EXEMPT):
        text = _blank(text, re.compile(pattern.pattern, pattern.flags | re.M))
    return text


def parse_source(spec: str) -> tuple:
    """'bench/lm.json: best_ppl, ratio_to_baseline; main-job/summary.txt' -> ((record glob, key patterns), ...):
    records are paths under results/ (globs allowed); no keys: every value of the record."""
    out = []
    for entry in filter(None, (" ".join(e.split()) for e in spec.split(";"))):
        path, _, keys = entry.partition(": ")
        out.append((re.sub(r"^results/", "", path.strip().rstrip(":")),
                    tuple(k.strip() for k in keys.split(",") if k.strip())))
    return tuple(out)


def numbers(path: pathlib.Path, rel: str) -> List[Number]:
    """The numbers of a doc (REL: its name in messages) that need a record, each with its block's source."""
    raw = path.read_text(encoding="utf-8")
    # blocks: runs of lines that are not blank in the doc as written; a source line (anywhere in a block, usually
    # its last line) names the block's records
    block_of, block, prev_blank = [], 0, True
    for line in raw.split("\n"):
        block += bool(line.strip()) and prev_blank  # a line after a blank one starts a block
        block_of.append(block)
        prev_blank = not line.strip()
    sources: Dict[int, tuple] = {}
    for m in SOURCE.finditer(raw):
        b = block_of[raw.count("\n", 0, m.start())]
        sources[b] = sources.get(b, ()) + parse_source(m.group(1))
    out = []
    for i, line in enumerate(doc_text(raw).split("\n")):
        keep = dict(file=rel, line=i + 1, para=block_of[i], source=sources.get(block_of[i], ()))
        for pattern in (_RUNS, _MIN_S):  # 33 of 55 runs: a study's count; 20 min 45 s: seconds
            for m in pattern.finditer(line):
                a, b = int(m.group(1)), int(m.group(2))
                out.append(Number(text=m.group(), error=0.5, scale=(1.0,), **keep, **(
                    dict(value=float(b), runs=(a, b)) if pattern is _RUNS else dict(value=60.0 * a + b, time=True))))
            line = _blank(line, pattern)
        found = list(_NUMBER.finditer(line))
        for m, nxt in zip(found, found[1:] + [None]):
            num, unit = m.group("num"), (m.group("unit") or "").strip()
            if not unit and nxt and nxt.group("unit") and re.fullmatch(r" ?[-–] ?", line[m.end():nxt.start()]):
                unit = nxt.group("unit").strip()  # a range, 10.3-10.6 min: the unit of both ends
            value = float(num.replace(",", ""))
            if value in PAPER_CONSTANTS:
                continue
            ppl = re.search(r"perplexit(?:y|ies)(?: of)? ?(?:[\d.]+ ?[-–] ?)?$", line[:m.start()][-30:])
            mantissa, _, exp = num.partition("e")  # 5e-4, 2.8e-4: half a unit of the mantissa's last digit
            error = 0.5 * 10 ** (int(exp or 0) - len(mantissa.partition(".")[2]))
            out.append(Number(text=m.group().strip(), value=value, error=error, scale=_SCALES.get(unit, (1.0,)),
                              perplexity=bool(ppl), time=unit in ("s", "min", "h", "hour", "hours"),
                              percent=unit == "%", **keep))
    return out


def shown_as(v: float, n: Number) -> bool:
    """V, rounded to the digits N shows, is N (rounding half up, or as Python formats V)."""
    if "e" in n.text:  # as many significant digits as the mantissa shows
        digits = len(re.sub(r"\D", "", n.text.split("e")[0].lstrip("+-−0"))) or 1
        return f"{v:.{digits - 1}e}" == f"{n.value:.{digits - 1}e}"
    k = max(0, round(-math.log10(2 * n.error)))
    want = f"{n.value:.{k}f}"
    half_up = decimal.Decimal(repr(v)).quantize(decimal.Decimal(1).scaleb(-k), decimal.ROUND_HALF_UP)
    return f"{v:.{k}f}" == want or f"{half_up:.{k}f}" == want


# a record's key that holds a time: wall_s, train_wall_hours, s_per_update, QUICKSTART_WALL (not "admin", not
# ratio_min); in hours where it names them (train_wall_hours, cpu_hours), minutes (train_wall_min), else seconds
_TIME_KEY = re.compile(r"(?:wall|times?|seconds?|hours?|minutes?|_s|(?:^|[._])s_per|duration)(?![a-z])", re.I)
_HOURS_KEY, _MINUTES_KEY = re.compile(r"hours?(?![a-z])", re.I), re.compile(r"(?:minutes?|wall_min)(?![a-z])", re.I)
# a record's key that holds a percentage as it is shown (unk_rate_percent); any other value reads as a fraction
_PERCENT_KEY = re.compile(r"percent|pct", re.I)


def pool_of(values: List[Value]) -> dict:
    """The record values a doc's numbers are looked up in: {False: (them sorted by value, their values for bisect),
    True: the same of the values that hold a time (``_TIME_KEY``), in seconds}; a number reads pool[n.time]."""
    values, times = sorted(values), []
    for v in values:
        key = v.source.split(":", 1)[-1]
        if _TIME_KEY.search(key):
            times.append(v._replace(value=v.value * (3600.0 if _HOURS_KEY.search(key) else
                                                     60.0 if _MINUTES_KEY.search(key) else 1.0)))
    times.sort()
    return {False: (values, [v.value for v in values]), True: (times, [v.value for v in times])}


def matches(n: Number, pool: dict) -> List[Value]:
    """The record values (sorted by value) that N shows, in any of its unit readings; a time (s, min, h) only
    from a record of time (its key names it: wall_s, train_wall_hours, ...)."""
    values, keys = pool[n.time]
    tol = n.error * 1.01
    # (scale, the range of record values it reads as N): each unit's; a perplexity's, None: 2 ** (a loss in bits),
    # fairseq's definition
    readings = [(s, (n.value - tol) / s, (n.value + tol) / s) for s in n.scale]
    if n.perplexity and n.value > n.error:
        readings.append((None, math.log2(n.value - tol), math.log2(n.value + tol)))
    return [values[i] for s, lo, hi in readings
            for i in range(bisect.bisect_left(keys, lo - 1e-12), bisect.bisect_right(keys, hi + 1e-12))
            if shown_as(2 ** keys[i] if s is None else keys[i] * s, n)
            and (s != 1.0 or not n.percent or _PERCENT_KEY.search(values[i].source))]


def derived(n: Number, operands: List[List[Value]]) -> bool:
    """N is the difference, the ratio or the mean of the record values behind two numbers of its block
    (``+16.5 BLEU (30.7 vs 14.2)``, ``mean +2.54``); not a duration or a percentage."""
    if n.time or 100.0 in n.scale:
        return False  # a duration or a percentage is measured, not a sum of the paragraph's numbers
    # a mean only at two significant digits or more: of 5e-4 and 1e-7, 3e-4 would be one
    mean = len(re.sub(r"\D", "", n.text.split("e")[0]).lstrip("0")) >= 2
    vals = sorted({v.value for found in operands for v in found[:8]})
    near = lambda x: abs(x - n.value) <= n.error * 1.01 + 1e-12 and shown_as(x, n)  # noqa: E731
    return any(a != b and (near(abs(a - b)) or (b and near(a / b)) or (mean and near((a + b) / 2)))
               for a in vals for b in vals)


_KEY_RE = re.compile(r"\[\d+\]| \(percent\)$")


def key_of(v: Value) -> str:
    """A value's key in its record, list indices left out: rows[3].best_ppl -> rows.best_ppl."""
    return _KEY_RE.sub("", v.source.partition(":")[2])


@functools.lru_cache(maxsize=None)
def _keys_re(patterns: tuple) -> re.Pattern:
    """One regex for PATTERNS (fnmatch's): a key that is a pattern, or ends in "." and one (a check matches
    hundreds of thousands of keys: fnmatch's call per key and pattern was most of its time)."""
    return re.compile("|".join(r"(?s:.*\.)?" + fnmatch.translate(p) for p in patterns))


def _key_matches(key: str, patterns: tuple) -> bool:
    return not patterns or _keys_re(patterns).match(key) is not None


_INDEX_RE = re.compile(r"\[(\d+|\*)\]")


def _at_index(v: Value, pattern: str) -> bool:
    """Whether V's key, its list indices kept, is PATTERN's: ``arms[*].steps[0].attention`` names the first step's
    values of every arm (a key's last index may be left out: ``steps[0].attention`` is its whole list)."""
    raw = v.source.partition(":")[2]
    glob = _INDEX_RE.sub(lambda m: "[[]" + m.group(1) + "[]]", pattern)
    return any(_keys_re((glob,)).match(k) for k in (raw, re.sub(r"\[\d+\]$", "", raw)))


def source_pool(records: Dict[str, Dict[str, List[Value]]], source: tuple) -> dict:
    """The values a block's source names: its records' values at its keys."""
    out = []
    for glob, keys in source:
        plain = tuple(k for k in keys if not _INDEX_RE.search(k))
        for f, by_key in records.items():
            if fnmatch.fnmatchcase(f, "results/" + glob):
                if not keys or plain:
                    out.extend(v for k, vals in by_key.items() if _key_matches(k, plain) for v in vals)
                for p in (k for k in keys if _INDEX_RE.search(k)):  # a key with list indices: at those indices only
                    out.extend(v for k, vals in by_key.items() if _key_matches(k, (_INDEX_RE.sub("", p),))
                               for v in vals if _at_index(v, p))
    return pool_of(out)


def unrecorded(files=DOCS, repo: pathlib.Path = REPO) -> List[tuple]:
    """(number, why, nearest record values) for every number of FILES that its block's source does not hold."""
    records = record_values(repo / "results")
    reports = [json.loads(p.read_text()) for p in sorted((repo / "results" / "bench").glob("*.json"))]
    counts = [(res["runs_recorded"], planned(res)) for res in reports if "runs_recorded" in res]  # of every study
    pools: Dict[tuple, dict] = {}
    out, every = [], None
    for rel in files:
        nums = numbers(repo / rel, str(rel))
        for source in {n.source for n in nums} - pools.keys():
            pools[source] = source_pool(records, source)
        found = [[] if n.runs else matches(n, pools[n.source]) for n in nums]
        for n, held in zip(nums, found):
            pool = pools[n.source]
            if n.runs:
                if n.runs not in counts:
                    out.append((n, "no study has these counts",
                                [Value(float(c[1]), f"a study: {c[0]} of {c[1]} runs") for c in counts]))
                continue
            if held and _loose(n, pool):
                out.append((n, "its block's source would take any number like it (its last digit 1 to 5 up or "
                               "down too): name the keys it comes from", held[:3]))
            if held or (("derived", ()) in n.source
                        and derived(n, [f for m, f in zip(nums, found) if m.para == n.para])):
                continue
            if not n.source:
                why = "its block has no <!-- numbers: RECORD: KEY --> line"
            else:
                why = "not in its block's source (" + "; ".join(
                    f"{g}: {', '.join(k)}" if k else g for g, k in n.source) + ")"
            if every is None:  # read once, when a number first needs it
                every = record_values(repo / "results", every=True)
            seen: dict = {}  # a few of the values it shows elsewhere, from different records and keys
            for v in matches(n, every):
                seen.setdefault((v.source.split(":", 1)[0], key_of(v)), v)
            values, keys = pool[n.time]  # else the 3 values of its source nearest it
            i = bisect.bisect_left(keys, n.value)
            near = sorted(values[max(0, i - 3):i + 3], key=lambda v: abs(v.value - n.value))[:3]
            out.append((n, why, list(seen.values())[:3] or near))
    return out


def _loose(n: Number, pool: dict) -> bool:
    """Whether POOL takes every number shown like N whose last digit differs from N's by 1 to 5: a source so wide
    (a long curve, a whole trace) that an invented number would pass; the block must name the keys instead."""
    step = 2 * n.error
    return all(matches(n._replace(value=n.value + k * step), pool) for k in (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5))


def report(found: List[tuple]) -> str:
    return "\n".join(f"{n.file}:{n.line}: {n.text}: {why}; records with values near it: "
                     + ("; ".join(f"{v.value:g} ({v.source})" for v in near) or "none") for n, why, near in found)


FIX = ("name the record and key each number comes from in a line '<!-- numbers: bench/STUDY.json: KEY, KEY; "
       "bench/STUDY/runs/*.json: KEY -->' at the end of its paragraph or table (paths under results/, globs "
       "allowed; '; derived' for a difference or ratio of its numbers; harness/docs.py says more), put the "
       "number in a generated block ('python -m harness.docs write' fills it), or take it out")


def block_studies(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """Each study (results/bench/STUDY.json beside STUDY/runs/): runs recorded, runs planned, complete or PARTIAL."""
    rows = []
    for p in sorted((results / "bench").glob("*.json")):
        if (results / "bench" / p.stem / "runs").is_dir():
            res = json.loads(p.read_text())
            state = "complete" if res["runs_recorded"] >= planned(res) else "**PARTIAL**"
            link = os.path.relpath(p.with_suffix(".md"), doc_dir)
            rows.append([p.stem, res["runs_recorded"], planned(res), f"[{state}]({link})"])
    return common.md_table(["study", "runs recorded", "of", "report"], rows)


def _load(results: pathlib.Path, stem: str) -> dict:
    path = results / "bench" / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _x(v, fmt: str = "{:.2f}x") -> str:
    """V as a ratio (or in FMT: a gap is "{:+.1f}"); '-' for none."""
    return "-" if v is None else fmt.format(v)


def block_headline(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """T-Fixup against each baseline (on its better schedule) in every study: convergence at the paper's lr (updates
    ratio), 10-epoch quality (BLEU gap), each at its own best lr (updates ratio, lrs) and plateau (sacreBLEU gaps)."""
    from tfixup import methods
    conv, qual, lr, plat = (_load(results, s) for s in ("convergence", "quality", "lr", "plateau"))
    c5 = conv.get("per_method", {}).get("main lr 0.0005", {})
    q = qual.get("per_method", {}).get("multi30k", {})
    lrp = lr.get("parts", {}).get("translation", {})
    lr_methods = lrp.get("methods", {})
    gaps = {}
    for g in plat.get("gaps", []):
        gaps.setdefault(g["baseline"].split("-")[1], []).append(g["gap"])
    headers = ["baseline (its better schedule; Post-LN and Pre-LN: the better of two inits)",
               f"convergence, lr 5e-4: T-Fixup's updates to its best{_partial(conv)}",
               f"quality, Multi30k, 10 epochs: T-Fixup's BLEU gain{_partial(qual)}",
               f"each at its best lr: T-Fixup's updates{_partial(lr)}",
               f"lrs it trains at (T-Fixup: {_range(lr_methods.get('tfixup'))})",
               f"plateau: T-Fixup's sacreBLEU gain{_partial(plat)}"]
    def cells(name):
        """Its cells (conv ratio, BLEU gain, best-lr ratio + open, lr range, plateau gains) and, per column, how
        strong the baseline was there (lower = stronger: its best valid loss; T-Fixup's BLEU gain over it; T-Fixup's
        mean plateau gain over it)."""
        cm, qm = c5.get(name), q.get(name)
        ca = cm["arms"][cm["better"]] if cm else {}
        qa = qm["arms"][qm["better"]] if qm else {}
        # its better schedule in the lr study too: the arm (with or without warmup) of the lower best valid loss
        ran = [a for a in (name, name + "_matched") if a in lr_methods]
        arm = min(ran, key=lambda a: lr_methods[a].get("best_valid_mean") or math.inf, default=None)
        lm_ = lr_methods.get(arm)
        best = lrp.get("versus", {}).get(arm, {}).get("ratio_mean")
        pg = gaps.get(name + "_matched") or gaps.get(name)
        # a ratio of a grid still growing, or of fewer seeds at its best lr than the study plans, is partial
        got, planned_seeds = len((lm_ or {}).get("best_lr_seeds") or []), len(lr.get("config", {}).get("seeds") or [])
        mark = (" (open)" if lm_ and not lm_.get("grid_closed") else
                f" ({got} of {planned_seeds} seeds)" if best is not None and got < planned_seeds else "")
        out = [(_x(ca.get("ratio_mean")), ca.get("baseline_best_valid_mean")),
               (_x(qa.get("tfixup_gap"), "{:+.1f}"), qa.get("tfixup_gap")),
               (_x(best) + mark, lm_.get("best_valid_mean") if best is not None else None),
               (_range(lm_), lm_.get("best_valid_mean") if lm_ else None),
               (" / ".join(_x(v, "{:+.1f}") for v in pg) if pg else "-", sum(pg) / len(pg) if pg else None)]
        return out, any(v is not None for v in (ca.get("ratio_mean"), qa.get("tfixup_gap"), best, pg))

    def better_of(own, small):
        """Each column against the stronger of the two initialisations, the other's figure beside it."""
        out = []
        for (c0, k0), (c1, k1) in zip(own, small):
            if k1 is None or (k0 is not None and k0 <= k1):
                out.append(c0 + (f" (small init: {c1})" if k1 is not None else " (fairseq's init; small init not run)"
                                 if k0 is not None else ""))
            else:
                out.append(c1 + " (small init" + (f"; fairseq's init: {c0})" if k0 is not None else ")"))
        return out

    rows = []
    for name, m in methods.METHODS.items():
        if methods.is_tfixup(name) or name in methods.ABLATIONS or name.endswith("_si"):
            continue  # T-Fixup's variants are in README's own paragraph; a small-init row is in its base's row
        own, ran = cells(name)
        # Post-LN, Pre-LN: fairseq's init or transformers' N(0, 0.02)
        small, ran_si = cells(name + "_si") if name + "_si" in methods.METHODS else (None, False)
        if ran or ran_si:
            rows.append([m.label, *(better_of(own, small) if ran_si else [c for c, _ in own])])
    return common.md_table(headers, rows)


def _partial(res: dict) -> str:
    """' (PARTIAL: X of Y runs)' for a study report that lacks runs of its plan, else ''."""
    if not res or res["runs_recorded"] >= planned(res):
        return ""
    return f" (PARTIAL: {res['runs_recorded']} of {planned(res)} runs)"


def _range(m) -> str:
    if not m or not m.get("lr_range"):
        return "-"
    lo, hi = m["lr_range"]
    return f"{lo:g}-{hi:g}" + ("" if m.get("grid_closed") else "+")


def block_beyond(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """One line per HuggingFace family of the hf study (results/bench/hf.json): T-Fixup against the stock model,
    translation in test BLEU beside the fairseq plugin, the language models at each recorded depth in best valid
    perplexity (every seed; a diverged run says so) and T-Fixup's updates to the warmup baseline's best."""
    from harness.bench import hf
    res = _load(results, "hf")
    planned_ = collections.Counter(s["family"] for s in hf.make_specs(res["config"])  # the lr grid: block_llama's
                                   if not s.get("lr_in_id")) if res else {}
    report = f" ([report]({os.path.relpath(results / 'bench' / 'hf.md', doc_dir)}))"

    def value(r, key):
        if r["status"] == "nan":
            return f"diverged (not finite after update {r['updates']})"
        return f"{r[key]:.1f}" if r["status"] == "ok" and r.get(key) is not None else r["status"]

    def cells(at, key):
        """Each arm's values of KEY in the runs AT (sorted by seed)."""
        per_arm = [(spec.label, [value(r, key) for r in at if r["arm"] == a]) for a, spec in hf.ARMS.items()]
        return "; ".join(f"{label}: {' / '.join(vals)}" for label, vals in per_arm if vals)

    lines = []
    for fam, name in hf.FAMILIES.items():
        rows = sorted((r for r in res.get("rows", []) if r["family"] == fam and not r.get("lr_in_id")),
                      key=lambda r: r["seed"])
        head = f"- **{name}**"
        if not rows:
            how = os.path.relpath(results.parent / "docs" / "beyond-fairseq.md", doc_dir)
            lines.append(f"{head}: no run recorded yet ([the study]({how}#the-evidence-study-harnessbenchhfpy)).")
            continue
        part = "" if len(rows) >= planned_.get(fam, 0) else f" (PARTIAL: {len(rows)} of {planned_[fam]} runs)"
        if fam == "marian":
            depth = max(r["layers"] for r in rows)
            key = "test_bleu_detok" if all(r.get("test_bleu_detok") is not None for r in rows) else "test_bleu_tok"
            what = "test sacreBLEU" if key == "test_bleu_detok" else "test BLEU (tokenized)"
            fs = res.get("fairseq") or {}
            tail = " (the fairseq plugin, same recipe: " + ", ".join(
                f"{hf.ARMS[a].label.split(',')[0].replace('stock', 'Post-LN')} {v[key]:.1f}"
                for a, v in fs.items()) + ")" if fs else ""
            lines.append(f"{head}, {depth}+{depth} layers, {what}: {cells(rows, key)}{tail}{part}{report}.")
            continue
        what = "masked-token valid perplexity" if fam == "bert" else "best valid perplexity"
        per_depth = []
        for depth in sorted({r["layers"] for r in rows}):
            at = [r for r in rows if r["layers"] == depth]
            tail = ""
            for arm, who in (("tfixup", "T-Fixup"), ("tfixup_mlpnorm", "T-Fixup with the gated MLPs' norm kept")):
                ratios = [r["ratio_to_baseline"] for r in at
                          if r["arm"] == arm and r.get("ratio_to_baseline") is not None]
                if ratios:
                    tail += (f"; {who} reaches the warmup baseline's best in "
                             f"{' / '.join(f'{v:.2f}x' for v in ratios)} of its updates")
            per_depth.append(f"{depth} layers: {cells(at, 'best_ppl')}{tail}")
        lines.append(f"{head}, {what}. {'. '.join(per_depth)}{part}{report}.")
    return "\n".join(lines)


def block_llama(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """The table a LLaMA user reads: each method at its own best lr on the hf study's 24-layer Llama
    (harness/bench/hf.py's llama_question, kept in results/bench/hf.json), its verdict and the figure."""
    from harness.bench import hf
    res = _load(results, "hf")
    q = res.get("llama_question") or {}
    report = os.path.relpath(results / "bench" / "hf.md", doc_dir)
    if not any(m["seeds"] for m in q.values()):
        return f"No run of the LLaMA question recorded yet ([the study]({report}))."
    return (common.md_table(hf.LLAMA_COLUMNS, hf.llama_table(q)) + f"\n\n{hf.llama_verdict(q)} ([report]({report}))"
            f"\n\n![each method at its best lr]({os.path.relpath(results / 'bench' / 'hf.png', doc_dir)})")


def block_llama_verdict(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """The front page's line on the LLaMA question: block_llama's verdict, linking to its table."""
    from harness.bench import hf
    res = _load(results, "hf")
    q, grid = res.get("llama_question") or {}, res.get("config", {}).get("lm", {}).get("lr_grid") or {}
    table = os.path.relpath(REPO / "docs" / "measurements.md", doc_dir)
    return (f"**Each method at its own best learning rate on a {grid.get('depth', '?')}-layer Llama** "
            f"([the table]({table}#from-the-front-page-huggingface-models-and-the-llama-question)): "
            f"{hf.llama_verdict(q) if q else 'no run recorded yet.'}")


def block_budgets(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """T-Fixup's headline ratios at two budgets or more: the convergence study's against the better Post-LN baseline
    (every run cut at each budget; the long runs to theirs) and the lr study's against each method at its best lr
    (both runs cut at half the budget), each with how many of the baseline's runs were still improving at its end."""
    from harness.bench import convergence
    conv, lr = _load(results, "convergence"), _load(results, "lr")
    rows = []
    for key, h in conv.get("headline", {}).items():
        b = h.get("better_baseline")
        if not b:
            continue
        at = h.get("at_budget", {})
        cells = "; ".join(f"{n}: {_x(v['per_baseline'][b].get('ratio_mean'))}" for n, v in at.items()
                          if b in v["per_baseline"])
        pb = h["per_baseline"][b]
        rows.append([f"convergence, {key}", convergence.ARMS[b].label if b in convergence.ARMS else b,
                     f"{pb.get('baseline_still_improving', '-')}/{pb['baseline_seeds']}", cells or "-"])
    for part, p in lr.get("parts", {}).items():
        for arm, v in p.get("versus", {}).items():
            pairs = [x for x in v["pairs"] if x.get("ratio") is not None]
            halves = [x["ratio_at_half_budget"] for x in pairs if x.get("ratio_at_half_budget") is not None]
            if not pairs:
                continue
            m = p["methods"][arm]
            improving = sum(bool(x.get("method_still_improving")) for x in pairs)
            half = pairs[0].get("half_budget")
            cells = (f"{half}: {_x(sum(halves) / len(halves))}; " if halves and half else "") + \
                f"{p['config']['updates']}: {_x(v['ratio_mean'])}"
            rows.append([f"each at its best lr, {part}", f"{m['label']} (lr {m['best_lr']:g})",
                         f"{improving}/{len(pairs)}", cells])
    return common.md_table(["study, runs", "baseline", "still improving at the end",
                            "T-Fixup's ratio at each budget (updates: ratio)"], rows)


def block_main_job(results: pathlib.Path, doc_dir: pathlib.Path) -> str:
    """The main job's time and results, from the record it wrote itself (results/main-job/record.json)."""
    from harness import main_job
    return main_job.readme_block(results, doc_dir)


# name -> the function that makes a block from the records (RESULTS, the folder of the doc it goes in)
BLOCKS = {"studies": block_studies, "headline": block_headline, "beyond": block_beyond, "llama": block_llama,
          "llama-verdict": block_llama_verdict, "budgets": block_budgets, "main-job": block_main_job}


def render(text: str, results: pathlib.Path = RESULTS, doc_dir: pathlib.Path = REPO) -> str:
    """TEXT with every generated block made again from the records."""
    def one(m):
        names = re.findall(r"\(([\w-]+)\)", m.group(1))
        if not names or names[0] not in BLOCKS:
            raise ValueError(f"generated block '{m.group(1)}': name one of {', '.join(BLOCKS)} in parentheses")
        return f"<!-- generated: {m.group(1)} -->\n{BLOCKS[names[0]](results, doc_dir)}\n<!-- end generated -->"
    return GENERATED.sub(one, text)


def write(files=DOCS, repo: pathlib.Path = REPO, dry_run: bool = False) -> List[str]:
    """Rewrite the generated blocks of FILES in place (atomically; not on a DRY_RUN); the files that changed."""
    changed = []
    for rel in files:
        text = (repo / rel).read_text(encoding="utf-8")
        new = render(text, repo / "results", (repo / rel).parent)
        if new != text:
            changed.append(str(rel))
            if not dry_run:
                atomic.write_text(repo / rel, new)
    return changed


def stale(files=DOCS, repo: pathlib.Path = REPO) -> List[str]:
    """The FILES whose generated blocks differ from what the records make now."""
    return write(files, repo, dry_run=True)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.docs", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("check", "write"),
                   help="check: list the numbers no record holds; write: rewrite the generated blocks")
    p.add_argument("files", nargs="*", default=list(DOCS),
                   help=f"docs, relative to the repo (default {' '.join(DOCS)})")
    a = p.parse_args(argv)
    if a.action == "write":
        for f in write(a.files, REPO):
            print(f"rewrote the generated blocks of {f}")
        return 0
    found, old = unrecorded(a.files, REPO), stale(a.files, REPO)
    if found:
        print(report(found))
        print(f"{len(found)} numbers with no record: {FIX}", file=sys.stderr)
    for f in old:
        print(f"{f}: generated blocks older than the records: run python -m harness.docs write {f}", file=sys.stderr)
    if found or old:
        return 1
    print(f"every number of {', '.join(a.files)} has a record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
