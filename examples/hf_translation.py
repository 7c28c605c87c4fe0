"""German-English translation with a HuggingFace Marian model and T-Fixup: no LayerNorm, no warmup.

    python examples/hf_translation.py

Builds a ``MarianMTModel`` from a config (random weights, nothing downloaded), applies T-Fixup with one call,
and trains it on Multi30k with an ordinary PyTorch loop at the full learning rate from the first step.
Prints the valid loss as it trains, then translates the first valid sentences (beam search).
"""

import argparse
import random

import torch
from transformers import MarianConfig, MarianMTModel

from multi30k import EOS, PAD, Vocab, due, options, pad, read, update
from tfixup import apply_tfixup
from tfixup.schedules import nowarmup_lr


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-lines", type=int, default=10000)
    p.add_argument("--valid-lines", type=int, default=200)
    p.add_argument("--vocab", type=int, default=4000, help="words per language")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64, help="sentence pairs per step")
    p.add_argument("--lr", type=float, default=1e-3)
    a = options(p, argv)

    train = list(zip(read("train", "de", a.train_lines), read("train", "en", a.train_lines)))
    valid = list(zip(read("val", "de", a.valid_lines), read("val", "en", a.valid_lines)))
    de, en = Vocab([s for s, _ in train], a.vocab), Vocab([t for _, t in train], a.vocab)

    def batch(pairs):
        src = pad([de.encode(s) for s, _ in pairs])
        labels = pad([en.encode(t) for _, t in pairs], value=-100)  # -100: not scored
        return dict(input_ids=src, attention_mask=(src != PAD).long(), labels=labels)

    config = MarianConfig(
        vocab_size=len(de), decoder_vocab_size=len(en), share_encoder_decoder_embeddings=False,
        d_model=a.dim, encoder_layers=a.layers, decoder_layers=a.layers, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=2 * a.dim, decoder_ffn_dim=2 * a.dim, activation_function="relu",
        dropout=0.1, scale_embedding=True, max_position_embeddings=128, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=EOS, forced_eos_token_id=EOS)
    model = MarianMTModel(config)
    scaled = apply_tfixup(model)  # the LayerNorms go; value, output, MLP and embedding weights are scaled
    print(f"Marian {a.layers}+{a.layers} layers, d={a.dim}, {len(train)} sentence pairs; T-Fixup scaled "
          f"{len(scaled)} weights, LayerNorms left: {sum('LayerNorm' in type(m).__name__ for m in model.modules())}")

    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: nowarmup_lr(1.0, 4000, t))  # no warmup

    def valid_loss():
        model.eval()
        with torch.no_grad():
            loss = model(**batch(valid)).loss.item()
        model.train()
        return loss

    for step in range(1, a.steps + 1):
        loss = model(**batch(random.sample(train, a.batch))).loss
        update(loss, opt, schedule, step)
        if due(step, a.steps):
            print(f"step {step}: train loss {loss.item():.3f}, valid loss {valid_loss():.3f}")

    model.eval()
    first = batch(valid[:3])
    out = model.generate(input_ids=first["input_ids"], attention_mask=first["attention_mask"], num_beams=4,
                         max_new_tokens=40)
    for (src, ref), hyp in zip(valid[:3], out.tolist()):
        print(f"\nsource:     {' '.join(src)}\nreference:  {' '.join(ref)}\ntranslated: {en.decode(hyp)}")


if __name__ == "__main__":
    main()
