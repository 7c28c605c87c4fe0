"""A decoder-only language model in plain PyTorch, with T-Fixup: no LayerNorm, no warmup.

    python examples/tfixup_lm.py --layers 6 --steps 100

Trains on the English side of Multi30k (``--text``, gzip'd, a sentence a line; lowercased words, the
``--vocab`` most frequent and <unk>) and prints the valid perplexity, beside the unigram level (the
perplexity of word frequencies alone, which a model that learnt nothing else stays at). Only
``apply_tfixup`` is T-Fixup's; the rest is an ordinary PyTorch training loop. docs/beyond-fairseq.md
walks through it.
"""

import argparse
import collections
import gzip
import math
import os
import pathlib
import re

import torch
from torch import nn

from tfixup import atomic
from tfixup.torch_tfixup import apply_tfixup

SHARED = pathlib.Path(os.environ.get("TFIXUP_SHARED_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))


def read_words(path: pathlib.Path, lines: int) -> list:
    words = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == lines:
                break
            words += re.findall(r"\w+|[^\w\s]", line.lower()) + ["</s>"]
    return words


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, ffn: int, layers: int, context: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.1, batch_first=True)
        self.stack = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        h = self.stack(self.embed(tokens) + self.pos.weight[:n], mask=mask, is_causal=True)
        return h @ self.embed.weight.t()  # the output projection is the token embedding (tied)


def batches(ids: torch.Tensor, context: int, batch: int, generator=None):
    starts = torch.randint(0, len(ids) - context - 1, (batch,), generator=generator)
    rows = torch.stack([ids[s:s + context + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, context: int) -> float:
    model.eval()
    n = (len(ids) - 1) // context * context
    x, y = ids[:n].view(-1, context), ids[1:n + 1].view(-1, context)
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    model.train()
    return math.exp(loss.item())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default=str(SHARED / "multi30k" / "train.en.gz"), help="train text (gzip)")
    p.add_argument("--valid", default=str(SHARED / "multi30k" / "val.en.gz"), help="valid text (gzip)")
    p.add_argument("--train-lines", type=int, default=5000)
    p.add_argument("--valid-lines", type=int, default=300)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", default="fp32",
                   help="comma list of fp32 and bf16 (CPU autocast to bfloat16), each trained from the same seed")
    p.add_argument("--evals", type=int, default=4, help="valid perplexity this many times over the run (default 4)")
    p.add_argument("--out", help="write tfixup_lm_precision.{json,png} here: every run's curves, overlaid")
    a = p.parse_args(argv)
    precisions = a.precision.split(",")
    if not set(precisions) <= {"fp32", "bf16"} or not precisions:
        p.error(f"--precision: a comma list of fp32 and bf16, got {a.precision!r}")
    curves = {prec: train(a, prec) for prec in precisions}
    if a.out:
        write_record(a, curves, pathlib.Path(a.out))


def train(a, precision: str) -> dict:
    """One run; returns its curves: (step, train loss) and (step, valid perplexity)."""
    torch.manual_seed(a.seed)
    context, batch = 32, 16
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")  # noqa: E731

    train_words = read_words(pathlib.Path(a.text), a.train_lines)
    counts = collections.Counter(train_words)
    vocab = ["<unk>"] + [w for w, _ in counts.most_common(a.vocab - 1)]
    index = {w: i for i, w in enumerate(vocab)}
    encode = lambda words: torch.tensor([index.get(w, 0) for w in words])
    train, valid = encode(train_words), encode(read_words(pathlib.Path(a.valid), a.valid_lines))
    freq = torch.bincount(train, minlength=len(vocab)).double() + 1.0
    unigram = math.exp(-(freq / freq.sum()).log()[valid].mean().item())

    model = LM(len(vocab), a.dim, heads=4, ffn=2 * a.dim, layers=a.layers, context=context)
    # T-Fixup: the stack's LayerNorms go, its value/output/MLP weights and the input embeddings
    # (token and position) are drawn again and scaled by (6N)^-1/4; the tied output projection is
    # the token embedding, scaled once.
    apply_tfixup(model.stack, embeddings=[model.embed, model.pos])
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98))  # no warmup: full lr at step 1

    print(f"{precision}: {a.layers} layers, d={a.dim}, {len(train)} train / {len(valid)} valid words, vocab "
          f"{len(vocab)}; unigram level: valid perplexity {unigram:.1f}")
    with autocast():
        ppl = perplexity(model, valid, context)
    print(f"step 0: valid perplexity {ppl:.1f}")
    curve = {"unigram_ppl": unigram, "train_loss": [], "valid_ppl": [(0, ppl)]}
    for step in range(1, a.steps + 1):
        x, y = batches(train, context, batch)
        with autocast():  # the weights, gradients and Adam's state stay fp32; the matmuls run in bf16
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve["train_loss"].append((step, loss.item()))
        if not math.isfinite(loss.item()):
            raise SystemExit(f"error: step {step}: loss {loss.item()}: training diverged")
        if step % max(1, a.steps // a.evals) == 0 or step == a.steps:
            with autocast():
                ppl = perplexity(model, valid, context)
            curve["valid_ppl"].append((step, ppl))
            print(f"step {step}: train loss {loss.item():.3f}, valid perplexity {ppl:.1f}")
    return curve


def write_record(a, curves: dict, out: pathlib.Path) -> None:
    """tfixup_lm_precision.json (settings and curves) and .png (the runs' curves overlaid), each through the one
    atomic writer (tfixup/atomic.py)."""
    import platform
    import sys
    import time

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    record = {"command": "python examples/tfixup_lm.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads", "settings": vars(a), "runs": curves}
    atomic.write_json(out / "tfixup_lm_precision.json", record)
    fig, (ax_l, ax_p) = plt.subplots(1, 2, figsize=(9, 3.4))
    for prec, c in curves.items():
        ax_l.plot(*zip(*c["train_loss"]), lw=0.8, label=prec)
        ax_p.plot(*zip(*c["valid_ppl"]), "o-", label=prec)
    ax_p.axhline(next(iter(curves.values()))["unigram_ppl"], color="gray", ls=":", label="unigram level")
    ax_l.set(xlabel="step", ylabel="train loss (nats)")
    ax_p.set(xlabel="step", ylabel="valid perplexity", yscale="log")
    for ax in (ax_l, ax_p):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"T-Fixup LM (apply_tfixup), {a.layers} layers, d={a.dim}, lr {a.lr:g}, seed {a.seed}", fontsize=9)
    fig.tight_layout()
    atomic.save_figure(out / "tfixup_lm_precision.png", fig)
    print(f"wrote {out}/tfixup_lm_precision.{{json,png}}")


if __name__ == "__main__":
    main()
