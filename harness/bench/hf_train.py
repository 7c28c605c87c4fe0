"""The HuggingFace study's runs (harness/bench/hf.py plans them): its arms (ARMS, a row each); its data, exported
once from the Multi30k data-bin (``export``, needs fairseq) as token-id arrays read with numpy and torch alone; its
models, built from transformers configs and changed as an arm says; the PyTorch loop every family shares (curves of
(update, value), progress lines in fairseq's shape, which the study's heartbeat reads); Marian's beam search and
scores; one run in its own process (``hf one``)."""

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import math
import os
import pathlib
import shlex
import shutil
import statistics
import sys
import time
import traceback
import types
from typing import NamedTuple, Optional

import numpy as np

from harness.bench import common, runs as runlib
from tfixup import atomic, methods
from tfixup.schedules import matched_lr, nowarmup_lr

BOS, PAD, EOS, UNK = 0, 1, 2, 3  # fairseq's Dictionary
SRC, TGT = "de", "en"
DATA_BIN = pathlib.Path("work/data-bin/multi30k.de-en")
PREPARE = ("bash scripts/prepare-corpus.sh --src de --tgt en --train ../shared/data/multi30k/train "
           "--valid ../shared/data/multi30k/val --test ../shared/data/multi30k/test_2016_flickr --lowercase "
           "--bpe-merges 8000 --out work/data-bin/multi30k.de-en")
DECAY_PERIOD = 4000
WEIGHT_DECAY = 1e-4


FAMILIES = {"marian": "Marian (translation)", "gpt2": "GPT-2 (causal LM)", "llama": "Llama (causal LM)",
            "bert": "BERT (masked LM)"}
NO_MULTIPLIER = ("gpt2", "llama", "bert")  # families that get apply_tfixup's input multiplier


class Arm(NamedTuple):
    """A training arm: the stock model (as built, or changed: CHANGES) or T-Fixup on it (apply_tfixup with these
    options); schedule: "nowarmup" (T-Fixup's curve) or "matched" (a warmup onto it); optimizer "giadam": Adam's
    second moment starts at the first gradient squared; norms "dyt", "derf": in place of every RMSNorm."""
    label: str
    schedule: str
    color: str
    tfixup: bool = False
    optimizer: str = "adam"
    norms: str = "kept"
    input_scale: bool = True
    keep_mlp_norm: bool = False
    keep_head_norm: bool = False
    gated_mlp: Optional[str] = None
    change: Optional[str] = None
    norm_free: bool = False
    lr_grid: bool = False


NW, MW = "nowarmup", "matched"
ARMS = {
    "tfixup": Arm("T-Fixup, no warmup", NW, methods.method("tfixup").color, tfixup=True),
    "stock_matched": Arm("stock + matched warmup", MW, methods.method("postln").color, lr_grid=True),
    "stock": Arm("stock, no warmup", NW, common.POSTLN_NO_WARMUP_COLOR),
    # Marian's control for the cross-framework check: T-Fixup leaves q, k and the q/k/v biases as the framework drew
    # them (transformers: N(0, 0.02) and zeros; fairseq: Xavier-uniform, gain 2^-1/2, and nn.Linear's biases)
    "tfixup_fsqk": Arm("T-Fixup, no warmup, q/k as fairseq draws them", NW, "tab:pink", tfixup=True,
                       change="fairseq_qk"),
    # the causal LMs' control for apply_tfixup's sqrt(d) input multiplier (fairseq's embed_scale; GPT-2, Llama lack it)
    "tfixup_noscale": Arm("T-Fixup, no warmup, without the sqrt(d) input multiplier", NW, "tab:orange", tfixup=True,
                          input_scale=False),
    # Llama's controls for its gated MLP, of degree 2 in its input (docs/derivation.md, section 7.6)
    "tfixup_mlpnorm": Arm("T-Fixup, no warmup, the RMSNorm before each gated MLP kept", NW, "tab:olive", tfixup=True,
                          keep_mlp_norm=True, lr_grid=True),
    "tfixup_nogate": Arm("T-Fixup, no warmup, the MLP without its gate", NW, "tab:cyan", tfixup=True, change="ungate"),
    # BERT's control for its masked-LM head (dense, GELU, LayerNorm, the tied projection): that LayerNorm kept
    "tfixup_headnorm": Arm("T-Fixup, no warmup, the masked-LM head's LayerNorm kept", NW, "tab:brown", tfixup=True,
                           keep_head_norm=True),
    # the LayerNorm-free methods of 2025-26 on the Llama (tfixup/hf_norms.py), the stock model with GI-Adam
    "dyt": Arm("DyT in place of every RMSNorm + matched warmup", MW, "tab:purple", norms="dyt", lr_grid=True),
    "derf": Arm("Derf in place of every RMSNorm + matched warmup", MW, "mediumvioletred", norms="derf", lr_grid=True),
    "giadam": Arm("stock, GI-Adam, no warmup", NW, "tab:gray", optimizer="giadam", lr_grid=True),
    # norm-free T-Fixup for the gated MLP (docs/derivation.md, section 7.7)
    "tfixup_sigmoid": Arm("T-Fixup, no warmup, the gate bounded (sigmoid)", NW, "tab:green", tfixup=True,
                          gated_mlp="sigmoid", norm_free=True, lr_grid=True),
    "tfixup_gatescale": Arm("T-Fixup, no warmup, each gated MLP's output times 1/N", NW, "darkgoldenrod", tfixup=True,
                            gated_mlp="scaled", norm_free=True, lr_grid=True),
    "tfixup_giadam": Arm("T-Fixup, GI-Adam, no warmup", NW, "teal", tfixup=True, optimizer="giadam", norm_free=True,
                         lr_grid=True),
    # Marian's cross-initialisation control (issue 49): the stock Post-LN Marian drawn as fairseq draws its transformer
    "stock_fsinit": Arm("stock + matched warmup, fairseq's initialisation", MW, "tab:red", change="fairseq_init")}
