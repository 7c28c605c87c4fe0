"""Batches of real data for the diagnostics: fairseq's own datasets and collaters."""

import gzip
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Iterator, List

from tfixup import atomic


def to_device(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample, device=device) if str(device).startswith("cuda") else sample


def training_batches(task, max_tokens, max_sentences, max_positions, split: str = "train", seed: int = 1,
                     device: str = "cpu") -> Iterator[dict]:
    """Endless shuffled batches of ``split`` bucketed by ``--max-tokens``, epoch after epoch (as fairseq-train)."""
    task.load_dataset(split)
    epoch = 1
    while True:
        itr = task.get_batch_iterator(
            dataset=task.dataset(split), max_tokens=max_tokens, max_sentences=max_sentences,
            max_positions=max_positions,
            ignore_invalid_inputs=True, seed=seed, epoch=epoch,
        ).next_epoch_itr(shuffle=True)
        for sample in itr:
            if sample:
                yield to_device(sample, device)
        epoch += 1


def fixed_batches(task, args, split: str, n_sentences: int, device: str = "cpu") -> List[dict]:
    """The first ``n_sentences`` pairs of ``split`` (all of it if 0) as length-sorted batches of <= --max-tokens.

    Used where one fixed loss is studied (gradients and Hessian at initialisation).
    """
    task.load_dataset(split)
    ds = task.dataset(split)
    n = len(ds) if n_sentences <= 0 else min(n_sentences, len(ds))
    if n < n_sentences:
        print(f"[data] {split} has only {n} sentence pairs (asked for {n_sentences})", flush=True)
    indices = sorted(range(n), key=lambda i: (ds.src_sizes[i], ds.tgt_sizes[i]))
    batches, cur, cur_max = [], [], 0
    for i in indices:
        size = max(int(ds.src_sizes[i]), int(ds.tgt_sizes[i]))
        if cur and max(cur_max, size) * (len(cur) + 1) > args.max_tokens:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, size)
    if cur:
        batches.append(cur)
    return [to_device(ds.collater([ds[i] for i in b]), device) for b in batches]


def prepare_multi30k(shared: pathlib.Path, out: pathlib.Path, split: str = "val", lines: int = 1000,
                     src: str = "de", tgt: str = "en") -> pathlib.Path:
    """A fairseq data-bin from raw Multi30k text: Moses tokenise + lowercase, IWSLT'14 BPE codes, fairseq-preprocess.

    The first ``lines`` pairs of ``split`` become the data-bin's *train* split (and its dictionaries).
    Skipped when ``out`` exists; built in a temp folder and renamed (tfixup.atomic.write_folder), so a
    failure leaves nothing.
    """
    import lzma

    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    out = pathlib.Path(out)
    if (out / f"dict.{src}.txt").is_file():
        return out
    raw = {l: pathlib.Path(shared) / "multi30k" / f"{split}.{l}.gz" for l in (src, tgt)}
    codes = pathlib.Path(shared) / "iwslt14-de-en" / "fairseq-prepared" / "code.xz"
    for f in list(raw.values()) + [codes]:
        if not f.is_file():
            raise FileNotFoundError(f"missing input file: {f} (set --shared or TFIXUP_SHARED_DATA)")

    def build(folder):
        text = folder / "text"  # tokenised and BPE'd, removed once binarised
        text.mkdir()
        with lzma.open(codes, "rt", encoding="utf-8") as fh:
            bpe = BPE(fh)
        for l, path in raw.items():
            tok = MosesTokenizer(lang=l)
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                sentences = [next(fh) for _ in range(lines)] if lines > 0 else fh.readlines()
            with open(text / f"train.{l}", "w", encoding="utf-8") as fh:
                for line in sentences:
                    toks = tok.tokenize(line.strip().lower(), escape=True, return_str=True)
                    fh.write(bpe.process_line(toks) + "\n")
        print(f"[data] Multi30k {split}: {len(sentences)} pairs tokenised + BPE'd; fairseq-preprocess", flush=True)
        subprocess.run(
            [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt, "--trainpref",
             str(text / "train"), "--destdir", str(folder), "--workers", "1"],
            check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        shutil.rmtree(text)

    return atomic.write_folder(out, build)
