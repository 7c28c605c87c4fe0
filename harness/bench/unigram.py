"""The unigram level: the lowest valid loss a model that ignores its input can reach.

A translation model first learns target word frequencies; a run whose valid loss stays near this level has learnt
nothing else ("stuck"). We compute it exactly for fairseq's ``label_smoothed_cross_entropy`` (fairseq 0.12,
``label_smoothed_nll_loss``), per target token, in bits:

    loss = (1 - eps - eps_i) * (-log q[y]) + eps_i * sum_v (-log q[v]),  eps_i = eps / (V - 1)

For a unigram model q (one distribution for every position) the total over the N target tokens of a split, with
c[v] the count of symbol v, is ``-sum_v w[v] log q[v]`` with ``w[v] = (1 - eps - eps_i) c[v] + eps_i N``; it is
minimised by ``q = w / N`` (the w sum to N). ``oracle`` fits q on the valid targets themselves (no unigram model
does better on valid); ``train_fit`` fits q on the training targets and scores valid with it.
"""

import math
import pathlib
import struct

import numpy as np


# fairseq's binarized format (fairseq-preprocess --dataset-impl mmap, its default; fairseq 0.12's
# data/indexed_dataset.py): NAME.idx = magic, version <Q, dtype code <B, sentence count <Q, then the int32 sizes;
# NAME.bin = every sentence's token ids back to back. Read here with numpy, so that the benchmark orchestrators need
# not import fairseq (4-5 s a process); tests/test_bench_studies.py checks the counts against fairseq's own loader.
_MMAP_MAGIC = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16, 9: np.uint32,
           10: np.uint64}


def _token_counts(stem: pathlib.Path, vocab: int) -> np.ndarray:
    """Count of each symbol over every sentence (each ending with </s>, as in training) of STEM.idx/STEM.bin."""
    idx, bin_ = stem.with_name(stem.name + ".idx"), stem.with_name(stem.name + ".bin")
    if not idx.is_file() or not bin_.is_file():
        raise FileNotFoundError(f"no binarized {stem.name} in {stem.parent} ({stem.name}.idx/.bin): "
                                f"prepare the data-bin with scripts/prepare-*.sh")
    with open(idx, "rb") as f:
        magic, version, code = f.read(9), struct.unpack("<Q", f.read(8))[0], f.read(1)[0]
        if magic != _MMAP_MAGIC or version != 1 or code not in _DTYPES:
            raise ValueError(f"{idx} is not fairseq's mmap format (fairseq-preprocess --dataset-impl mmap)")
        (n,) = struct.unpack("<Q", f.read(8))
        sizes = np.fromfile(f, dtype=np.int32, count=n)  # fewer when the index is cut short: refused below
    tokens = np.fromfile(bin_, dtype=_DTYPES[code])
    if len(sizes) != n or int(sizes.sum(dtype=np.int64)) != len(tokens):
        raise ValueError(f"{bin_} does not hold the {n} sentences its index lists: rebuild the data-bin")
    return np.bincount(tokens, minlength=vocab).astype(np.float64)


def _loss_bits(counts_eval: np.ndarray, counts_fit: np.ndarray, eps: float) -> float:
    vocab = len(counts_fit)
    eps_i = eps / (vocab - 1)
    n_fit = counts_fit.sum()
    q = ((1 - eps - eps_i) * counts_fit + eps_i * n_fit) / n_fit
    n = counts_eval.sum()
    w = (1 - eps - eps_i) * counts_eval + eps_i * n
    seen = w > 0  # without smoothing, symbols absent from the scored split add nothing (0 log 0 = 0)
    with np.errstate(divide="ignore"):
        return float(-(w[seen] * np.log(q[seen])).sum() / n / math.log(2))


def _level(valid: np.ndarray, train: np.ndarray, vocab: int, eps: float = 0.0, ppl: bool = True) -> dict:
    """The level on VALID's counts, q fit on VALID itself and on TRAIN; ``ppl``: with the perplexities 2^bits."""
    bits = {"oracle": _loss_bits(valid, valid, eps), "train_fit": _loss_bits(valid, train, eps)}
    out = {k: round(v, 4) for k, v in bits.items()}
    if ppl:
        out.update({f"{k}_ppl": round(2 ** v, 2) for k, v in bits.items()})
    return {**out, "label_smoothing": eps, "vocab": vocab, "valid_tokens": int(valid.sum())}


def _dict_size(path: pathlib.Path) -> int:
    """fairseq's Dictionary: its 4 specials (<s>, <pad>, </s>, <unk>) then a line per symbol."""
    return 4 + sum(1 for line in open(path, encoding="utf-8") if line.strip())


def unigram_level(data: pathlib.Path, src: str, tgt: str, label_smoothing: float = 0.1) -> dict:
    """{"oracle": bits, "train_fit": bits, "vocab": V, "valid_tokens": N} for the valid split of a data-bin."""
    data = pathlib.Path(data)
    vocab = _dict_size(data / f"dict.{tgt}.txt")
    valid, train = (_token_counts(data / f"{split}.{src}-{tgt}.{tgt}", vocab) for split in ("valid", "train"))
    return _level(valid, train, vocab, label_smoothing, ppl=False)


def lm_unigram_level(data: pathlib.Path) -> dict:
    """The same for a language model's data-bin (fairseq-preprocess --only-source: dict.txt, {train,valid}.idx/.bin)
    and its plain cross-entropy: bits per token over every valid token (each line's words and its </s>, all targets
    of fairseq's language_modeling), and the perplexity 2^bits that fairseq reports."""
    data = pathlib.Path(data)
    vocab = _dict_size(data / "dict.txt")
    return _level(_token_counts(data / "valid", vocab), _token_counts(data / "train", vocab), vocab)


def hf_lm_unigram_level(data: pathlib.Path, lang: str, train_lines: int = 0, valid_lines: int = 0) -> dict:
    """The same for the HuggingFace study's exported data (harness/bench/hf_train.export: SPLIT.npz with LANG and
    LANG_offsets, vocab.LANG.txt) read as its causal LMs read it: the first TRAIN_LINES / VALID_LINES (0: all)
    sentences of LANG, each with its </s>, every token a target (one stream). A symbol the training sentences lack
    (<unk>: the export maps rare words to it only in valid and test) is counted once in train_fit, as if seen once:
    a model never shown it still gives it some mass, and a level of infinity would call every run trained."""
    data = pathlib.Path(data)
    vocab = sum(1 for _ in open(data / f"vocab.{lang}.txt", encoding="utf-8"))

    def counts(split, lines):
        with np.load(data / f"{split}.npz") as z:
            offsets = z[f"{lang}_offsets"]
            end = offsets[min(lines, len(offsets) - 1)] if lines else offsets[-1]
            return np.bincount(z[lang][:end].astype(np.int64), minlength=vocab).astype(np.float64)

    valid, train = counts("valid", valid_lines), counts("train", train_lines)
    train[(train == 0) & (valid > 0)] = 1
    return _level(valid, train, vocab)