BASELINE = "stock_matched"
NORM_FREE = [a for a, x in ARMS.items() if x.norm_free]  # the norm-free T-Fixup candidates
NEW_LLAMA_ARMS = ["dyt", "derf", "giadam", *NORM_FREE]
LR_ARMS = [a for a, x in ARMS.items() if x.lr_grid]  # each at its own best lr
# DyT's alpha0 per place of a LLaMA: the DyT repository's LLaMA 2 recipes give 0.8 / 0.2 / 0.2 at width 4096,
# smaller where wider; the study's width, 128, is below the table: the narrowest row's values
DYT_ALPHA0 = {"attention": 0.8, "mlp": 0.2, "final": 0.2}
DERF_ALPHA0, DERF_SHIFT0 = 0.5, 0.0  # Derf's defaults (gamma * erf(alpha x + s) + beta), at every place


def export(data_bin: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """The data-bin's token ids (fairseq's reader) as OUT/SPLIT.npz (per language: every sentence's ids in a row,
    LANG, and where each starts, LANG_offsets), OUT/vocab.LANG.txt (line i = id i), the raw test references and
    meta.json; published whole or not at all."""
    from fairseq.data import Dictionary, data_utils
    for f in (f"dict.{SRC}.txt", f"dict.{TGT}.txt", f"test.raw.{TGT}"):
        if not (data_bin / f).is_file():
            common.die(f"{data_bin}: no {f}, not the Multi30k De-En data-bin; make it with: {PREPARE}")

    def write(tmp: pathlib.Path) -> None:
        counts, dicts = {}, {lang: Dictionary.load(str(data_bin / f"dict.{lang}.txt")) for lang in (SRC, TGT)}
        for lang, d in dicts.items():
            (tmp / f"vocab.{lang}.txt").write_text("".join(s + "\n" for s in d.symbols), encoding="utf-8")
        for split in ("train", "valid", "test"):
            arrays = {}
            for lang, d in dicts.items():
                ds = data_utils.load_indexed_dataset(str(data_bin / f"{split}.{SRC}-{TGT}.{lang}"), d)
                if ds is None:
                    common.die(f"{data_bin}: no {split}.{SRC}-{TGT}.{lang}; make the data-bin with: {PREPARE}")
                sents = [ds[i].numpy() for i in range(len(ds))]
                arrays[lang] = np.concatenate(sents).astype(np.int32)
                arrays[f"{lang}_offsets"] = np.cumsum([0] + [len(s) for s in sents]).astype(np.int64)
                counts[split] = len(sents)
            np.savez(tmp / f"{split}.npz", **arrays)
        shutil.copy(data_bin / f"test.raw.{TGT}", tmp / f"test.raw.{TGT}")
        manifest = json.loads((data_bin / "manifest.json").read_text()) if (data_bin / "manifest.json").is_file() else {}
        atomic.write_json(tmp / "meta.json", {
            "source": str(data_bin.resolve()), "sentences": counts, "langs": [SRC, TGT],
            "vocab": {lang: len(read_vocab(tmp, lang)) for lang in (SRC, TGT)}, "parameters": manifest.get("params"),
            "source_manifest": manifest, "made_by": "python -m harness.bench.hf export"})

    return atomic.write_folder(out, write)


def check_data(path: pathlib.Path) -> pathlib.Path:
    if not (path / "meta.json").is_file():
        common.die(f"--data {path}: not an exported folder (no meta.json); make it here with: "
                   f"python -m harness.bench.hf export --out {path}")
    return path


def read_split(data: pathlib.Path, split: str, lang: str, lines: int = 0) -> list:
    """A split's sentences as int64 numpy arrays (each ending with </s>), the first LINES (0: all)."""
    with np.load(data / f"{split}.npz") as z:
        ids, offsets = z[lang].astype(np.int64), z[f"{lang}_offsets"]
    n = len(offsets) - 1 if not lines else min(lines, len(offsets) - 1)
    return [ids[offsets[i]:offsets[i + 1]] for i in range(n)]


def read_vocab(data: pathlib.Path, lang: str) -> list:
    return (data / f"vocab.{lang}.txt").read_text(encoding="utf-8").splitlines()


def to_text(ids, vocab: list, escape_unk: bool = False) -> str:
    """fairseq's ``Dictionary.string`` with --remove-bpe: symbols up to </s>, "@@ " joins removed; ESCAPE_UNK:
    <unk> as fairseq-generate writes a reference's (<<unk>>)."""
    ids = itertools.takewhile(lambda i: i != EOS, map(int, ids))
    words = ["<<unk>>" if escape_unk and i == UNK else vocab[i] for i in ids if i not in (BOS, PAD)]
    return (" ".join(words) + " ").replace("@@ ", "").rstrip()


def build_model(spec: dict, vocab: dict):
    """The family's HuggingFace model at the run's size, randomly initialised as transformers does."""
    f, d, layers, heads = spec["family"], spec["d"], spec["layers"], spec["heads"]
    if f not in FAMILIES:
        raise ValueError(f"unknown model family {f!r}: one of {', '.join(FAMILIES)}")
    import transformers as hf
    if f == "marian":  # fairseq's transformer as the quality study trains it: ReLU, sinusoidal positions,
        # embeddings scaled by sqrt(d), decoder input = output embedding, dictionaries apart, </s> starts the decoder
        return hf.MarianMTModel(hf.MarianConfig(
            vocab_size=vocab[SRC], decoder_vocab_size=vocab[TGT], share_encoder_decoder_embeddings=False,
            tie_word_embeddings=True, d_model=d, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=spec["ffn"],
            decoder_ffn_dim=spec["ffn"], activation_function="relu", dropout=spec["dropout"], attention_dropout=0.0,
            activation_dropout=0.0, max_position_embeddings=1024, scale_embedding=True, pad_token_id=PAD,
            eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=EOS, forced_eos_token_id=EOS))
    if f == "gpt2":
        return hf.GPT2LMHeadModel(hf.GPT2Config(
            vocab_size=vocab[TGT], n_positions=spec["tokens_per_sample"], n_embd=d, n_layer=layers, n_head=heads,
            n_inner=spec["ffn"], resid_pdrop=spec["dropout"], embd_pdrop=spec["dropout"], attn_pdrop=0.0,
            bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True))
    if f == "llama":  # LLaMA has no dropout
        return hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=vocab[TGT], hidden_size=d, intermediate_size=spec["ffn"], num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=spec["tokens_per_sample"],
            tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS))
    return hf.BertForMaskedLM(hf.BertConfig(  # one more symbol: [MASK]
        vocab_size=vocab[TGT] + 1, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=spec["ffn"], hidden_dropout_prob=spec["dropout"], attention_probs_dropout_prob=spec["dropout"],
        max_position_embeddings=spec["max_len"], type_vocab_size=1, pad_token_id=PAD, tie_word_embeddings=True))


