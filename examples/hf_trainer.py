"""A T-Fixup HuggingFace model trained by transformers' own Trainer, saved, resumed and loaded back: no norm, no warmup.

    python examples/hf_trainer.py --model gpt2 --out work/hf-trainer-gpt2
    python examples/hf_trainer.py --model llama --keep-mlp-norm --out work/hf-trainer-llama
    python examples/hf_trainer.py --model marian --out work/hf-trainer-marian

Builds the model from a config (nothing downloaded), applies T-Fixup with one call, and trains it with ``Trainer``
(``Seq2SeqTrainer`` for Marian) on Multi30k (English for the causal LMs, German-English for Marian). The learning
rate is T-Fixup's lr * sqrt(P / (P + t)), transformers' own ``inverse_sqrt`` schedule with ``timescale`` P and no
warmup. Trainer evaluates and checkpoints every ``--eval-every`` steps into OUT and ends on the best checkpoint
(``load_best_model_at_end``); the model is saved to OUT/final (with its tokenizer for the causal LMs), loaded back
from there (``pipeline("text-generation", model=...)``, or ``AutoModelForSeq2SeqLM``) after ``import tfixup.hf_auto``,
and its greedy output is compared with the in-memory model's. ``--resume-from-checkpoint OUT/checkpoint-N`` goes on
from a checkpoint.
"""

import argparse
import math
import os

import torch
import transformers

import tfixup.hf_auto  # noqa: F401  (registers the T-Fixup model types with the Auto classes: loading a folder)
from multi30k import BOS, EOS, PAD, UNK, Vocab, options, pad, read
from tfixup import apply_tfixup

P = 4000  # T-Fixup's decay period: lr * sqrt(P / (P + t))


def build(kind: str, vocab: int, dim: int, layers: int, context: int, target_vocab: int = 0):
    t = transformers
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            vocab_size=vocab, hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, tie_word_embeddings=True,
            pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS))
    if kind == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(
            vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=4, n_positions=context, pad_token_id=PAD,
            bos_token_id=BOS, eos_token_id=EOS))
    return t.MarianMTModel(t.MarianConfig(
        vocab_size=vocab, decoder_vocab_size=target_vocab, share_encoder_decoder_embeddings=False, d_model=dim,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=2 * dim, decoder_ffn_dim=2 * dim, activation_function="relu", dropout=0.1,
        scale_embedding=True, max_position_embeddings=128, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=EOS, forced_eos_token_id=EOS))


def tokenizer(vocab: Vocab):
    """VOCAB as a transformers tokenizer (word level, lowercased), saved with the model: what pipeline() reads."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab.words)}, unk_token=vocab.words[UNK]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces, as Vocab.decode
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>",
                                                clean_up_tokenization_spaces=False)


def blocks(sentences: list, vocab: Vocab, context: int) -> list:
    """The sentences as one stream of ids in rows of CONTEXT, each a training example (labels: its own ids;
    the model shifts them)."""
    ids = torch.tensor([i for s in sentences for i in vocab.encode(s)])
    rows = ids[:len(ids) // context * context].view(-1, context)
    return [{"input_ids": r, "labels": r} for r in rows]


def arguments(a, **extra) -> dict:
    """TrainingArguments shared by both trainers: T-Fixup's schedule (inverse_sqrt, timescale P, no warmup), Adam
    (0.9, 0.98), evaluation and a checkpoint every --eval-every steps, the best one loaded at the end."""
    return dict(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch, per_device_eval_batch_size=64,
        learning_rate=a.lr, lr_scheduler_type="inverse_sqrt", lr_scheduler_kwargs={"timescale": P}, warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.98, weight_decay=0.0, max_grad_norm=0.0, eval_strategy="steps",
        eval_steps=a.eval_every, save_strategy="steps", save_steps=a.eval_every, load_best_model_at_end=True,
        metric_for_best_model="eval_loss", logging_steps=1, seed=a.seed, use_cpu=True, report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, **extra)


class Losses(transformers.TrainerCallback):
    """Each update's training loss and rate as Trainer logs them (logging_steps=1); a line at each evaluation."""

    def __init__(self):
        self.train, self.lr, self.printed = {}, {}, set()

    def on_log(self, args, state, control, logs=None, **kw):
        logs, step = logs or {}, state.global_step
        if "loss" in logs:
            self.train[step], self.lr[step] = logs["loss"], logs["learning_rate"]
        if "eval_loss" in logs and step not in self.printed:
            self.printed.add(step)
            print(f"step {step}: lr {self.lr.get(step, float('nan')):.4e}, train loss "
                  f"{self.train.get(step, float('nan')):.4f}, valid loss {logs['eval_loss']:.4f}")


def trainer_for(cls, losses: "Losses", **kw):
    """CLS (Trainer, Seq2SeqTrainer) with LOSSES in place of its own printing of every log."""
    trainer = cls(callbacks=[losses], **kw)
    trainer.remove_callback(transformers.PrinterCallback)
    return trainer


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["gpt2", "llama", "marian"], default="gpt2")
    p.add_argument("--out", required=True, help="Trainer's output folder: checkpoint-N/, and final/ (the model)")
    p.add_argument("--train-lines", type=int, default=10000)
    p.add_argument("--valid-lines", type=int, default=300)
    p.add_argument("--vocab", type=int, default=3000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32, help="examples per update (blocks of 32 tokens, or pairs)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--keep-mlp-norm", action="store_true", help="Llama: keep the RMSNorm before each gated MLP")
    p.add_argument("--resume-from-checkpoint", metavar="OUT/checkpoint-N")
    a = options(p, argv)
    resume = a.resume_from_checkpoint
    if resume and not os.path.isfile(os.path.join(resume, "trainer_state.json")):
        raise SystemExit(f"error: --resume-from-checkpoint {resume}: not a Trainer checkpoint (no trainer_state.json):"
                         f" pass one of {a.out}/checkpoint-N")
    if a.keep_mlp_norm and a.model != "llama":
        raise SystemExit(f"error: --keep-mlp-norm keeps the RMSNorm before Llama's gated MLP; --model {a.model} has "
                         "none: leave it out")
    transformers.logging.set_verbosity_error()  # its notes; errors still print
    transformers.logging.disable_progress_bar()
    return (translation if a.model == "marian" else causal_lm)(a)


