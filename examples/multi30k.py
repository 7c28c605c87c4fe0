"""Multi30k for the examples: lowercased words and a vocabulary of the most frequent ones, so that nothing
(no tokenizer, no model) is downloaded. ``python examples/X.py`` finds this file beside it."""

import collections
import gzip
import os
import pathlib
import re

import torch

SHARED = os.environ.get("TFIXUP_SHARED_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data")
DATA = pathlib.Path(SHARED, "multi30k")
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]
PAD, BOS, EOS, UNK, MASK = range(len(SPECIALS))


def read(split: str, lang: str, lines: int) -> list:
    """The first LINES sentences of DATA/SPLIT.LANG.gz (split: train, val), as lists of lowercased words. A file
    that is missing, empty, not gzip or not UTF-8 ends the example with one line naming it."""
    path = DATA / f"{split}.{lang}.gz"
    if not path.is_file():
        raise SystemExit(f"error: {path}: no such file: the examples read Multi30k from ../shared/data/multi30k "
                         "beside the checkout (or set TFIXUP_SHARED_DATA)")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            sentences = [re.findall(r"\w+|[^\w\s]", line.lower()) for _, line in zip(range(lines), f)]
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise SystemExit(f"error: {path}: not gzip-compressed UTF-8 text ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'truncated'}): restore Multi30k's file") from None
    if not any(sentences):
        raise SystemExit(f"error: {path}: empty: no sentence to read; restore Multi30k's file")
    return sentences


class Vocab:
    """The special symbols, then the SIZE - 5 most frequent words of SENTENCES; any other word is <unk>."""

    def __init__(self, sentences: list, size: int):
        counts = collections.Counter(w for s in sentences for w in s)
        self.words = SPECIALS + [w for w, _ in counts.most_common(size - len(SPECIALS))]
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self):
        return len(self.words)

    def encode(self, words: list) -> list:
        return [self.index.get(w, UNK) for w in words] + [EOS]

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids if i not in (PAD, BOS, EOS))


def pad(rows: list, value: int = PAD) -> torch.Tensor:
    """Lists of ids as one tensor, each row filled up with VALUE at its end."""
    out = torch.full((len(rows), max(map(len, rows))), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out


def options(p, argv) -> "argparse.Namespace":
    """P's options plus the width and seed every example takes, parsed from ARGV; torch and random seeded."""
    import random

    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    return a


def update(loss: torch.Tensor, opt, schedule, step: int) -> None:
    """One optimizer step on LOSS at the schedule's rate; a non-finite loss ends the run in one line."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    schedule.step()
    if not torch.isfinite(loss):
        raise SystemExit(f"error: step {step}: loss {loss.item()}: training diverged")


def due(step: int, steps: int) -> bool:
    """Whether STEP is one of the four evenly spaced steps an example reports at."""
    return step % max(1, steps // 4) == 0