def fairseq_qk_(model) -> int:
    """What T-Fixup leaves of each attention drawn again as fairseq's MultiheadAttention draws it: q and k weights
    Xavier-uniform with gain 2^-1/2, the q, k and v biases nn.Linear's uniform (+-fan_in^-1/2); how many."""
    import torch
    n = 0
    with torch.no_grad():
        for m in model.modules():
            if all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj")):
                for lin in (m.q_proj, m.k_proj):
                    torch.nn.init.xavier_uniform_(lin.weight, gain=2 ** -0.5)
                for lin in (m.q_proj, m.k_proj, m.v_proj):
                    torch.nn.init.uniform_(lin.bias, -lin.weight.shape[1] ** -0.5, lin.weight.shape[1] ** -0.5)
                n += 1
    return n


def fairseq_init_(model) -> int:
    """Marian drawn as fairseq 0.12 draws its Post-LN transformer: token embeddings N(0, d^-1/2), padding row zero;
    q, k, v as fairseq_qk_; out_proj Xavier-uniform, zero bias; fc1, fc2 nn.Linear's draw (LayerNorms, sinusoidal
    positions and the tied output projection are the same in both). How many attentions."""
    import torch
    n = fairseq_qk_(model)  # q, k weights; q, k, v biases
    with torch.no_grad():
        for stack in (model.base_model.encoder, model.base_model.decoder):
            torch.nn.init.normal_(stack.embed_tokens.weight, mean=0.0, std=stack.embed_tokens.weight.shape[1] ** -0.5)
            stack.embed_tokens.weight[PAD].zero_()
            for layer in stack.layers:
                for attn in [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else []):
                    torch.nn.init.xavier_uniform_(attn.v_proj.weight, gain=2 ** -0.5)
                    torch.nn.init.xavier_uniform_(attn.out_proj.weight)
                    torch.nn.init.zeros_(attn.out_proj.bias)
                layer.fc1.reset_parameters()
                layer.fc2.reset_parameters()
    return n