def causal_lm(a):
    context = 32
    sentences = read("train", "en", a.train_lines)
    vocab = Vocab(sentences, a.vocab)
    train, valid = blocks(sentences, vocab, context), blocks(read("val", "en", a.valid_lines), vocab, context)
    model = build(a.model, len(vocab), a.dim, a.layers, context)
    scaled = apply_tfixup(model, keep_mlp_norm=a.keep_mlp_norm)
    print(f"{type(model).__name__}, {a.layers} layers, d={a.dim}, vocab {len(vocab)}; T-Fixup scaled {len(scaled)} "
          f"weights; {len(train)} training blocks of {context} tokens")
    losses = Losses()
    trainer = trainer_for(transformers.Trainer, losses, model=model, train_dataset=train, eval_dataset=valid,
                          args=transformers.TrainingArguments(**arguments(a)))
    trainer.train(resume_from_checkpoint=a.resume_from_checkpoint)
    best = trainer.evaluate()["eval_loss"]
    print(f"best checkpoint {trainer.state.best_model_checkpoint}: valid loss {best:.4f} (perplexity "
          f"{math.exp(best):.1f})")
    final = f"{a.out}/final"
    trainer.save_model(final)
    tokenizer(vocab).save_pretrained(final)

    prompt = " ".join(read("val", "en", 1)[0][:4])
    generator = transformers.pipeline("text-generation", model=final, device="cpu")
    loaded = generator(prompt, max_new_tokens=12, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    ids = torch.tensor([vocab.encode(prompt.split())[:-1]])  # the prompt's ids, without the end of sentence
    in_memory = model.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    same = in_memory[0].tolist() == list(loaded)
    print(f"saved to {final}; greedy continuation of {prompt!r}:\n  in memory:         "
          f"{vocab.decode(in_memory[0, ids.shape[1]:].tolist())}\n  loaded (pipeline): "
          f"{vocab.decode(list(loaded)[ids.shape[1]:])}\n  same tokens: {same}")
    return {"trainer": trainer, "losses": losses.train, "lr": losses.lr, "best": best, "same": same,
            "model": model, "final": final}


def translation(a):
    pairs = list(zip(read("train", "de", a.train_lines), read("train", "en", a.train_lines)))
    valid = list(zip(read("val", "de", a.valid_lines), read("val", "en", a.valid_lines)))
    de, en = Vocab([s for s, _ in pairs], a.vocab), Vocab([t for _, t in pairs], a.vocab)

    def example(src, tgt):
        return {"input_ids": de.encode(src), "labels": en.encode(tgt)}

    def collate(rows):  # padded: the source with PAD, the labels with -100 (not scored)
        src = pad([r["input_ids"] for r in rows])
        return {"input_ids": src, "attention_mask": (src != PAD).long(),
                "labels": pad([r["labels"] for r in rows], value=-100)}

    model = build("marian", len(de), a.dim, a.layers, 0, target_vocab=len(en))
    scaled = apply_tfixup(model)
    print(f"{type(model).__name__}, {a.layers}+{a.layers} layers, d={a.dim}, {len(pairs)} sentence pairs; T-Fixup "
          f"scaled {len(scaled)} weights")
    losses = Losses()
    args = transformers.Seq2SeqTrainingArguments(**arguments(a, remove_unused_columns=False))
    trainer = trainer_for(transformers.Seq2SeqTrainer, losses, model=model, args=args, data_collator=collate,
                          train_dataset=[example(*x) for x in pairs], eval_dataset=[example(*x) for x in valid])
    trainer.train(resume_from_checkpoint=a.resume_from_checkpoint)
    final = f"{a.out}/final"
    trainer.save_model(final)

    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(final)
    batch = collate([example(*x) for x in valid])
    hyps = {}
    for name, m in (("in memory", model), ("loaded", loaded)):
        out = m.eval().generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                                max_new_tokens=40)
        hyps[name] = [en.decode(h) for h in out.tolist()]
    refs = [" ".join(t) for _, t in valid]
    try:
        import sacrebleu
    except ImportError:
        bleu = {name: None for name in hyps}
        print("sacrebleu is not installed: BLEU not computed (pip install sacrebleu); the outputs are compared")
    else:
        bleu = {name: sacrebleu.corpus_bleu(h, [refs], tokenize="none").score for name, h in hyps.items()}
        print(f"valid BLEU (beam 4, tokenized): in memory {bleu['in memory']:.2f}, loaded from {final} "
              f"{bleu['loaded']:.2f}")
    print(f"translations equal: {hyps['in memory'] == hyps['loaded']}")
    return {"trainer": trainer, "losses": losses.train, "lr": losses.lr, "bleu": bleu,
            "same": hyps["in memory"] == hyps["loaded"], "model": model, "final": final}


if __name__ == "__main__":
    main()
