"""A masked language model from HuggingFace (BERT) with T-Fixup: no LayerNorm, no warmup.

    python examples/hf_masked_lm.py

Builds a ``BertForMaskedLM`` from a config (random weights, nothing downloaded), applies T-Fixup with one
call, and trains it on the English side of Multi30k with an ordinary PyTorch loop at the full learning rate
from the first step: 15 % of the words are targets (80 % of them replaced by [MASK], 10 % by a random word,
10 % kept). Prints the perplexity of the masked valid words.
"""

import argparse
import math
import random

import torch
from transformers import BertConfig, BertForMaskedLM

from multi30k import BOS, MASK, PAD, SPECIALS, Vocab, due, options, pad, read, update
from tfixup import apply_tfixup
from tfixup.schedules import nowarmup_lr


def masked(ids: torch.Tensor, vocab: int, generator=None):
    """(inputs, labels): BERT's masking of the words of IDS; labels -100 where nothing is predicted."""
    target = (ids >= len(SPECIALS)) & (torch.rand(ids.shape, generator=generator) < 0.15)
    r = torch.rand(ids.shape, generator=generator)
    inputs = torch.where(target & (r < 0.8), MASK, ids)
    random_words = torch.randint(len(SPECIALS), vocab, ids.shape, generator=generator)
    inputs = torch.where(target & (r >= 0.8) & (r < 0.9), random_words, inputs)
    return inputs, torch.where(target, ids, -100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-lines", type=int, default=10000)
    p.add_argument("--valid-lines", type=int, default=300)
    p.add_argument("--vocab", type=int, default=3000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64, help="sentences per step")
    p.add_argument("--lr", type=float, default=5e-4)
    a = options(p, argv)

    sentences = read("train", "en", a.train_lines)
    vocab = Vocab(sentences, a.vocab)
    train = [[BOS] + vocab.encode(s) for s in sentences]  # <s> as [CLS]
    valid = pad([[BOS] + vocab.encode(s) for s in read("val", "en", a.valid_lines)])
    valid_inputs, valid_labels = masked(valid, len(vocab), torch.Generator().manual_seed(0))  # fixed masks
    freq = torch.bincount(torch.tensor([i for s in train for i in s]), minlength=len(vocab)).double() + 1
    targets = valid_labels[valid_labels != -100]
    unigram = math.exp(-(freq / freq.sum()).log()[targets].mean().item())

    model = BertForMaskedLM(BertConfig(
        vocab_size=len(vocab), hidden_size=a.dim, num_hidden_layers=a.layers, num_attention_heads=4,
        intermediate_size=4 * a.dim, max_position_embeddings=128, type_vocab_size=1, pad_token_id=PAD))
    scaled = apply_tfixup(model)  # embeddings.LayerNorm and each output LayerNorm go; weights scaled
    print(f"BERT, {a.layers} layers, d={a.dim}, vocab {len(vocab)}; T-Fixup scaled {len(scaled)} weights; "
          f"unigram level: masked-word perplexity {unigram:.1f}")

    def perplexity():
        model.eval()
        with torch.no_grad():
            loss = model(input_ids=valid_inputs, attention_mask=(valid != PAD).long(), labels=valid_labels).loss
        model.train()
        return math.exp(loss.item())

    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: nowarmup_lr(1.0, 4000, t))  # no warmup
    print(f"step 0: masked-word valid perplexity {perplexity():.1f}")
    for step in range(1, a.steps + 1):
        ids = pad(random.sample(train, a.batch))
        inputs, labels = masked(ids, len(vocab))
        loss = model(input_ids=inputs, attention_mask=(ids != PAD).long(), labels=labels).loss
        update(loss, opt, schedule, step)
        if due(step, a.steps):
            print(f"step {step}: train loss {loss.item():.3f}, masked-word valid perplexity {perplexity():.1f}")


if __name__ == "__main__":
    main()