def ungate_(model) -> int:
    """Each Llama MLP computes down(silu(up x)), its gate_proj left unused; how many."""
    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)))

    for layer in model.model.layers:
        layer.mlp.forward = types.MethodType(forward, layer.mlp)
    return len(model.model.layers)


# an arm's change of the model (hf.Arm.change): the record's key, the function
CHANGES = {"fairseq_qk": ("qk_redrawn", fairseq_qk_), "ungate": ("ungated", ungate_),
           "fairseq_init": ("fairseq_init_attentions", fairseq_init_)}


def norm_modules(model) -> int:
    """Normalisation modules left in the model (LayerNorm, RMSNorm, ...; not DyT or Derf)."""
    return sum(1 for m in model.modules() if "norm" in type(m).__name__.lower())


def make_model(spec: dict, data: pathlib.Path):
    """The run's model as its arm (ARMS) makes it, seeded: the stock model, T-Fixup on it with the arm's
    options, the arm's change, DyT or Derf; and what was done to it."""
    import torch
    from tfixup import apply_tfixup
    from tfixup.hf_norms import pointwise_norms_
    arm = ARMS[spec["arm"]]
    torch.manual_seed(spec["seed"])
    model = build_model(spec, {lang: len(read_vocab(data, lang)) for lang in (SRC, TGT)})
    out = {"norm_modules_stock": norm_modules(model)}
    if arm.tfixup:
        scaled = apply_tfixup(model, input_scale=spec.get("input_scale", True), keep_mlp_norm=arm.keep_mlp_norm,
                              keep_head_norm=arm.keep_head_norm, gated_mlp=spec.get("gated_mlp"))
        out["tfixup_scaled"] = {k: round(v, 6) for k, v in scaled.items()}
    if arm.change:
        key, change = CHANGES[arm.change]
        out[key] = change(model)
    if arm.norms != "kept":
        out["pointwise_norms"] = pointwise_norms_(model, spec["norm"], spec["alpha0"], spec.get("shift0", 0.0))
    out.update(norm_modules=norm_modules(model), parameters=sum(p.numel() for p in model.parameters()))
    return model, out


def pad_rows(rows: list, pad: int = PAD):
    import torch
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r)
    return out


def translation_batches(src: list, tgt: list, max_tokens: int, seed: int, epoch: int) -> list:
    """fairseq's batching of a language pair: sentences by source then target length (ties at random), greedily
    into batches of at most MAX_TOKENS (longest side x sentences), in a random order per epoch."""
    rng = np.random.RandomState(seed + epoch)
    slen, tlen = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
    order = rng.permutation(len(src))
    order = order[np.argsort(tlen[order], kind="mergesort")]
    order = order[np.argsort(slen[order], kind="mergesort")]
    batches, cur, longest = [], [], 0
    for i in order:
        n = max(slen[i], tlen[i])
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(int(i))
        longest = max(longest, n)
    batches += [cur] if cur else []
    rng.shuffle(batches)
    return batches


def translation_tensors(src: list, tgt: list, idx: list) -> dict:
    """Source with its mask; decoder input </s> + target without its </s> (fairseq's prev_output_tokens)."""
    s, t = pad_rows([src[i] for i in idx]), pad_rows([tgt[i] for i in idx])
    prev = pad_rows([np.concatenate([[EOS], tgt[i][:-1]]) for i in idx])
    return {"input_ids": s, "attention_mask": (s != PAD).long(), "decoder_input_ids": prev, "labels": t}


