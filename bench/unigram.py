"""The unigram level: the lowest valid loss a model that ignores its input can reach.

A translation model first learns target word frequencies; a run whose valid loss
stays near this level has learnt nothing else ("stuck"). We compute it exactly
for fairseq's ``label_smoothed_cross_entropy`` (fairseq 0.12,
``label_smoothed_nll_loss``), per target token, in bits:

    loss = (1 - eps - eps_i) * (-log q[y]) + eps_i * sum_v (-log q[v]),  eps_i = eps / (V - 1)

For a unigram model q (one distribution for every position) the total over the
N target tokens of a split, with c[v] the count of symbol v, is
``-sum_v w[v] log q[v]`` with ``w[v] = (1 - eps - eps_i) c[v] + eps_i N``; it is
minimised by ``q = w / N`` (the w sum to N). ``oracle`` fits q on the valid
targets themselves (no unigram model does better on valid); ``train_fit`` fits q
on the training targets and scores valid with it.
"""

import math
import pathlib

import numpy as np


def _target_counts(data: pathlib.Path, split: str, src: str, tgt: str, vocab: int) -> np.ndarray:
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(str(data / f"{split}.{src}-{tgt}.{tgt}"), None)
    if ds is None:
        raise FileNotFoundError(f"no binarized {split} targets in {data} ({split}.{src}-{tgt}.{tgt}.bin)")
    counts = np.zeros(vocab, dtype=np.float64)
    for i in range(len(ds)):
        counts += np.bincount(ds[i].numpy(), minlength=vocab)  # each sentence ends with </s>, as in training
    return counts


def _loss_bits(counts_eval: np.ndarray, counts_fit: np.ndarray, eps: float) -> float:
    vocab = len(counts_fit)
    eps_i = eps / (vocab - 1)
    n_fit = counts_fit.sum()
    q = ((1 - eps - eps_i) * counts_fit + eps_i * n_fit) / n_fit
    n = counts_eval.sum()
    w = (1 - eps - eps_i) * counts_eval + eps_i * n
    return float(-(w * np.log(q)).sum() / n / math.log(2))


def unigram_level(data: pathlib.Path, src: str, tgt: str, label_smoothing: float = 0.1) -> dict:
    """{"oracle": bits, "train_fit": bits, "vocab": V, "valid_tokens": N} for the valid split of a data-bin."""
    from fairseq.data import Dictionary

    data = pathlib.Path(data)
    vocab = len(Dictionary.load(str(data / f"dict.{tgt}.txt")))
    valid = _target_counts(data, "valid", src, tgt, vocab)
    train = _target_counts(data, "train", src, tgt, vocab)
    return {
        "oracle": round(_loss_bits(valid, valid, label_smoothing), 4),
        "train_fit": round(_loss_bits(valid, train, label_smoothing), 4),
        "label_smoothing": label_smoothing, "vocab": vocab, "valid_tokens": int(valid.sum()),
    }
