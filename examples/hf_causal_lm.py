"""A causal language model from HuggingFace (Llama, or GPT-2) with T-Fixup: no norm, no warmup.

    python examples/hf_causal_lm.py --model llama
    python examples/hf_causal_lm.py --model llama --layers 24 --keep-mlp-norm

Builds a ``LlamaForCausalLM`` (RMSNorm, SwiGLU, rotary positions, grouped KV heads) or a ``GPT2LMHeadModel``
from a config (random weights, nothing downloaded), applies T-Fixup with one call, and trains it on the
English side of Multi30k with an ordinary PyTorch loop at the full learning rate from the first step. Prints
the valid perplexity beside the unigram level (word frequencies alone). ``--keep-mlp-norm`` (Llama): keep the
RMSNorm before each gated MLP, for deep stacks, where T-Fixup alone can diverge (docs/beyond-fairseq.md).
"""

import argparse
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from multi30k import BOS, EOS, PAD, Vocab, due, options, read, update
from tfixup import apply_tfixup
from tfixup.schedules import nowarmup_lr


def build(kind: str, vocab: int, dim: int, layers: int, context: int):
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, tie_word_embeddings=True,
            pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS))
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=4, n_positions=context, pad_token_id=PAD,
        bos_token_id=BOS, eos_token_id=EOS))


def blocks(sentences: list, vocab: Vocab, context: int) -> torch.Tensor:
    """The sentences as one stream of ids, in rows of CONTEXT + 1 (inputs and, shifted by one, targets)."""
    ids = torch.tensor([i for s in sentences for i in vocab.encode(s)])
    n = (len(ids) - 1) // context
    return torch.stack([ids[k * context:(k + 1) * context + 1] for k in range(n)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--train-lines", type=int, default=10000)
    p.add_argument("--valid-lines", type=int, default=300)
    p.add_argument("--vocab", type=int, default=3000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--keep-mlp-norm", action="store_true",
                   help="Llama: keep the RMSNorm before each gated MLP (apply_tfixup(model, keep_mlp_norm=True))")
    a = options(p, argv)
    context, batch = 32, 32

    sentences = read("train", "en", a.train_lines)
    vocab = Vocab(sentences, a.vocab)
    train, valid = blocks(sentences, vocab, context), blocks(read("val", "en", a.valid_lines), vocab, context)
    freq = torch.bincount(train[:, 1:].flatten(), minlength=len(vocab)).double() + 1
    unigram = math.exp(-(freq / freq.sum()).log()[valid[:, 1:]].mean().item())

    model = build(a.model, len(vocab), a.dim, a.layers, context)
    scaled = apply_tfixup(model, keep_mlp_norm=a.keep_mlp_norm)  # the norms go; value, output, MLP, embedding scaled
    kept = sum("norm" in type(m).__name__.lower() for m in model.modules())
    print(f"{type(model).__name__}, {a.layers} layers, d={a.dim}, vocab {len(vocab)}; T-Fixup scaled {len(scaled)} "
          f"weights{f', kept {kept} RMSNorms (one before each gated MLP)' if a.keep_mlp_norm else ''}; unigram "
          f"level: valid perplexity {unigram:.1f}")

    def loss_on(rows):  # each position predicts the next id
        logits = model(input_ids=rows[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())

    def perplexity():
        model.eval()
        with torch.no_grad():
            loss = loss_on(valid)
        model.train()
        return math.exp(loss.item())

    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: nowarmup_lr(1.0, 4000, t))  # no warmup
    print(f"step 0: valid perplexity {perplexity():.1f}")
    for step in range(1, a.steps + 1):
        loss = loss_on(train[torch.randint(len(train), (batch,))])
        update(loss, opt, schedule, step)
        if due(step, a.steps):
            print(f"step {step}: train loss {loss.item():.3f}, valid perplexity {perplexity():.1f}")


if __name__ == "__main__":
    main()