def lm_blocks(sents: list, block: int, pad_tail: bool):
    """One stream of the sentences in rows of BLOCK tokens and their next tokens; PAD_TAIL: the last part-filled
    row too, its missing targets PAD (valid: every token is scored)."""
    import torch
    stream = np.concatenate(sents)
    n = len(stream) - 1  # tokens that have a next one
    rows = -(-n // block) if pad_tail else n // block
    x, y = np.full((2, rows * block), PAD)
    k = min(n, rows * block)
    x[:k], y[:k] = stream[:k], stream[1:k + 1]
    return torch.as_tensor(x.reshape(rows, block)), torch.as_tensor(y.reshape(rows, block))


def batches_of(n: int, size: int, gen) -> list:
    """A random order of N rows in full batches of SIZE (an epoch)."""
    import torch
    perm = torch.randperm(n, generator=gen)
    return [perm[k:k + size] for k in range(0, n - size + 1, size)] or [perm]


def marian_sums(model, b, eps):
    """fairseq's label_smoothed_cross_entropy of batch B, summed over the non-pad targets: (loss, tokens)."""
    import torch
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=b["decoder_input_ids"])
    lprobs = torch.log_softmax(out.logits.float(), dim=-1).flatten(0, -2)
    keep = b["labels"].flatten() != PAD
    lprobs, target = lprobs[keep], b["labels"].flatten()[keep]
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    eps_i = eps / (lprobs.size(-1) - 1)
    loss = (1.0 - eps - eps_i) * nll + eps_i * -lprobs.sum(-1)
    return loss.sum(), int(keep.sum())


def marian_loss(model, b, eps):
    loss, n = marian_sums(model, b, eps)
    return loss / n, loss.item() / n / math.log(2)


def lr_at(spec: dict, schedule: str, t: int) -> float:
    """The lr of update T + 1: T-Fixup's curve ("nowarmup") or a warmup onto it ("matched"; tfixup/schedules.py)."""
    if schedule == "matched":
        return matched_lr(spec["lr"], DECAY_PERIOD, spec["warmup"], 1e-7, t)
    return nowarmup_lr(spec["lr"], DECAY_PERIOD, t)


def progress(kind: str, rec: dict) -> None:
    """A progress line on stdout, in fairseq's shape (the study's heartbeat reads the last one's num_updates)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} | INFO | {kind} | {json.dumps(rec)}", flush=True)


class Trainer:
    """The loop every family shares: AdamW (fairseq's adam: decoupled weight decay), the arm's schedule set before
    each update, GI-Adam's start where the arm says; curves kept as (update, value); stop on a non-finite loss."""

    def __init__(self, model, spec: dict, device):
        import torch
        self.model, self.spec, self.device, self.arm = model.to(device), spec, device, ARMS[spec["arm"]]
        self.opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=(0.9, 0.98), eps=1e-8,
                                     weight_decay=WEIGHT_DECAY)
        self.updates, self.train_curve, self.valid_curve, self.times, self.status = 0, [], [], [], "ok"

    def step(self, loss_fn, batch) -> bool:
        """One update on BATCH (``loss_fn(model, batch) -> (loss, bits per token)``); False once not finite."""
        import torch
        from tfixup.optim import gi_adam_init_
        t0 = time.time()
        self.model.train()
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.spec, self.arm.schedule, self.updates)
        loss, bits = loss_fn(self.model, {k: v.to(self.device) for k, v in batch.items()})
        if not torch.isfinite(loss):
            self.status = "nan"
            progress("train_inner", {"num_updates": self.updates + 1, "loss": "nan"})
            return False
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.updates == 0 and self.arm.optimizer == "giadam":
            gi_adam_init_(self.opt)
        self.opt.step()
        self.updates += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.time() - t0)
        self.train_curve.append((self.updates, round(bits, 4)))
        return True

    def log_train(self, epoch: int) -> None:
        recent = [b for _, b in self.train_curve[-50:]]
        progress("train_inner", {"epoch": epoch, "num_updates": self.updates, "loss": round(sum(recent) / len(recent), 3),
                                 "lr": f"{self.opt.param_groups[0]['lr']:.3g}"})

    def validate(self, batches, sums) -> None:
        """The valid loss in bits per token over BATCHES (``sums(model, batch) -> (summed loss, tokens)``)."""
        import torch
        self.model.eval()
        total, tokens = 0.0, 0
        with torch.no_grad():
            for b in batches:
                loss, n = sums(self.model, {k: v.to(self.device) for k, v in b.items()})
                total, tokens = total + loss.item(), tokens + n
        value = total / tokens / math.log(2)
        self.valid_curve.append((self.updates, round(value, 4)))
        progress("valid", {"valid_loss": round(value, 4), "valid_num_updates": self.updates})
        if not math.isfinite(value):
            self.status = "nan"


def loop(tr: Trainer, epoch_batches, loss_fn, valid: tuple, epochs=math.inf, updates=math.inf, every=0) -> int:
    """Epochs of EPOCH_BATCHES(epoch) until EPOCHS or UPDATES, validating on VALID (Trainer.validate's arguments)
    every EVERY updates and at the last, or (EVERY 0) after each epoch and a progress line every 50; how many epochs."""
    epoch = 0
    while epoch < epochs and tr.updates < updates and tr.status == "ok":
        epoch += 1
        for b in epoch_batches(epoch):
            if not tr.step(loss_fn, b):
                break
            if every and (tr.updates % every == 0 or tr.updates == updates):
                tr.log_train(epoch)
                tr.validate(*valid)
            elif not every and tr.updates % 50 == 0:
                tr.log_train(epoch)
            if tr.updates >= updates or tr.status != "ok":
                break
        if not every and tr.status == "ok":
            tr.validate(*valid)
    return epoch


def train_marian(spec: dict, data: pathlib.Path, tr: Trainer) -> dict:
    """Epochs of fairseq's batches, validating (label-smoothed) after each; then the final model's beam search on
    the test sources (shortest first, 100 at a time), BPE removed, scored."""
    import torch
    lines = {"train": spec["train_lines"], "valid": spec["valid_lines"], "test": spec["test_lines"]}
    pairs = {s: (read_split(data, s, SRC, n), read_split(data, s, TGT, n)) for s, n in lines.items()}
    (src, tgt), (vsrc, vtgt), eps = pairs["train"], pairs["valid"], spec["label_smoothing"]
    valid = [translation_tensors(vsrc, vtgt, idx) for idx in translation_batches(vsrc, vtgt, spec["max_tokens"], 0, 0)]
    epochs = loop(tr, lambda epoch: (translation_tensors(src, tgt, idx) for idx in
                                     translation_batches(src, tgt, spec["max_tokens"], spec["seed"], epoch)),
                  lambda m, b: marian_loss(m, b, eps), (valid, lambda m, b: marian_sums(m, b, eps)),
                  epochs=spec["epochs"], updates=spec["max_updates"] or math.inf)
    if tr.status != "ok":
        return {"epochs": epochs}
    src, vocab, t0 = pairs["test"][0], read_vocab(data, TGT), time.time()
    hyps, order = [None] * len(src), sorted(range(len(src)), key=lambda i: len(src[i]))
    tr.model.eval()
    with torch.no_grad():
        for k in range(0, len(order), 100):
            idx = order[k:k + 100]
            s = pad_rows([src[i] for i in idx]).to(tr.device)
            gen = tr.model.generate(input_ids=s, attention_mask=(s != PAD).long(), num_beams=spec["beam"],
                                    length_penalty=spec["lenpen"], max_new_tokens=spec["max_len_b"],
                                    early_stopping=True, do_sample=False, suppress_tokens=[BOS, PAD])
            for i, row in zip(idx, gen.tolist()):
                hyps[i] = to_text(row[1:], vocab)  # after the </s> that starts the decoder
    return {"epochs": epochs, "test": {**test_scores(hyps, data), "beam": spec["beam"], "lenpen": spec["lenpen"],
                                       "decode_wall_s": round(time.time() - t0, 1), "hypotheses": hyps}}


def test_scores(hyps: list, data: pathlib.Path) -> dict:
    """harness/score.py's tokenized BLEU of the hypotheses (BPE removed) and detokenized, lowercased sacreBLEU;
    without sacremoses (a GPU machine) the latter is None, filled in by --report-only where it is installed."""
    from harness import score
    vocab = read_vocab(data, TGT)
    refs = [to_text(t, vocab, escape_unk=True) for t in read_split(data, "test", TGT, len(hyps))]
    raw = (data / f"test.raw.{TGT}").read_text(encoding="utf-8").splitlines()[:len(hyps)]
    out = {"sentences": len(hyps), "bleu_tok": round(score.tokenized_bleu(hyps, refs, False), 2),
           "bleu_detok": None, "sacrebleu_signature": None}
    try:
        detok, out["sacrebleu_signature"] = score.detok_bleu(score.detokenize(hyps, TGT), raw, lowercase=True)
        out["bleu_detok"] = round(detok, 2)
    except ImportError:
        pass
    return out


def train_lm(spec: dict, data: pathlib.Path, tr: Trainer) -> dict:
    """GPT-2, Llama: rows of one stream, next-token loss; valid on every valid token."""
    import torch
    import torch.nn.functional as F
    block = spec["tokens_per_sample"]
    x, y = lm_blocks(read_split(data, "train", TGT, spec["train_lines"]), block, pad_tail=False)
    vx, vy = lm_blocks(read_split(data, "valid", TGT, spec["valid_lines"]), block, pad_tail=True)
    gen, rows = torch.Generator().manual_seed(spec["seed"]), max(1, spec["max_tokens"] // block)

    def loss_fn(model, b):
        loss = F.cross_entropy(model(input_ids=b["x"]).logits.float().flatten(0, 1), b["y"].flatten())
        return loss, loss.item() / math.log(2)

    def valid_sums(model, b):  # the last row padded at its end
        logits = model(input_ids=b["x"], attention_mask=(b["x"] != PAD).long()).logits.float()
        return (F.cross_entropy(logits.flatten(0, 1), b["y"].flatten(), ignore_index=PAD, reduction="sum"),
                int((b["y"] != PAD).sum()))

    valid = [{"x": vx[k:k + 64], "y": vy[k:k + 64]} for k in range(0, len(vx), 64)]
    epochs = loop(tr, lambda _: ({"x": x[i], "y": y[i]} for i in batches_of(len(x), rows, gen)), loss_fn,
                  (valid, valid_sums), updates=spec["updates"], every=spec["valid_every"])
    return {"epochs": epochs, "valid_tokens": int((vy != PAD).sum())}


def train_bert(spec: dict, data: pathlib.Path, tr: Trainer) -> dict:
    """BERT: <s> (as [CLS]) + each sentence with its </s>, cut to max_len, masked; the same valid masks every run."""
    import torch
    import torch.nn.functional as F
    vocab = len(read_vocab(data, TGT))
    train, valid = ([np.concatenate([[BOS], s])[:spec["max_len"]] for s in read_split(data, split, TGT, n)]
                    for split, n in (("train", spec["train_lines"]), ("valid", spec["valid_lines"])))
    gen, fixed = torch.Generator().manual_seed(spec["seed"]), torch.Generator().manual_seed(12345)

    def batch(rows, generator):  # mask_prob of ordinary tokens are targets: 80 % [MASK] (id vocab), 10 % random
        ids = pad_rows(rows)
        target = (ids > UNK) & (torch.rand(ids.shape, generator=generator) < spec["mask_prob"])
        labels = torch.where(target, ids, torch.full_like(ids, -100))
        r = torch.rand(ids.shape, generator=generator)
        inputs = ids.clone()
        inputs[target & (r < 0.8)] = vocab
        rand = target & (r >= 0.8) & (r < 0.9)
        inputs[rand] = torch.randint(UNK + 1, vocab, ids.shape, generator=generator)[rand]
        return {"inputs": inputs, "labels": labels, "mask": (ids != PAD).long()}

    def masked_sums(model, b):
        logits = model(input_ids=b["inputs"], attention_mask=b["mask"]).logits.float()
        return (F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100, reduction="sum"),
                int((b["labels"] != -100).sum()))

    def loss_fn(model, b):
        total, n = masked_sums(model, b)
        loss = total / max(1, n)
        return loss, loss.item() / math.log(2)

    vbatches = [batch(valid[k:k + 128], fixed) for k in range(0, len(valid), 128)]
    epochs = loop(tr, lambda _: (batch([train[i] for i in idx.tolist()], gen)
                                 for idx in batches_of(len(train), spec["batch"], gen)), loss_fn,
                  (vbatches, masked_sums), updates=spec["updates"], every=spec["valid_every"])
    return {"epochs": epochs, "valid_masked_tokens": sum(int((b["labels"] != -100).sum()) for b in vbatches)}


TRAIN = {"marian": train_marian, "gpt2": train_lm, "llama": train_lm, "bert": train_bert}


def run_one(spec: dict, data: pathlib.Path, device: str, threads: int) -> dict:
    """Build, change as its arm says, train and evaluate one run in this process; what it measured, its curves
    (valid; train in windows of 10 updates, mean bits per token)."""
    import torch
    torch.set_num_threads(threads)
    dev = torch.device(device)
    model, out = make_model(spec, data)
    tr, t0 = Trainer(model, spec, dev), time.time()
    out.update(TRAIN[spec["family"]](spec, data, tr))
    windows = [tr.train_curve[k:k + 10] for k in range(0, len(tr.train_curve), 10)]
    out.update(status=tr.status, updates=tr.updates, valid_curve=tr.valid_curve, wall_s=round(time.time() - t0, 1),
               train_curve=[(w[-1][0], round(sum(b for _, b in w) / len(w), 4)) for w in windows],
               s_per_update=round(statistics.median(tr.times), 4) if tr.times else None,
               machine={**common.machine(), "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                        "transformers": importlib.metadata.version("transformers"), "threads": threads})
    return out


def execute(run: runlib.Run, work: pathlib.Path, failed: pathlib.Path, device: str, threads: int,
            in_process: bool = False) -> dict:
    """One run in its own process (``hf one``; IN_PROCESS: in this one, for the tests), its output in WORK/ID/train.log;
    its record. A run that fails leaves FAILED/ID.json (its error, the log's tail), which is no result."""
    rundir = work / run.id
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    spec = json.loads(run.args[0])
    atomic.write_json(rundir / "spec.json", spec)
    cmd = [sys.executable, "-m", "harness.bench.hf", "one", "--spec", rundir / "spec.json", "--data", run.data,
           "--device", device, "--threads", threads, "--result", rundir / "result.json"]

    def here(cmd, log, env):  # ``one``'s command in this process, its output in LOG; 1 on an exception
        with open(log, "w") as f, contextlib.redirect_stdout(f):
            try:
                return one_main([str(c) for c in cmd[cmd.index("one") + 1:]])
            except Exception:
                traceback.print_exc(file=f)
                return 1

    t0 = time.time()
    rc = (here if in_process else runlib.run_logged)(cmd, rundir / "train.log", common.run_env(threads))
    record = {"id": run.id, **run.meta, "key": run.key(), "command": common.command_line(),
              "run_command": " ".join(shlex.quote(str(c)) for c in cmd), "config": spec,
              "data": common.data_description(pathlib.Path(run.data)), "returncode": rc,
              "process_wall_s": round(time.time() - t0, 1)}
    if rc == 0 and (rundir / "result.json").is_file():
        record.update(json.loads((rundir / "result.json").read_text()))
        (failed / f"{run.id}.json").unlink(missing_ok=True)
        return record
    tail = (rundir / "train.log").read_text(errors="replace").strip().splitlines()[-20:]
    record.update(status="error", error_tail=tail)
    if not runlib._stopping.is_set():  # an interrupted run is no failure
        atomic.write_json(failed / f"{run.id}.json", record)
    return record


def estimate_main(specs: list, data: pathlib.Path, run_id, jobs: int, updates: int = 3) -> int:
    """--estimate: the seconds per update of each run type of SPECS here (the stock model, 1 thread, the runs'
    batches) after one untimed update; with each run's updates, its CPU time: a table and the total."""
    import torch
    torch.set_num_threads(1)
    timed, rows = {}, []
    for spec in specs:
        kind = (spec["family"], spec["layers"])
        if kind not in timed:
            spec1 = {**spec, "arm": BASELINE, "updates": updates + 1, "valid_every": 10 ** 9, "valid_lines": 8}
            tr = Trainer(make_model(spec1, data)[0], spec1, torch.device("cpu"))
            per_epoch, decode_s = None, 0.0
            if spec["family"] == "marian":  # the training part only; the test decoding timed on 20 sentences
                src, tgt = read_split(data, "train", SRC), read_split(data, "train", TGT)
                bs = translation_batches(src, tgt, spec["max_tokens"], 1, 1)
                per_epoch = len(bs)
                for idx in bs[:updates + 1]:
                    tr.step(lambda m, b: marian_loss(m, b, spec["label_smoothing"]), translation_tensors(src, tgt, idx))
                t0 = time.time()
                with torch.no_grad():
                    s = pad_rows(read_split(data, "test", SRC, 20))
                    tr.model.generate(input_ids=s, attention_mask=(s != PAD).long(), num_beams=spec["beam"],
                                      max_new_tokens=30, min_new_tokens=15)
                decode_s = (time.time() - t0) / 20 * len(read_split(data, "test", SRC))
            else:
                TRAIN[spec["family"]](spec1, data, tr)
            timed[kind] = (float(np.median(tr.times[1:])), per_epoch, decode_s)
        s_upd, per_epoch, decode_s = timed[kind]
        n = per_epoch * spec["epochs"] if spec["family"] == "marian" else spec["updates"]
        rows.append([run_id(spec), round(s_upd, 3), n, round(s_upd * n + decode_s)])
    print(common.md_table(["run", "s/update (1 CPU thread)", "updates", "CPU s"], rows))
    total, longest = sum(r[3] for r in rows), max(r[3] for r in rows)
    print(f"\nall {len(rows)} runs: {total / 3600:.1f} CPU hours; with --jobs {jobs} on as many free cores at "
          f"least {max(total / max(jobs, 1), longest) / 3600:.1f} h (the longest run: {longest / 60:.0f} min). "
          f"Measured on {common.machine()['cpu']}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end: a busy machine's seconds are longer")
    return 0


def one_main(argv) -> int:
    """``python -m harness.bench.hf one``: one run in this process, its result written."""
    p = argparse.ArgumentParser(prog="python -m harness.bench.hf one", description="one run (the study starts these)")
    for name in ("--spec", "--data", "--result"):
        p.add_argument(name, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    spec = json.loads(pathlib.Path(a.spec).read_text())
    atomic.write_json(pathlib.Path(a.result), run_one(spec, check_data(pathlib.Path(a.data)), a.device, a.threads))
    return 0


def export_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.hf export",
                                description="write the Multi30k data-bin as token-id arrays the study reads without fairseq")
    p.add_argument("--data-bin", default=str(DATA_BIN),
                   help=f"the quality study's Multi30k De-En data-bin (default {DATA_BIN})")
    p.add_argument("--out", required=True, help="the folder to write (replaced when complete)")
    a = p.parse_args(argv)
    out = export(pathlib.Path(a.data_bin), pathlib.Path(a.out))
    print(f"wrote {out}: {common.data_description(out)}")
    return 0

