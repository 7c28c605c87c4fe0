"""T-Fixup in HuggingFace ``transformers`` models on real data: Marian, GPT-2, Llama and BERT built from configs
(no download), trained with a plain PyTorch loop, ``apply_tfixup(model)`` against the stock model.

Data: Multi30k (../shared/data/multi30k) as the quality study has it, the BPE'd De-En data-bin of
``scripts/prepare-corpus.sh --lowercase --bpe-merges 8000`` (separate De and En dictionaries), exported
once by ``export`` (which needs fairseq) into a folder of token-id arrays, dictionaries and the raw test
references that the training reads with numpy and torch alone; so the study runs where fairseq and
subword-nmt are not installed (a GPU machine: copy the folder there).

  translation  MarianMTModel at the quality study's size and recipe (128-256-4, 6+6 layers, decoder input
               and output embedding shared, dictionaries apart, 4096 tokens per update, dropout 0.3, label
               smoothing 0.1, lr 5e-4, 10 epochs): T-Fixup without warmup against stock Marian (LayerNorm) on
               the matched warmup (W = 400, the quality study's), and T-Fixup with q, k and the attention
               biases drawn as fairseq draws them (what T-Fixup leaves to the framework); the stock model drawn
               as fairseq draws its transformer (the cross-initialisation control). Test: the final
               model, beam 4, length penalty 0.3, BPE removed, tokenized BLEU and sacreBLEU as
               harness/score.py scores fairseq's output; beside the fairseq plugin's runs of the quality
               study (results/bench/quality/runs/multi30k-{tfixup,postln_matched}.json).
  causal LM    GPT2LMHeadModel and LlamaForCausalLM (RMSNorm, SwiGLU, rotary positions, 2 KV heads of 4) at 6
               and 24 layers on the English side (one stream in blocks of 64 tokens, 1024 tokens per update,
               as harness/bench/lm.py): T-Fixup without warmup, the stock model on the matched warmup, the
               stock model without warmup; two seeds at 24 layers. Llama also: DyT and Derf in place of every
               RMSNorm, the stock model with GI-Adam, and the norm-free T-Fixup candidates for its gated MLP
               (docs/derivation.md, section 7.7), at 6 and 24 layers; at 24 each method on an lr grid grown from the
               records (5e-4, 1e-3, 2e-3, doubled or halved while the best lr is at an edge) with a second seed at
               its best lr ("the LLaMA question"); the candidates, plain T-Fixup, keep_mlp_norm and the warmup
               baseline at 48 layers, two seeds. A run's id names its lr where it is not the mode's
               (llama-L24-dyt-lr0.002-s1).
  masked LM    BertForMaskedLM, 6 layers, on the English sentences: the same three arms; perplexity of the
               masked tokens of valid (15 %, the same masks for every run).

Every run: Adam (0.9, 0.98) with decoupled weight decay 1e-4 (fairseq's adam), no clipping; no warmup is
lr*sqrt(P/(P+t)), P = 4000; the matched warmup rises linearly over W updates onto that curve
(tfixup/schedules.py). Each run is a subprocess (``one``) on --device, its record written when it ends:
OUT/hf/runs/RUN.json (command, machine, date, data, the resolved config); a run that fails leaves
OUT/hf/failed/RUN.json with its error instead, the others go on, and the next start tries it again. The lr grid
grows from the records, so a command runs in rounds (--rounds) until its runs call for no more; --select GLOB runs
the planned runs whose ids match.

    python -m harness.bench.hf export --out work/hf-data        # here, once (fairseq)
    python -m harness.bench.hf --estimate --data work/hf-data   # CPU seconds per update of each run type
    python -m harness.bench.hf --smoke --out /tmp/hf --data work/hf-data
    python -m harness.bench.hf --out results/bench --data work/hf-data --device cuda --jobs 8
    python -m harness.bench.hf --out results/bench --data work/hf-data --select 'llama-L24-*-s2'
"""

import argparse
import fnmatch
import json
import math
import os
import pathlib
import shlex
import shutil
import statistics
import sys
import time
import types
from typing import NamedTuple

from harness.bench import common, runs as runlib
from tfixup import atomic, methods
from tfixup.schedules import matched_lr, nowarmup_lr

STEM = "hf"
BOS, PAD, EOS, UNK = 0, 1, 2, 3  # fairseq's Dictionary
SRC, TGT = "de", "en"
DATA_BIN = pathlib.Path("work/data-bin/multi30k.de-en")
PREPARE = ("bash scripts/prepare-corpus.sh --src de --tgt en --train ../shared/data/multi30k/train "
           "--valid ../shared/data/multi30k/val --test ../shared/data/multi30k/test_2016_flickr --lowercase "
           "--bpe-merges 8000 --out work/data-bin/multi30k.de-en")
# the quality study's fairseq runs of the same recipe (seed 1, Multi30k): T-Fixup, and Post-LN on the matched warmup
FAIRSEQ_RUNS = {arm: common.REPO / "results" / "bench" / "quality" / "runs" / f"multi30k-{name}.json"
                for arm, name in (("tfixup", "tfixup"), ("stock_matched", "postln_matched"))}
DECAY_PERIOD = 4000
FAMILIES = {"marian": "Marian (translation)", "gpt2": "GPT-2 (causal LM)", "llama": "Llama (causal LM)",
            "bert": "BERT (masked LM)"}
class HfArm(NamedTuple):
    """A HuggingFace model's training arm: T-Fixup applied or the model as built (or changed), its schedule and
    its optimizer."""
    label: str
    schedule: str  # "nowarmup" (T-Fixup's curve) or "matched" (a warmup onto it)
    optimizer: str = "adam"  # "adam" (AdamW) or "giadam" (its second moment starts at the first gradient squared)
    norms: str = "kept"  # the model's norms as built ("kept"; a T-Fixup arm's are apply_tfixup's) or "dyt", "derf"


ARMS = {"tfixup": HfArm("T-Fixup, no warmup", "nowarmup"), "stock_matched": HfArm("stock + matched warmup", "matched"),
        "stock": HfArm("stock, no warmup", "nowarmup"),
        # Marian's control for the cross-framework check: T-Fixup leaves q, k and the q/k/v biases as the
        # framework drew them (transformers: N(0, 0.02) and zeros; fairseq: Xavier-uniform with gain 2^-1/2,
        # std 0.0625 at d = 128, and nn.Linear's uniform biases); this arm draws them as fairseq does
        "tfixup_fsqk": HfArm("T-Fixup, no warmup, q/k as fairseq draws them", "nowarmup"),
        # the causal LMs' control for apply_tfixup's sqrt(d) input multiplier (fairseq's embed_scale, which
        # GPT-2 and Llama lack): T-Fixup without it, the stack's input sqrt(d) smaller than the paper's model's
        "tfixup_noscale": HfArm("T-Fixup, no warmup, without the sqrt(d) input multiplier", "nowarmup"),
        # Llama's controls for its gated MLP, down(silu(gate x) * up x), of degree 2 in its input where the
        # paper's blocks are of degree 1 (docs/derivation.md, section 7.6): T-Fixup with the RMSNorm before each
        # MLP kept (apply_tfixup(model, keep_mlp_norm=True)), and T-Fixup on the same model with each MLP
        # computing down(silu(up x)), its gate unused
        "tfixup_mlpnorm": HfArm("T-Fixup, no warmup, the RMSNorm before each gated MLP kept", "nowarmup"),
        "tfixup_nogate": HfArm("T-Fixup, no warmup, the MLP without its gate", "nowarmup"),
        # BERT's control for its masked-LM head (dense, GELU, LayerNorm, then the tied output projection): T-Fixup
        # with that LayerNorm kept, the one norm the paper's model has no counterpart of
        "tfixup_headnorm": HfArm("T-Fixup, no warmup, the masked-LM head's LayerNorm kept", "nowarmup"),
        # the LayerNorm-free methods of 2025-26 on the Llama: every RMSNorm replaced by DyT (the DyT paper's LLaMA
        # scheme: alpha0 per place, a learned scalar after the embedding) or by Derf, on the stock model's
        # recipe (matched warmup); the stock model with GI-Adam and no warmup
        "dyt": HfArm("DyT in place of every RMSNorm + matched warmup", "matched", norms="dyt"),
        "derf": HfArm("Derf in place of every RMSNorm + matched warmup", "matched", norms="derf"),
        "giadam": HfArm("stock, GI-Adam, no warmup", "nowarmup", optimizer="giadam"),
        # norm-free T-Fixup for the gated MLP (docs/derivation.md, section 7.7): apply_tfixup's gated_mlp options,
        # and plain T-Fixup with GI-Adam (the optimizer's first updates bounded instead)
        "tfixup_sigmoid": HfArm("T-Fixup, no warmup, the gate bounded (sigmoid)", "nowarmup"),
        "tfixup_gatescale": HfArm("T-Fixup, no warmup, each gated MLP's output times 1/N", "nowarmup"),
        "tfixup_giadam": HfArm("T-Fixup, GI-Adam, no warmup", "nowarmup", optimizer="giadam"),
        # Marian's cross-initialisation control (issue 49): the stock Post-LN Marian drawn as fairseq draws its
        # transformer (embeddings N(0, d^-1/2), q/k/v Xavier gain 2^-1/2, out_proj Xavier, fc1/fc2 nn.Linear's)
        "stock_fsinit": HfArm("stock + matched warmup, fairseq's initialisation", "matched")}
GATED_MLP = {"tfixup_sigmoid": "sigmoid", "tfixup_gatescale": "scaled"}  # arm -> apply_tfixup's gated_mlp
# DyT's alpha0 for each place of a LLaMA (before attention, before the MLP, the final norm): the DyT repository's
# LLaMA 2 recipes give 0.8 / 0.2 / 0.2 at width 4096 (7B), 0.6 / 0.15 / 0.15 at 5120, 0.2 / 0.05 / 0.05 at 8192:
# smaller where wider. The study's width, 128, is below the table; the narrowest row's values are used.
DYT_ALPHA0 = {"attention": 0.8, "mlp": 0.2, "final": 0.2}
DERF_ALPHA0, DERF_SHIFT0 = 0.5, 0.0  # Derf's defaults (gamma * erf(alpha x + s) + beta), at every place
NO_MULTIPLIER = ("gpt2", "llama", "bert")  # families that get apply_tfixup's input multiplier
BASELINE = "stock_matched"
NORM_FREE = ["tfixup_sigmoid", "tfixup_gatescale", "tfixup_giadam"]  # the norm-free T-Fixup candidates
NEW_LLAMA_ARMS = ["dyt", "derf", "giadam", *NORM_FREE]
LR_ARMS = [BASELINE, "tfixup_mlpnorm", "dyt", "derf", "giadam", *NORM_FREE]  # each at its own best lr
# the lm settings that say which runs there are, not how a run trains (kept out of each run's spec)
LM_PLAN_KEYS = ("depths", "deep_seeds", "families", "arms", "control_arms", "gate_arms", "new_arms", "lr_grid",
                "deeper", "llama_seed_controls")

MODES = {
    "smoke": {
        "marian": dict(d=16, ffn=32, heads=2, layers=1, max_tokens=400, epochs=1, max_updates=3, lr=5e-4,
                       warmup=2, dropout=0.3, label_smoothing=0.1, beam=2, lenpen=0.3, max_len_b=8,
                       train_lines=64, valid_lines=16, test_lines=4,
                       arms=["tfixup", BASELINE, "tfixup_fsqk", "stock_fsinit"]),
        "lm": dict(d=16, ffn=32, heads=2, depths=[2], deep_seeds=[1], updates=4, valid_every=2, warmup=2, lr=1e-3,
                   tokens_per_sample=16, max_tokens=64, dropout=0.1, train_lines=64, valid_lines=16,
                   families=["gpt2", "llama"], arms=["tfixup", BASELINE], control_arms=["tfixup_noscale"],
                   gate_arms=["tfixup_mlpnorm", "tfixup_nogate"], new_arms=NEW_LLAMA_ARMS,
                   lr_grid=dict(depth=2, lrs=[1e-3, 2e-3], min_lr=1e-3, max_lr=2e-3, seeds=[1], arms=["giadam"]),
                   deeper=dict(depth=3, seeds=[1], arms=["tfixup_sigmoid"])),
        "bert": dict(d=16, ffn=32, heads=2, layers=2, updates=4, valid_every=2, warmup=2, lr=5e-4, batch=8,
                     max_len=32, mask_prob=0.15, dropout=0.1, train_lines=64, valid_lines=16,
                     arms=["tfixup", BASELINE], control_arms=["tfixup_headnorm"]),
    },
    # the quality study's translation recipe; the LM and BERT sizes of harness/bench/lm.py (128-512-4,
    # 1024 tokens per update) with 1000 updates, W a quarter of them as there
    "default": {
        "marian": dict(d=128, ffn=256, heads=4, layers=6, max_tokens=4096, epochs=10, max_updates=0, lr=5e-4,
                       warmup=400, dropout=0.3, label_smoothing=0.1, beam=4, lenpen=0.3, max_len_b=200,
                       train_lines=0, valid_lines=0, test_lines=0,
                       arms=["tfixup", BASELINE, "tfixup_fsqk", "stock_fsinit"]),
        # Llama also: the new arms at 6 and 24 layers; at 24 each method's lr grid (from 5e-4, 1e-3, 2e-3, grown
        # while the best lr is at its edge) and a second seed at its best lr; the norm-free candidates at 48
        "lm": dict(d=128, ffn=512, heads=4, depths=[6, 24], deep_seeds=[1, 2], updates=1000, valid_every=25,
                   warmup=250, lr=1e-3, tokens_per_sample=64, max_tokens=1024, dropout=0.1, train_lines=0,
                   valid_lines=0, families=["gpt2", "llama"], arms=["tfixup", BASELINE, "stock"],
                   control_arms=["tfixup_noscale"], gate_arms=["tfixup_mlpnorm", "tfixup_nogate"],
                   new_arms=NEW_LLAMA_ARMS, llama_seed_controls=["tfixup_noscale"],  # its later seeds too
                   lr_grid=dict(depth=24, lrs=[5e-4, 1e-3, 2e-3], min_lr=1.25e-4, max_lr=8e-3, seeds=[1, 2],
                                arms=LR_ARMS),
                   deeper=dict(depth=48, seeds=[1, 2], arms=[*NORM_FREE, "tfixup", "tfixup_mlpnorm", BASELINE])),
        "bert": dict(d=128, ffn=512, heads=4, layers=6, updates=1000, valid_every=25, warmup=250, lr=5e-4,
                     batch=64, max_len=64, mask_prob=0.15, dropout=0.1, train_lines=0, valid_lines=0,
                     arms=["tfixup", BASELINE, "stock"], control_arms=["tfixup_headnorm"]),
    },
}
WEIGHT_DECAY = 1e-4


# ---------------------------------------------------------------- export (here, with fairseq)


def export(data_bin: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """The data-bin's token ids (fairseq's own reader) as OUT/{train,valid,test}.npz (per language: the ids
    of all sentences in a row, ``LANG``, and where each starts, ``LANG_offsets``), the dictionaries as symbol
    lists (OUT/vocab.LANG.txt, a symbol a line, line i = id i), the raw test references and meta.json;
    published whole or not at all (tfixup.atomic.write_folder)."""
    import numpy as np
    from fairseq.data import Dictionary, data_utils

    for f in (f"dict.{SRC}.txt", f"dict.{TGT}.txt", f"test.raw.{TGT}"):
        if not (data_bin / f).is_file():
            common.die(f"{data_bin}: no {f}, not the Multi30k De-En data-bin; make it with: {PREPARE}")
    def write(tmp: pathlib.Path) -> None:
        counts = {}
        for lang in (SRC, TGT):
            d = Dictionary.load(str(data_bin / f"dict.{lang}.txt"))
            (tmp / f"vocab.{lang}.txt").write_text("".join(s + "\n" for s in d.symbols), encoding="utf-8")
        for split in ("train", "valid", "test"):
            arrays = {}
            for lang in (SRC, TGT):
                d = Dictionary.load(str(data_bin / f"dict.{lang}.txt"))
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
        meta = {"source": str(data_bin.resolve()), "sentences": counts, "langs": [SRC, TGT],
                "vocab": {lang: len((tmp / f"vocab.{lang}.txt").read_text(encoding="utf-8").splitlines())
                          for lang in (SRC, TGT)},
                "parameters": manifest.get("params"), "source_manifest": manifest,
                "made_by": "python -m harness.bench.hf export"}
        atomic.write_json(tmp / "meta.json", meta)

    return atomic.write_folder(out, write)


# ---------------------------------------------------------------- the data, as the runs read it (numpy, torch)


def check_data(path: pathlib.Path) -> pathlib.Path:
    if not (path / "meta.json").is_file():
        common.die(f"--data {path}: not an exported folder (no meta.json); make it here with: "
                   f"python -m harness.bench.hf export --out {path}")
    return path


def read_split(data: pathlib.Path, split: str, lang: str, lines: int = 0) -> list:
    """A split's sentences as int64 numpy arrays (each ending with </s>), the first LINES (0: all)."""
    import numpy as np

    with np.load(data / f"{split}.npz") as z:
        ids, offsets = z[lang].astype(np.int64), z[f"{lang}_offsets"]
    n = len(offsets) - 1 if not lines else min(lines, len(offsets) - 1)
    return [ids[offsets[i]:offsets[i + 1]] for i in range(n)]


def read_vocab(data: pathlib.Path, lang: str) -> list:
    return (data / f"vocab.{lang}.txt").read_text(encoding="utf-8").splitlines()


def to_text(ids, vocab: list, escape_unk: bool = False) -> str:
    """fairseq's ``Dictionary.string`` with --remove-bpe: symbols up to </s>, "@@ " joins removed;
    ESCAPE_UNK: <unk> as fairseq-generate writes a reference's (<<unk>>)."""
    words = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i in (BOS, PAD):
            continue
        words.append("<<unk>>" if escape_unk and i == UNK else vocab[i])
    return (" ".join(words) + " ").replace("@@ ", "").rstrip()


def data_description(data: pathlib.Path) -> str:
    meta = json.loads((data / "meta.json").read_text())
    params = meta.get("parameters") or {}
    return (f"Multi30k De-En ({', '.join(f'{k} {v}' for k, v in meta['sentences'].items())} sentence pairs; test "
            f"= test_2016_flickr), Moses-tokenized, lowercased, {params.get('bpe_merges', 8000)} joint BPE merges, "
            f"dictionaries de {meta['vocab']['de']} / en {meta['vocab']['en']} (the quality study's data-bin, "
            f"exported by `python -m harness.bench.hf export`); LM and BERT: its English side")


# ---------------------------------------------------------------- models (transformers, from configs)


def build_model(spec: dict, vocab: dict):
    """The family's HuggingFace model at the run's size, randomly initialised as transformers does."""
    f, d, layers, heads = spec["family"], spec["d"], spec["layers"], spec["heads"]
    if f not in FAMILIES:
        raise ValueError(f"unknown model family {f!r}: one of {', '.join(FAMILIES)}")
    import transformers as hf

    if f == "marian":
        # fairseq's transformer as the quality study trains it: ReLU, sinusoidal positions, embeddings
        # scaled by sqrt(d), decoder input = output embedding, dictionaries apart, </s> starts the decoder
        return hf.MarianMTModel(hf.MarianConfig(
            vocab_size=vocab[SRC], decoder_vocab_size=vocab[TGT], share_encoder_decoder_embeddings=False,
            tie_word_embeddings=True, d_model=d, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=spec["ffn"],
            decoder_ffn_dim=spec["ffn"], activation_function="relu", dropout=spec["dropout"],
            attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=1024, scale_embedding=True,
            pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=EOS,
            forced_eos_token_id=EOS))
    if f == "gpt2":
        return hf.GPT2LMHeadModel(hf.GPT2Config(
            vocab_size=vocab[TGT], n_positions=spec["tokens_per_sample"], n_embd=d, n_layer=layers, n_head=heads,
            n_inner=spec["ffn"], resid_pdrop=spec["dropout"], embd_pdrop=spec["dropout"], attn_pdrop=0.0,
            bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True))
    if f == "llama":  # LLaMA has no dropout
        return hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=vocab[TGT], hidden_size=d, intermediate_size=spec["ffn"], num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads // 2,
            max_position_embeddings=spec["tokens_per_sample"],
            tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS))
    if f == "bert":  # one more symbol: [MASK]
        return hf.BertForMaskedLM(hf.BertConfig(
            vocab_size=vocab[TGT] + 1, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=spec["ffn"], hidden_dropout_prob=spec["dropout"],
            attention_probs_dropout_prob=spec["dropout"], max_position_embeddings=spec["max_len"],
            type_vocab_size=1, pad_token_id=PAD, tie_word_embeddings=True))


def with_tfixup(model, input_scale: bool = True, keep_mlp_norm: bool = False, gated_mlp=None) -> dict:
    """T-Fixup on a stock model: the project's one call. Returns what it scaled (name -> factor)."""
    from tfixup import apply_tfixup

    return apply_tfixup(model, input_scale=input_scale, keep_mlp_norm=keep_mlp_norm, gated_mlp=gated_mlp)


def fairseq_qk_(model) -> int:
    """What T-Fixup leaves of each attention drawn again as fairseq's MultiheadAttention draws it: the q and k
    weights Xavier-uniform with gain 2^-1/2, the q, k and v biases as nn.Linear draws them (uniform,
    +-fan_in^-1/2); how many attentions."""
    import torch

    n = 0
    with torch.no_grad():
        for m in model.modules():
            if all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj")):
                for lin in (m.q_proj, m.k_proj):
                    torch.nn.init.xavier_uniform_(lin.weight, gain=2 ** -0.5)
                for lin in (m.q_proj, m.k_proj, m.v_proj):
                    bound = lin.weight.shape[1] ** -0.5
                    torch.nn.init.uniform_(lin.bias, -bound, bound)
                n += 1
    return n


def fairseq_init_(model) -> int:
    """Marian drawn as fairseq draws its Post-LN transformer (fairseq 0.12: TransformerModel's embeddings,
    MultiheadAttention.reset_parameters, the layers' nn.Linear fc1/fc2): token embeddings N(0, d^-1/2) with the
    padding row zero; q, k and v weights Xavier-uniform with gain 2^-1/2 and their biases nn.Linear's uniform draw;
    out_proj Xavier-uniform (gain 1) with a zero bias; fc1 and fc2 nn.Linear's own draw (Kaiming-uniform,
    a = sqrt(5), uniform biases). LayerNorms (ones, zeros) and the sinusoidal positions are the same in both; the
    output projection is the decoder's embedding (tied). How many attentions."""
    import torch

    base = model.base_model
    n = fairseq_qk_(model)  # q, k weights; q, k, v biases
    with torch.no_grad():
        for stack in (base.encoder, base.decoder):
            emb = stack.embed_tokens
            torch.nn.init.normal_(emb.weight, mean=0.0, std=emb.weight.shape[1] ** -0.5)
            emb.weight[PAD].zero_()
            for layer in stack.layers:
                for attn in [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else []):
                    torch.nn.init.xavier_uniform_(attn.v_proj.weight, gain=2 ** -0.5)
                    torch.nn.init.xavier_uniform_(attn.out_proj.weight)
                    torch.nn.init.zeros_(attn.out_proj.bias)
                layer.fc1.reset_parameters()
                layer.fc2.reset_parameters()
    return n


def pointwise_norm(kind: str, width: int, alpha0: float, shift0: float = 0.0):
    """The LayerNorm-free replacement of a norm of WIDTH channels (an ``nn.Module``): DyT (KIND "dyt"),
    ``gamma * tanh(alpha x) + beta`` (Zhu et al., CVPR 2025), or Derf ("derf"), ``gamma * erf(alpha x + s) + beta``
    (Dec 2025); alpha (from ALPHA0) and s (from SHIFT0) learned scalars, gamma (ones) and beta (zeros) per channel."""
    import torch

    class Pointwise(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kind = kind
            self.alpha = torch.nn.Parameter(torch.full((1,), float(alpha0)))
            self.shift = torch.nn.Parameter(torch.full((1,), float(shift0))) if kind == "derf" else None
            self.weight = torch.nn.Parameter(torch.ones(width))
            self.bias = torch.nn.Parameter(torch.zeros(width))

        def forward(self, x):
            if self.kind == "dyt":
                return self.weight * torch.tanh(self.alpha * x) + self.bias
            return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias

        def extra_repr(self):
            return f"{kind}, width {width}, alpha0 {alpha0}" + (f", s0 {shift0}" if kind == "derf" else "")

    if kind not in ("dyt", "derf"):
        raise ValueError(f"unknown element-wise norm {kind!r}: dyt or derf")
    return Pointwise()


class LearnedScale:
    """A forward hook: the module's output times its learned scalar ``module.learned_scale``."""

    def __call__(self, module, args, output):
        return output * module.learned_scale


def pointwise_norms_(model, kind: str, alpha0: dict, shift0: float = 0.0) -> int:
    """Every RMSNorm of a Llama replaced by DyT or Derf (KIND) with alpha0[place] (place: "attention" for
    input_layernorm, "mlp" for post_attention_layernorm, "final" for the last norm), and a learned scalar on the
    token embedding's output, initialised to sqrt(d) (the DyT LLaMA recipe: the stream's input at the scale an
    RMSNorm's output has, where the element-wise functions need it); how many norms."""
    import torch

    base = model.base_model
    d = base.embed_tokens.weight.shape[1]

    def make(norm, place):
        return pointwise_norm(kind, norm.weight.shape[0], alpha0[place], shift0)

    for layer in base.layers:
        layer.input_layernorm = make(layer.input_layernorm, "attention")
        layer.post_attention_layernorm = make(layer.post_attention_layernorm, "mlp")
    base.norm = make(base.norm, "final")
    base.embed_tokens.learned_scale = torch.nn.Parameter(torch.full((1,), d ** 0.5))
    base.embed_tokens.register_forward_hook(LearnedScale())
    return 2 * len(base.layers) + 1


def gi_adam_init_(opt) -> int:
    """GI-Adam (Kalra & Barkeshli, 2024) on a torch Adam/AdamW before its first step: each parameter's second
    moment starts at its first gradient squared instead of zero (the first moment at zero, bias corrections kept),
    so that the first updates are about lr * sqrt(1 - beta2^t) per parameter instead of lr; how many tensors."""
    import torch

    n = 0
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            state = opt.state[p]
            if state:
                raise ValueError("gi_adam_init_: the optimizer has stepped already; call it before its first step")
            state["step"] = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                         else torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = p.grad.detach().clone().pow_(2)
            n += 1
    return n


# ---------------------------------------------------------------- batches


def pad_rows(rows: list, pad: int = PAD):
    import torch

    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r)
    return out


def translation_batches(src: list, tgt: list, max_tokens: int, seed: int, epoch: int) -> list:
    """fairseq's batching of a language pair: sentences by source then target length (ties at random),
    greedily into batches of at most MAX_TOKENS (longest side x sentences), in a random order per epoch."""
    import numpy as np

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
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def translation_tensors(src: list, tgt: list, idx: list) -> dict:
    """Source with its mask; decoder input </s> + target without its </s> (fairseq's prev_output_tokens)."""
    import numpy as np

    s = pad_rows([src[i] for i in idx])
    t = pad_rows([tgt[i] for i in idx])
    prev = pad_rows([np.concatenate([[EOS], tgt[i][:-1]]) for i in idx])
    return {"input_ids": s, "attention_mask": (s != PAD).long(), "decoder_input_ids": prev, "labels": t}


def lm_blocks(sents: list, block: int, pad_tail: bool):
    """One stream of the sentences (each ending in </s>) in rows of BLOCK tokens and their next tokens;
    PAD_TAIL: the last part-filled row too, its missing targets PAD (valid: every token is scored)."""
    import numpy as np
    import torch

    stream = np.concatenate(sents)
    n = (len(stream) - 1) // block
    x = stream[:n * block].reshape(n, block)
    y = stream[1:n * block + 1].reshape(n, block)
    rest = len(stream) - 1 - n * block
    if pad_tail and rest:
        tx, ty = np.full((1, block), PAD), np.full((1, block), PAD)
        tx[0, :rest], ty[0, :rest] = stream[n * block:-1], stream[n * block + 1:]
        x, y = np.concatenate([x, tx]), np.concatenate([y, ty])
    return torch.as_tensor(x), torch.as_tensor(y)


def bert_rows(sents: list, max_len: int) -> list:
    """<s> (as [CLS]) + the sentence with its </s>, cut to MAX_LEN."""
    import numpy as np

    return [np.concatenate([[BOS], s])[:max_len] for s in sents]


def bert_masked(ids, vocab_size: int, prob: float, generator):
    """BERT's masking of the ordinary tokens: PROB of them are targets, of which 80 % become [MASK] (id
    VOCAB_SIZE), 10 % a random ordinary token, 10 % stay. (inputs, labels with -100 off the targets)."""
    import torch

    ordinary = ids > UNK
    target = ordinary & (torch.rand(ids.shape, generator=generator) < prob)
    labels = torch.where(target, ids, torch.full_like(ids, -100))
    r = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[target & (r < 0.8)] = vocab_size
    rand = target & (r >= 0.8) & (r < 0.9)
    inputs[rand] = torch.randint(UNK + 1, vocab_size, ids.shape, generator=generator)[rand]
    return inputs, labels


# ---------------------------------------------------------------- one run (``one``: in its own process)


def smoothed_loss(logits, target, eps: float):
    """fairseq's label_smoothed_cross_entropy, summed over the non-pad targets: (loss, nll, tokens)."""
    import torch

    lprobs = torch.log_softmax(logits.float(), dim=-1).flatten(0, -2)
    target = target.flatten()
    keep = target != PAD
    lprobs, target = lprobs[keep], target[keep]
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    smooth = -lprobs.sum(-1)
    eps_i = eps / (lprobs.size(-1) - 1)
    loss = (1.0 - eps - eps_i) * nll + eps_i * smooth
    return loss.sum(), nll.sum(), int(keep.sum())


class Trainer:
    """The loop every family shares: AdamW (fairseq's adam: decoupled weight decay), the run's schedule set
    before each update, a JSON line per logged update and per validation (fairseq's shape, so
    harness/fairseq_log.py reads them), stop on a non-finite loss."""

    def __init__(self, model, spec: dict, device):
        import torch

        self.model, self.spec, self.device = model.to(device), spec, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=(0.9, 0.98), eps=1e-8,
                                     weight_decay=WEIGHT_DECAY)
        self.updates, self.train_curve, self.valid_curve, self.times = 0, [], [], []
        self.status = "ok"

    def lr_at(self, t: int) -> float:
        s = self.spec
        if ARMS[s["arm"]].schedule == "matched":
            return matched_lr(s["lr"], DECAY_PERIOD, s["warmup"], 1e-7, t)
        return nowarmup_lr(s["lr"], DECAY_PERIOD, t)

    def step(self, loss_fn, batch) -> bool:
        """One update on BATCH (``loss_fn(model, batch) -> (loss to minimise, bits per token)``); False once
        the loss is not finite."""
        import torch

        t0 = time.time()
        self.model.train()
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at(self.updates)
        loss, bits = loss_fn(self.model, {k: v.to(self.device) for k, v in batch.items()})
        if not torch.isfinite(loss):
            self.status = "nan"
            log_line("train_inner", {"num_updates": self.updates + 1, "loss": "nan"})
            return False
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.updates == 0 and ARMS[self.spec["arm"]].optimizer == "giadam":
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
        log_line("train_inner", {"epoch": epoch, "num_updates": self.updates,
                                 "loss": round(sum(recent) / len(recent), 3),
                                 "lr": f"{self.opt.param_groups[0]['lr']:.3g}"})

    def validate(self, value: float) -> None:
        self.valid_curve.append((self.updates, round(value, 4)))
        log_line("valid", {"valid_loss": round(value, 4), "valid_num_updates": self.updates})
        if not math.isfinite(value):
            self.status = "nan"


def log_line(kind: str, rec: dict) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} | INFO | {kind} | {json.dumps(rec)}", flush=True)


def train_marian(spec: dict, data: pathlib.Path, tr: Trainer) -> dict:
    import torch

    lines = {"train": spec["train_lines"], "valid": spec["valid_lines"], "test": spec["test_lines"]}
    pairs = {s: (read_split(data, s, SRC, n), read_split(data, s, TGT, n)) for s, n in lines.items()}
    eps = spec["label_smoothing"]

    def loss_fn(model, b):
        return _marian_loss(model, b, eps)

    @torch.no_grad()
    def valid_bits():
        tr.model.eval()
        total, tokens = 0.0, 0
        src, tgt = pairs["valid"]
        for idx in translation_batches(src, tgt, spec["max_tokens"], 0, 0):
            b = {k: v.to(tr.device) for k, v in translation_tensors(src, tgt, idx).items()}
            out = tr.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                           decoder_input_ids=b["decoder_input_ids"])
            loss, _, n = smoothed_loss(out.logits, b["labels"], eps)
            total, tokens = total + loss.item(), tokens + n
        return total / tokens / math.log(2)  # fairseq's valid_loss: label-smoothed, bits per token

    src, tgt = pairs["train"]
    epoch = 0
    while epoch < spec["epochs"] and tr.status == "ok":
        epoch += 1
        for idx in translation_batches(src, tgt, spec["max_tokens"], spec["seed"], epoch):
            if not tr.step(loss_fn, translation_tensors(src, tgt, idx)):
                break
            if tr.updates % 50 == 0:
                tr.log_train(epoch)
            if spec["max_updates"] and tr.updates >= spec["max_updates"]:
                break
        if tr.status == "ok":
            tr.validate(valid_bits())
        if spec["max_updates"] and tr.updates >= spec["max_updates"]:
            break
    out = {"epochs": epoch}
    if tr.status == "ok":
        out["test"] = translate_test(tr.model, pairs["test"], spec, data, tr.device)
    return out



def translate_test(model, test: tuple, spec: dict, data: pathlib.Path, device) -> dict:
    """Beam search on the test set (shortest sources first, 100 at a time), BPE removed, scored."""
    import torch

    src, _ = test
    vocab = read_vocab(data, TGT)
    model.eval()
    hyps, t0 = [None] * len(src), time.time()
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    with torch.no_grad():
        for k in range(0, len(order), 100):
            idx = order[k:k + 100]
            s = pad_rows([src[i] for i in idx]).to(device)
            gen = model.generate(input_ids=s, attention_mask=(s != PAD).long(), num_beams=spec["beam"],
                                 length_penalty=spec["lenpen"], max_new_tokens=spec["max_len_b"], early_stopping=True,
                                 do_sample=False, suppress_tokens=[BOS, PAD])
            for i, row in zip(idx, gen.tolist()):
                hyps[i] = to_text(row[1:], vocab)  # after the </s> that starts the decoder
    return {**test_scores(hyps, data), "beam": spec["beam"], "lenpen": spec["lenpen"],
            "decode_wall_s": round(time.time() - t0, 1), "hypotheses": hyps}


def test_scores(hyps: list, data: pathlib.Path) -> dict:
    """harness/score.py's scores of the test hypotheses (tokenized text, BPE removed): tokenized BLEU against
    the data-bin's references, detokenized sacreBLEU (lowercased) against the raw test text; without
    sacremoses (a GPU machine) the latter is None, filled in by --report-only where it is installed."""
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
    import torch
    import torch.nn.functional as F

    block = spec["tokens_per_sample"]
    x, y = lm_blocks(read_split(data, "train", TGT, spec["train_lines"]), block, pad_tail=False)
    vx, vy = lm_blocks(read_split(data, "valid", TGT, spec["valid_lines"]), block, pad_tail=True)
    rows = max(1, spec["max_tokens"] // block)
    gen = torch.Generator().manual_seed(spec["seed"])

    def loss_fn(model, b):
        loss = F.cross_entropy(model(input_ids=b["x"]).logits.float().flatten(0, 1), b["y"].flatten())
        return loss, loss.item() / math.log(2)

    @torch.no_grad()
    def valid_bits():
        tr.model.eval()
        total = 0.0
        for k in range(0, len(vx), 64):
            rows = vx[k:k + 64].to(tr.device)  # the last one padded at its end
            logits = tr.model(input_ids=rows, attention_mask=(rows != PAD).long()).logits.float()
            total += F.cross_entropy(logits.flatten(0, 1), vy[k:k + 64].to(tr.device).flatten(), ignore_index=PAD,
                                     reduction="sum").item()
        return total / int((vy != PAD).sum()) / math.log(2)

    return loop(tr, spec, lambda: (({"x": x[i], "y": y[i]}) for i in batches_of(len(x), rows, gen)), loss_fn,
                valid_bits, {"valid_tokens": int((vy != PAD).sum())})


def train_bert(spec: dict, data: pathlib.Path, tr: Trainer) -> dict:
    import torch
    import torch.nn.functional as F

    vocab = len(read_vocab(data, TGT))
    train = bert_rows(read_split(data, "train", TGT, spec["train_lines"]), spec["max_len"])
    valid = bert_rows(read_split(data, "valid", TGT, spec["valid_lines"]), spec["max_len"])
    gen, fixed = torch.Generator().manual_seed(spec["seed"]), torch.Generator().manual_seed(12345)
    vbatches = []
    for k in range(0, len(valid), 128):  # the same masks for every run
        ids = pad_rows(valid[k:k + 128])
        vbatches.append((*bert_masked(ids, vocab, spec["mask_prob"], fixed), (ids != PAD).long()))

    def masked_sum(model, inputs, labels, mask):
        logits = model(input_ids=inputs, attention_mask=mask).logits.float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")

    def loss_fn(model, b):
        n = max(1, int((b["labels"] != -100).sum()))
        loss = masked_sum(model, b["inputs"], b["labels"], b["mask"]) / n
        return loss, loss.item() / math.log(2)

    def batch(idx):
        ids = pad_rows([train[i] for i in idx])
        inputs, labels = bert_masked(ids, vocab, spec["mask_prob"], gen)
        return {"inputs": inputs, "labels": labels, "mask": (ids != PAD).long()}

    @torch.no_grad()
    def valid_bits():
        tr.model.eval()
        total = sum(masked_sum(tr.model, *(t.to(tr.device) for t in b)).item() for b in vbatches)
        return total / sum(int((b[1] != -100).sum()) for b in vbatches) / math.log(2)

    return loop(tr, spec, lambda: (batch(i.tolist()) for i in batches_of(len(train), spec["batch"], gen)), loss_fn,
                valid_bits, {"valid_masked_tokens": sum(int((b[1] != -100).sum()) for b in vbatches)})


def batches_of(n: int, size: int, gen) -> list:
    """A random order of N rows in full batches of SIZE (an epoch)."""
    import torch

    perm = torch.randperm(n, generator=gen)
    return [perm[k:k + size] for k in range(0, n - size + 1, size)] or [perm]


def loop(tr: Trainer, spec: dict, epoch_batches, loss_fn, valid_bits, extra: dict) -> dict:
    """Epochs of EPOCH_BATCHES() until spec's updates, validating every valid_every updates."""
    epoch = 0
    while tr.updates < spec["updates"] and tr.status == "ok":
        epoch += 1
        for b in epoch_batches():
            if not tr.step(loss_fn, b):
                break
            if tr.updates % spec["valid_every"] == 0 or tr.updates == spec["updates"]:
                tr.log_train(epoch)
                tr.validate(valid_bits())
            if tr.updates >= spec["updates"] or tr.status != "ok":
                break
    return {"epochs": epoch, **extra}


TRAIN = {"marian": train_marian, "gpt2": train_lm, "llama": train_lm, "bert": train_bert}


def norm_modules(model) -> int:
    """Normalisation modules left in the model (LayerNorm, RMSNorm, ...; not DyT or Derf)."""
    return sum(1 for m in model.modules() if "norm" in type(m).__name__.lower())


def kept_norms(model, arm: str) -> list:
    """(module, attribute, norm) of the norms a control arm keeps through apply_tfixup where apply_tfixup has no
    option for it: BERT's masked-LM head's LayerNorm (tfixup_headnorm); else none."""
    if arm == "tfixup_headnorm":
        head = model.cls.predictions.transform
        return [(head, "LayerNorm", head.LayerNorm)]
    return []


def ungate_(model) -> int:
    """Each Llama MLP computes down(silu(up x)), its gate_proj left unused (the tfixup_nogate control); how many."""
    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)))

    for layer in model.model.layers:
        layer.mlp.forward = types.MethodType(forward, layer.mlp)
    return len(model.model.layers)


def make_model(spec: dict, data: pathlib.Path):
    """The run's model as its arm makes it (seeded; the stock model, T-Fixup on it, a control's change) and
    what was done to it."""
    import torch

    torch.manual_seed(spec["seed"])
    model = build_model(spec, {lang: len(read_vocab(data, lang)) for lang in (SRC, TGT)})
    out = {"norm_modules_stock": norm_modules(model)}
    if spec["arm"].startswith("tfixup"):
        kept = kept_norms(model, spec["arm"])
        scaled = with_tfixup(model, spec.get("input_scale", True), keep_mlp_norm=spec["arm"] == "tfixup_mlpnorm",
                             gated_mlp=spec.get("gated_mlp"))
        out["tfixup_scaled"] = {k: round(v, 6) for k, v in scaled.items()}
        for owner, name, norm in kept:
            setattr(owner, name, norm)
    if spec["arm"] == "tfixup_fsqk":
        out["qk_redrawn"] = fairseq_qk_(model)
    if spec["arm"] == "tfixup_nogate":
        out["ungated"] = ungate_(model)
    if spec["arm"] == "stock_fsinit":
        out["fairseq_init_attentions"] = fairseq_init_(model)
    if ARMS[spec["arm"]].norms in ("dyt", "derf"):
        out["pointwise_norms"] = pointwise_norms_(model, spec["norm"], spec["alpha0"], spec.get("shift0", 0.0))
    out.update(norm_modules=norm_modules(model), parameters=sum(p.numel() for p in model.parameters()))
    return model, out


def run_one(spec: dict, data: pathlib.Path, device: str, threads: int) -> dict:
    """Build, (T-Fixup,) train and evaluate one run in this process; what it measured."""
    import importlib.metadata

    if spec.get("family") not in FAMILIES:
        raise ValueError(f"unknown model family {spec.get('family')!r}: one of {', '.join(FAMILIES)}")
    import torch

    torch.set_num_threads(threads)
    dev = torch.device(device)
    model, out = make_model(spec, data)
    tr = Trainer(model, spec, dev)
    t0 = time.time()
    out.update(TRAIN[spec["family"]](spec, data, tr))
    # the train curve in windows of 10 updates (mean bits per token), to keep the record small
    curve = tr.train_curve
    windows = [curve[k:k + 10] for k in range(0, len(curve), 10)]
    out.update(status=tr.status, updates=tr.updates, valid_curve=tr.valid_curve, wall_s=round(time.time() - t0, 1),
               train_curve=[(w[-1][0], round(sum(b for _, b in w) / len(w), 4)) for w in windows],
               s_per_update=round(statistics.median(tr.times), 4) if tr.times else None,
               machine={**common.machine(), "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                        "transformers": importlib.metadata.version("transformers"), "threads": threads})
    return out


# ---------------------------------------------------------------- the study's runs


def make_config(mode: str) -> dict:
    return {**json.loads(json.dumps(MODES[mode])), "mode": mode, "decay_period": DECAY_PERIOD,
            "weight_decay": WEIGHT_DECAY}


def run_id(spec: dict) -> str:
    """e.g. marian-L6-tfixup-s1, llama-L24-stock_matched-s2, llama-L24-dyt-lr0.002-s1: the lr is named where it is
    not the mode's (``lr_in_id``: a run of an lr grid), so the runs at the mode's lr keep their first ids."""
    lr = f"-lr{spec['lr']:g}" if spec.get("lr_in_id") else ""
    return f"{spec['family']}-L{spec['layers']}-{spec['arm']}{lr}-s{spec['seed']}"


def arm_settings(spec: dict) -> dict:
    """SPEC with what its arm sets beyond the study's recipe, so that the record's config says it: apply_tfixup's
    input multiplier where the family has none of its own, the gated-MLP option, the optimizer, the element-wise
    norms' constants, the initialisation. Arms without such settings are left as they were."""
    arm = ARMS[spec["arm"]]
    if spec["family"] in NO_MULTIPLIER and spec["arm"].startswith("tfixup"):
        spec["input_scale"] = spec["arm"] != "tfixup_noscale"
    if spec["arm"] in GATED_MLP:
        spec["gated_mlp"] = GATED_MLP[spec["arm"]]
    if arm.optimizer != "adam":
        spec["optimizer"] = arm.optimizer
    if arm.norms == "dyt":
        spec.update(norm="dyt", alpha0=dict(DYT_ALPHA0), embedding_scalar="learned, sqrt(d) at init")
    if arm.norms == "derf":
        spec.update(norm="derf", alpha0={k: DERF_ALPHA0 for k in DYT_ALPHA0}, shift0=DERF_SHIFT0,
                    embedding_scalar="learned, sqrt(d) at init")
    if spec["arm"] == "stock_fsinit":
        spec["init"] = "fairseq"
    return spec


def best_lr(by_lr: dict):
    """The lr of the lowest best valid loss among the runs (records) that finished without diverging, or None."""
    ok = {lr: best(r.get("valid_curve", []))[1] for lr, r in by_lr.items() if r and r.get("status") == "ok"}
    ok = {lr: v for lr, v in ok.items() if v is not None}
    return min(ok, key=ok.get) if ok else None


def grid_of(g: dict, record_at) -> tuple:
    """An arm's lr grid as the records make it (RECORD_AT(lr): the first seed's record there, or None): the starting
    lrs, doubled while the best is the largest (up to max_lr), halved while it is the smallest or nothing trained
    (down to min_lr). (grid, best lr, closed): closed once every run is in and the best is inside the grid or at a
    bound."""
    grid = sorted(g["lrs"])
    while True:
        got = {lr: record_at(lr) for lr in grid}
        if not all(got.values()):
            return grid, None, False
        b = best_lr(got)
        if (b is None or b == grid[0]) and grid[0] / 2 >= g["min_lr"] * (1 - 1e-9):
            grid.insert(0, grid[0] / 2)
        elif b is not None and b == grid[-1] and grid[-1] * 2 <= g["max_lr"] * (1 + 1e-9):
            grid.append(grid[-1] * 2)
        else:
            return grid, b, True


def lr_grid_specs(lm: dict, base: dict, records: dict) -> list:
    """The Llama lr grid's runs (lm["lr_grid"]) that RECORDS call for: each arm's grid at its first seed, then, once
    the grid is closed, its other seeds at its best lr."""
    g = lm.get("lr_grid")
    if not g:
        return []

    def spec(arm, lr, seed):
        return arm_settings(dict(family="llama", arm=arm, seed=seed, layers=g["depth"], **{**base, "lr": lr},
                                 **({"lr_in_id": True} if lr != base["lr"] else {})))

    out = []
    for arm in g["arms"]:
        grid, b, closed = grid_of(g, lambda lr: records.get(run_id(spec(arm, lr, g["seeds"][0]))))
        out += [spec(arm, lr, g["seeds"][0]) for lr in grid]
        if closed and b is not None:
            out += [spec(arm, b, seed) for seed in g["seeds"][1:]]
    return out


def make_specs(cfg: dict, records: dict = None) -> list:
    """Every run's resolved config, the longest first (so that --jobs N packs them well): Marian, then the
    causal LMs deepest first, then BERT; then Llama's lr grid as RECORDS (id -> record) call for it (without
    records: its starting grid)."""
    m, lm, bert = cfg["marian"], cfg["lm"], cfg["bert"]
    specs = [dict(family="marian", arm=arm, seed=1, **{k: v for k, v in m.items() if k != "arms"}) for arm in m["arms"]]
    lm_keys = {k: v for k, v in lm.items() if k not in LM_PLAN_KEYS}
    deeper = lm.get("deeper")
    if deeper:
        specs += [dict(family="llama", arm=arm, seed=seed, layers=deeper["depth"], **lm_keys)
                  for seed in deeper["seeds"] for arm in deeper["arms"]]
    for depth in sorted(lm["depths"], reverse=True):
        for seed in lm["deep_seeds"] if depth == max(lm["depths"]) else [1]:
            arms = lm["arms"] + (lm.get("control_arms", []) if seed == 1 else [])
            for fam in lm["families"]:
                extra = (lm.get("gate_arms", []) if fam == "llama" else []) + (
                    lm.get("new_arms", []) if fam == "llama" and seed == 1 else []) + (
                    lm.get("llama_seed_controls", []) if fam == "llama" and seed > 1 else [])
                specs += [dict(family=fam, arm=arm, seed=seed, layers=depth, **lm_keys) for arm in arms + extra]
    specs += [dict(family="bert", arm=arm, seed=1, **{k: v for k, v in bert.items() if k not in ("arms", "control_arms")})
              for arm in bert["arms"] + bert.get("control_arms", [])]
    specs = [arm_settings(spec) for spec in specs]
    specs += lr_grid_specs(lm, lm_keys, records or {})
    unique = {}
    for spec in specs:  # the grid's runs at the mode's lr are runs of the study already
        rid = run_id(spec)
        if rid in unique and unique[rid] != spec:
            raise ValueError(f"hf: two runs named {rid} with different configs")
        unique.setdefault(rid, spec)
    return list(unique.values())


def make_runs(cfg: dict, data: pathlib.Path, records: dict = None) -> list:
    return [runlib.Run(run_id(s), {k: s[k] for k in ("family", "arm", "layers", "seed", "lr")},
                       [json.dumps(s, sort_keys=True)], str(data)) for s in make_specs(cfg, records)]


def plan(data, mode: str = "default", records: dict = None) -> list:
    """The study's runs on the exported folder DATA, the lr grid as RECORDS call for it (default: the committed
    records, results/bench/hf/runs; tests/test_bench_plans.py checks them)."""
    if records is None:
        records = runlib.load_records(common.REPO / "results" / "bench" / STEM / "runs")
    return make_runs(make_config(mode), pathlib.Path(data), records)


def execute(run: runlib.Run, work: pathlib.Path, failed: pathlib.Path, device: str, threads: int,
            in_process: bool = False) -> dict:
    """One run in its own process (``python -m harness.bench.hf one``; IN_PROCESS: in this one, for the tests),
    its output in WORK/ID/train.log; its record. A run that fails leaves FAILED/ID.json (its error, the log's
    tail), which is no result."""
    rundir = work / run.id
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    spec = json.loads(run.args[0])
    atomic.write_json(rundir / "spec.json", spec)
    cmd = [sys.executable, "-m", "harness.bench.hf", "one", "--spec", rundir / "spec.json", "--data", run.data,
           "--device", device, "--threads", threads, "--result", rundir / "result.json"]
    env = common.run_env(threads)
    t0 = time.time()
    rc = (_in_process if in_process else runlib.run_logged)(cmd, rundir / "train.log", env)
    record = {"id": run.id, **run.meta, "key": run.key(), "command": common.command_line(),
              "run_command": " ".join(shlex.quote(str(c)) for c in cmd), "config": spec,
              "data": data_description(pathlib.Path(run.data)), "returncode": rc,
              "process_wall_s": round(time.time() - t0, 1)}
    result = rundir / "result.json"
    if rc == 0 and result.is_file():
        record.update(json.loads(result.read_text()))
        (failed / f"{run.id}.json").unlink(missing_ok=True)
        return record
    tail = (rundir / "train.log").read_text(errors="replace").strip().splitlines()[-20:]
    record.update(status="error", error_tail=tail)
    if not runlib._stopping.is_set():  # an interrupted run is no failure
        atomic.write_json(failed / f"{run.id}.json", record)
    return record


def _in_process(cmd: list, log: pathlib.Path, env: dict) -> int:
    """``one``'s command run in this process, its output in LOG; its exit code (1 on an exception)."""
    import contextlib
    import traceback

    with open(log, "w") as f, contextlib.redirect_stdout(f):
        try:
            return one_main([str(c) for c in cmd[cmd.index("one") + 1:]])
        except Exception:
            traceback.print_exc(file=f)
            return 1


# ---------------------------------------------------------------- summary, report, figure


def best(curve: list):
    """(update, value) of the lowest finite value of a curve, or (None, None)."""
    pts = [(u, v) for u, v in curve if v is not None and math.isfinite(v)]
    return min(pts, key=lambda p: p[1]) if pts else (None, None)


def reach(curve: list, target):
    """The first update at which CURVE is at or below TARGET, or None."""
    return None if target is None else next((u for u, v in curve if v is not None and v <= target), None)


def fairseq_references() -> dict:
    """arm -> the quality study's fairseq run of that arm (FAIRSEQ_RUNS), as recorded."""
    return {arm: fairseq_run(path) for arm, path in FAIRSEQ_RUNS.items() if path.is_file()}


def fairseq_run(path: pathlib.Path) -> dict:
    rec = json.loads(path.read_text())
    test = rec.get("test") or {}
    return {"record": str(path.relative_to(common.REPO)), "test_bleu_tok": round(test["bleu_tok"], 2),
            "test_bleu_detok": round(test["bleu_detok"], 2), "signature": test.get("sacrebleu_signature"),
            "best_valid_loss": best(rec["valid_curve"])[1], "updates": rec["valid_curve"][-1][0],
            "epochs": rec.get("epochs"), "valid_curve": rec["valid_curve"],
            "averaged_k": (test.get("averaging") or {}).get("k"),
            "command": rec.get("fairseq_train_command")}


def summarise(cfg: dict, records: dict, data: pathlib.Path, n_runs: int, failed: dict) -> dict:
    rows = []
    for rec in records.values():
        b_at, b_bits = best(rec.get("valid_curve", []))
        row = {k: rec.get(k) for k in ("id", "family", "arm", "layers", "seed", "status", "updates", "epochs",
                                       "s_per_update", "wall_s", "parameters", "norm_modules")}
        curve = [v for _, v in rec.get("valid_curve", [])]
        rises = [b - a for a, b in zip(curve, curve[1:]) if math.isfinite(a) and math.isfinite(b)]
        row.update(lr=(rec.get("config") or {}).get("lr"), lr_in_id=bool((rec.get("config") or {}).get("lr_in_id")),
                   best_valid=b_bits, best_at=b_at, best_ppl=round(2 ** b_bits, 2) if b_bits is not None else None,
                   largest_rise=round(max(rises), 3) if rises and max(rises) > 0 else 0.0,
                   device=(rec.get("machine") or {}).get("device"), scaled=len(rec.get("tfixup_scaled") or {}))
        test = rec.get("test")
        if test:
            if test.get("bleu_detok") is None and data and (data / "meta.json").is_file():
                try:  # scored where sacremoses is (see test_scores)
                    test = {**test, **test_scores(test["hypotheses"], data)}
                except ImportError:
                    pass
            row.update(test_bleu_tok=test["bleu_tok"], test_bleu_detok=test.get("bleu_detok"),
                       signature=test.get("sacrebleu_signature"), test_sentences=test["sentences"])
        rows.append(row)
    # against the stock model on the matched warmup, the same family, depth, seed and lr
    baselines = {(r["family"], r["layers"], r["seed"], r["lr"]): records[r["id"]] for r in rows if r["arm"] == BASELINE}
    for r in rows:
        base = baselines.get((r["family"], r["layers"], r["seed"], r["lr"]))
        b_at, b_best = best(base["valid_curve"]) if base else (None, None)
        u = reach(records[r["id"]].get("valid_curve", []), b_best) if r["status"] == "ok" else None
        r.update(baseline_best_ppl=round(2 ** b_best, 2) if b_best is not None else None, updates_to_baseline_best=u,
                 ratio_to_baseline=round(u / b_at, 3) if u is not None and b_at else None)
    order = list(FAMILIES)
    rows.sort(key=lambda r: (order.index(r["family"]), r["layers"], r["seed"], list(ARMS).index(r["arm"]),
                             r["lr"] or 0))
    res = {"benchmark": "hf", "mode": cfg["mode"], "command": common.command_line(), "machine": common.machine(),
           "threads": cfg.get("threads", 1), "devices": sorted({r["device"] for r in rows if r["device"]}),
           "data": data_description(data) if data and (data / "meta.json").is_file() else str(data),
           "config": cfg, "complete": len(records) == n_runs, "runs_recorded": len(records), "n_runs": n_runs,
           "fairseq": fairseq_references() if cfg["mode"] == "default" else {}, "rows": rows,
           "failed": {k: {"error_tail": v.get("error_tail", [])[-3:], "run_command": v.get("run_command")}
                      for k, v in failed.items() if k not in records},
           "records": records}
    res["llama_question"] = llama_question(res)
    return res


def label(r: dict) -> str:
    grid = (r.get("config") or {}).get("lr_in_id") or r.get("lr_in_id")
    extra = ", ".join(([f"lr {r['lr']:g}"] if grid else []) + ([f"seed {r['seed']}"] if r["seed"] != 1 else []))
    return ARMS[r["arm"]].label + (f" ({extra})" if extra else "")


def report(res: dict) -> str:
    cfg = res["config"]
    m, lm, bert = cfg["marian"], cfg["lm"], cfg["bert"]
    text = runlib.report_head(
        "T-Fixup in HuggingFace transformers models (Marian, GPT-2, Llama, BERT), Multi30k", res, res["n_runs"],
        (f"Runs on: {', '.join(res['devices']) or '-'}. Every model is built from its transformers config "
         f"(random init, no download) and trained by the same plain PyTorch loop: Adam (0.9, 0.98) with "
         f"decoupled weight decay {cfg['weight_decay']:g}, no clipping. Arms: **T-Fixup** = `apply_tfixup(model)` "
         f"on the stock model (its norms removed, its weights redrawn and scaled), no warmup, "
         f"lr*sqrt(P/(P+t)), P = {cfg['decay_period']}; **stock + matched warmup**: the model as transformers "
         f"builds it, linear warmup from 1e-7 over W updates onto the same curve; **stock, no warmup**: that "
         f"model on T-Fixup's schedule. GPT-2, Llama and BERT have no embedding multiplier of their own: "
         f"`apply_tfixup` gives them fairseq's sqrt(d) on the token embedding's output (the paper's model's input); "
         f"**T-Fixup without the sqrt(d) input multiplier** (`apply_tfixup(model, input_scale=False)`, the causal "
         f"LMs' first seed at each depth) is the control. Valid loss in bits per token, perplexity = 2^loss.\n\n"))
    text += ("## Translation: Marian against the fairseq plugin\n\n"
             f"MarianMTModel {m['d']}-{m['ffn']}-{m['heads']}, {m['layers']}+{m['layers']} layers, ReLU, decoder "
             f"input and output embedding shared, {m['max_tokens']} tokens per update, {m['epochs']} epochs, "
             f"dropout {m['dropout']}, label smoothing {m['label_smoothing']}, lr {m['lr']:g}, W = {m['warmup']}: the "
             f"quality study's recipe. Test: the final model, beam {m['beam']}, length penalty {m['lenpen']}, "
             f"tokenized BLEU (BPE removed) and detokenized sacreBLEU, scored by harness/score.py as the quality "
             f"study scores fairseq-generate's output. Valid loss: label-smoothed, as fairseq logs it. **T-Fixup, q/k as "
             f"fairseq draws them**: the T-Fixup run with what T-Fixup does not set drawn as fairseq draws it, the q "
             f"and k weights (transformers: N(0, 0.02); fairseq: Xavier-uniform, gain 2^-1/2, std "
             f"{(2 / (2 * m['d'])) ** 0.5 * 2 ** -0.5:.4f} at d = {m['d']}) and the q, k, v biases (transformers: 0; "
             f"fairseq: nn.Linear's uniform draw), which leaves no difference between the two initialisations that "
             f"this study knows of. **Stock + matched warmup, fairseq's initialisation**: the cross-initialisation "
             f"control, the stock Post-LN Marian drawn as fairseq draws its transformer (token embeddings N(0, "
             f"d^-1/2), q, k, v Xavier-uniform with gain 2^-1/2 and nn.Linear's biases, out_proj Xavier-uniform with a "
             f"zero bias, "
             f"fc1 and fc2 nn.Linear's own draw; transformers: N(0, 0.02) everywhere, zero biases).\n\n")
    trows = [["transformers", label(r), r["status"], r.get("test_bleu_tok"), r.get("test_bleu_detok"), r["best_valid"],
              r["updates"], r["epochs"], r["device"]] for r in res["rows"] if r["family"] == "marian"]
    fairseq = res.get("fairseq") or {}
    for arm, fs in fairseq.items():
        trows.append([f"fairseq plugin ({fs['record']})", ARMS[arm].label.replace("stock", "Post-LN"), "ok",
                      fs["test_bleu_tok"], fs["test_bleu_detok"], fs["best_valid_loss"], fs["updates"], fs["epochs"],
                      "cpu"])
    text += common.md_table(["framework", "arm", "status", "test BLEU (tok)", "test sacreBLEU", "best valid loss (bits)",
                             "updates", "epochs", "device"], trows) + "\n\n"
    for arm, fs in fairseq.items():
        hf_r = next((r for r in res["rows"] if r["family"] == "marian" and r["arm"] == arm and r["seed"] == 1
                     and r.get("test_bleu_tok") is not None), None)
        if hf_r:
            k = fs["averaged_k"]
            text += (f"{ARMS[arm].label}, transformers minus fairseq: **{hf_r['test_bleu_tok'] - fs['test_bleu_tok']:+.2f} "
                     f"BLEU** (tokenized), {hf_r['best_valid'] - fs['best_valid_loss']:+.3f} bits of best valid loss "
                     + ("(fairseq's evaluate.sh chose K = 1 on valid: its final model, as here).\n\n" if k == 1 else
                        f"(fairseq's evaluate.sh chose on valid the average of its last {k} checkpoints; here the "
                        "final model).\n\n"))
    inits = {r["arm"]: r for r in res["rows"] if r["family"] == "marian" and r["arm"] in (BASELINE, "stock_fsinit")
             and r.get("test_bleu_tok") is not None}
    if len(inits) == 2:
        a, b = inits["stock_fsinit"], inits[BASELINE]
        bleu, bits = a["test_bleu_tok"] - b["test_bleu_tok"], a["best_valid"] - b["best_valid"]
        text += (f"The stock Marian with fairseq's initialisation minus with transformers': **{bleu:+.2f} BLEU** "
                 f"(tokenized), {bits:+.3f} bits of best valid loss.\n\n")
    sigs = sorted({r["signature"] for r in res["rows"] if r.get("signature")}
                  | {fs["signature"] for fs in fairseq.values()})
    if sigs:
        text += "sacreBLEU signature: " + ", ".join(f"`{s}`" for s in sigs) + "\n\n"
    text += ("## Causal language models: GPT-2 and Llama\n\n"
             f"{lm['d']}-{lm['ffn']}-{lm['heads']}, {' and '.join(map(str, lm['depths']))} layers"
             + (f" (Llama also {lm['deeper']['depth']})" if lm.get("deeper") else "") + ", tied embeddings; "
             f"GPT-2: learned positions, GELU MLP, dropout {lm['dropout']}; Llama: RMSNorm, SwiGLU MLP (intermediate "
             f"{lm['ffn']}), rotary positions, {lm['heads'] // 2} KV heads, no dropout. Multi30k's English side in "
             f"blocks of {lm['tokens_per_sample']} tokens, {lm['max_tokens']} tokens per update, {lm['updates']} "
             f"updates, lr {lm['lr']:g}, W = {lm['warmup']}; valid every {lm['valid_every']} updates on every valid "
             f"token. Updates to the baseline's best: the first update at which an arm's valid loss is at or below the "
             f"best of the stock model on the matched warmup (the same seed); ratio: that over the baseline's own. Largest "
             f"rise: the most the valid loss went up from one validation to the next (0: it never rose). Llama's "
             f"controls for its gated MLP, down(silu(gate x) * up x), which is of degree 2 in its input where the "
             f"paper's blocks are of degree 1 (every seed at each depth): **the RMSNorm before each gated MLP kept** "
             f"(T-Fixup otherwise as above), and **the MLP without its gate** (each MLP computes down(silu(up x)), "
             f"gate_proj unused, T-Fixup as above): diagnoses, not baselines. Llama's arms of the LLaMA question "
             f"(below) at the study's lr are in this table too; its lr grid's other runs are there.\n\n")
    cols = ["model", "layers", "arm", "status", "best valid ppl", "at update", "updates to the baseline's best", "ratio",
            "largest rise of valid loss (bits)"]
    text += common.md_table(cols, [[FAMILIES[r["family"]].split(" (")[0], r["layers"], label(r), r["status"],
                                    r["best_ppl"], r["best_at"], _reached(r), r["ratio_to_baseline"], r["largest_rise"]]
                                   for r in res["rows"] if r["family"] in ("gpt2", "llama")]) + "\n\n"
    text += llama_report(res)
    text += ("## Masked language model: BERT\n\n"
             f"BertForMaskedLM {bert['d']}-{bert['ffn']}-{bert['heads']}, {bert['layers']} layers, dropout "
             f"{bert['dropout']}, on Multi30k's English sentences (<s> as [CLS], at most {bert['max_len']} tokens), "
             f"{bert['batch']} sentences per update, {bert['updates']} updates, lr {bert['lr']:g}, W = {bert['warmup']}; "
             f"{bert['mask_prob']:.0%} of the tokens are targets (80 % [MASK], 10 % random, 10 % kept), the same "
             "masks of valid for every run; perplexity of the masked valid tokens. The head (dense, GELU, "
             "LayerNorm, then the tied output projection) has no counterpart in the paper's model; **the masked-LM "
             "head's LayerNorm kept** is T-Fixup otherwise as above: a diagnosis, not a baseline.\n\n")
    text += common.md_table(["arm", "status", "best masked-token ppl", "at update", "updates to the baseline's best",
                             "ratio", "largest rise of valid loss (bits)"],
                            [[label(r), r["status"], r["best_ppl"], r["best_at"], _reached(r), r["ratio_to_baseline"],
                              r["largest_rise"]] for r in res["rows"] if r["family"] == "bert"]) + "\n\n"
    text += "## Every run\n\n" + common.md_table(
        ["run", "status", "device", "parameters", "norm modules left", "weights T-Fixup scaled", "updates",
         "s/update", "train wall s"],
        [[r["id"], r["status"], r["device"], r["parameters"], r["norm_modules"], r["scaled"] or None, r["updates"],
          r["s_per_update"], r["wall_s"]] for r in res["rows"]]) + "\n"
    if res["failed"]:
        text += "\n**Failed runs** (no result; the next start runs them again):\n\n" + "".join(
            f"- {k}: {' | '.join(v['error_tail'])}\n" for k, v in sorted(res["failed"].items()))
    return text


def llama_question(res: dict) -> dict:
    """Llama's lr grid (config lm.lr_grid) as recorded: per method (arm), its grid (lr -> the first seed's row), its
    best lr (the first seed's lowest best valid loss among runs that did not diverge), whether the grid is closed,
    its rows at the best lr (every seed), and against the warmup baseline at ITS best lr (the same seed): the
    updates to that baseline's best and their ratio to the baseline's own; norms left, warmup, extra parameters
    (against the stock model). {} without a grid."""
    g = res["config"]["lm"].get("lr_grid")
    if not g:
        return {}
    rows = [r for r in res["rows"] if r["family"] == "llama" and r["layers"] == g["depth"]]
    out, at_best = {}, {}
    for arm in g["arms"]:
        mine = [r for r in rows if r["arm"] == arm]
        first = {r["lr"]: r for r in mine if r["seed"] == g["seeds"][0]}
        grid, b, closed = grid_of(g, lambda lr: res["records"].get(first[lr]["id"]) if lr in first else None)
        if not closed:  # the best so far, said to be provisional ("grid open")
            b = best_lr({lr: res["records"].get(r["id"]) for lr, r in first.items()})
        out[arm] = {"label": ARMS[arm].label, "best_lr": b, "closed": closed, "seeds": [],
                    "grid": [{"lr": lr, **({k: first[lr][k] for k in ("id", "status", "best_ppl")} if lr in first
                                           else {"id": None, "status": None, "best_ppl": None})} for lr in grid]}
        at_best[arm] = sorted((r for r in mine if r["lr"] == b), key=lambda r: r["seed"])
    base = {r["seed"]: r for r in at_best.get(BASELINE, [])}
    for arm, m in out.items():
        for r in at_best[arm]:
            b_row = base.get(r["seed"])
            b_at, b_best = (b_row["best_at"], b_row["best_valid"]) if b_row and b_row["status"] == "ok" else (None, None)
            u = reach(res["records"][r["id"]].get("valid_curve", []), b_best) if r["status"] == "ok" else None
            r_out = {"id": r["id"], "seed": r["seed"], "status": r["status"], "best_ppl": r["best_ppl"],
                     "updates": r["updates"],
                     "to_baseline_best": u, "ratio": round(u / b_at, 3) if u is not None and b_at else None,
                     "norm_modules": r["norm_modules"], "parameters": r["parameters"]}
            m["seeds"].append(r_out)
        stock = next(iter(base.values()), None)
        arm_spec = ARMS[arm]
        m["norms"] = "removed" if arm.startswith("tfixup") else arm_spec.norms
        m["norm_modules"] = m["seeds"][0]["norm_modules"] if m["seeds"] else None
        m["warmup"] = ARMS[arm].schedule == "matched"
        m["optimizer"] = arm_spec.optimizer
        mine = at_best[arm]
        m["extra_parameters"] = (mine[0]["parameters"] - stock["parameters"]
                                 if mine and stock and mine[0].get("parameters") is not None else None)
    return out


def llama_verdict(q: dict) -> str:
    """One sentence from the records: the method of the lowest best valid perplexity at its best lr (mean over
    its seeds there), and whether each norm-free candidate trained at its best lr."""
    done = {a: m for a, m in q.items() if m.get("seeds") and m["closed"]}
    if len(done) < len(q):
        return (f"{len(done)} of {len(q)} methods have a closed lr grid so far; the verdict waits for the rest.")
    ok = {a: statistics.mean(s["best_ppl"] for s in m["seeds"] if s["status"] == "ok")
          for a, m in done.items() if any(s["status"] == "ok" for s in m["seeds"])}
    top = min(ok, key=ok.get)
    free = [f"{q[a]['label']}: {'trains' if all(s['status'] == 'ok' for s in q[a]['seeds']) else 'diverges'} at its "
            f"best lr ({q[a]['best_lr']:g})" if q[a]["best_lr"] else f"{q[a]['label']}: diverges at every lr of its grid"
            for a in NORM_FREE if a in q]
    n = len(q[top]["seeds"])
    return (f"Lowest best valid perplexity at its own best lr: {q[top]['label']} ({ok[top]:.1f}, "
            f"{'the mean of ' + str(n) + ' seeds' if n > 1 else 'one seed'} at lr {q[top]['best_lr']:g})."
            + (" Norm-free T-Fixup: " + "; ".join(free) + "." if free else ""))


def llama_table(q: dict) -> list:
    """Rows of the table a LLaMA user reads (llama_question's): method, best lr, best valid perplexity per seed,
    updates to the warmup baseline's best (ratio), norms left, warmup, extra parameters."""
    def seeds(m, key, fmt):
        vals = [fmt(s) if s["status"] == "ok" and s.get(key) is not None else
                ("diverged" if s["status"] == "nan" else "not reached" if s["status"] == "ok" else s["status"])
                for s in m.get("seeds", [])]
        return " / ".join(vals) or "-"

    rows = []
    for arm, m in q.items():
        lr = "-" if m["best_lr"] is None else f"{m['best_lr']:g}" + ("" if m["closed"] else " (grid open)")
        norms = {"kept": "every RMSNorm", "removed": "none", "dyt": "none (a DyT in each place)",
                 "derf": "none (a Derf in each place)"}[m["norms"]]
        if arm == "tfixup_mlpnorm":
            norms = "the RMSNorm before each gated MLP"
        if m.get("norm_modules") is not None:
            norms += f": {m['norm_modules']}"
        warm = "yes (matched)" if m["warmup"] else ("no (GI-Adam)" if m["optimizer"] == "giadam" else "no")
        rows.append([m["label"], lr, seeds(m, "best_ppl", lambda s: f"{s['best_ppl']:.1f}"),
                     seeds(m, "to_baseline_best", lambda s: f"{s['to_baseline_best']} ({s['ratio']:.2f}x)"),
                     norms, warm, m["extra_parameters"] if m["extra_parameters"] is not None else "-"])
    return rows


LLAMA_COLUMNS = ["method", "best lr", "best valid ppl (seed 1 / 2)", "updates to the warmup baseline's best (ratio)",
                 "norms left", "warmup", "extra parameters"]


def llama_report(res: dict) -> str:
    q = res.get("llama_question") or {}
    if not q:
        return ""
    g = res["config"]["lm"]["lr_grid"]
    grid_lrs = sorted({c["lr"] for m in q.values() for c in m["grid"]})
    text = (f"## The LLaMA question: each method at its own best lr, {g['depth']}-layer Llama\n\n"
            f"Each method's lr grid starts at {', '.join(f'{x:g}' for x in g['lrs'])} and grows (doubled up to "
            f"{g['max_lr']:g}, halved down to {g['min_lr']:g}) while its best lr, that of the lowest best valid loss "
            f"of the first seed among runs that did not diverge, is at its edge; a second seed runs at the best lr. "
            f"The warmup baseline is the stock model on the matched warmup at its own best lr. **DyT** / **Derf**: "
            f"every RMSNorm replaced by gamma * tanh(alpha x) + beta / gamma * erf(alpha x + s) + beta, a learned "
            f"scalar on the token embedding's output from sqrt(d); DyT's alpha0 {DYT_ALPHA0['attention']:g} before "
            f"attention, {DYT_ALPHA0['mlp']:g} before the MLP, {DYT_ALPHA0['final']:g} for the final one (the DyT "
            f"LLaMA recipe's values at its narrowest width, 4096; this width is below its table), Derf's "
            f"{DERF_ALPHA0:g} everywhere, s0 = {DERF_SHIFT0:g}; both on the stock recipe's matched warmup. **GI-Adam**: "
            f"Adam's second moment starts at the first gradient squared (bias corrections kept), no warmup. The "
            f"norm-free T-Fixup candidates (docs/derivation.md, section 7.7): `apply_tfixup(model, "
            f"gated_mlp=\"sigmoid\")` (the gate bounded), `gated_mlp=\"scaled\"` (each gated MLP's output times "
            f"1/N), and plain T-Fixup with GI-Adam.\n\n")
    text += common.md_table(LLAMA_COLUMNS, llama_table(q)) + "\n\n" + llama_verdict(q) + "\n\n"
    text += "Best valid perplexity of the first seed at each lr of the grid (- not run; diverged: NaN):\n\n"
    def cell(m, x):
        c = next((c for c in m["grid"] if c["lr"] == x and c["status"]), None)
        return "-" if c is None else "diverged" if c["status"] == "nan" else c["best_ppl"]

    text += common.md_table(["method"] + [f"{x:g}" for x in grid_lrs],
                            [[m["label"]] + [cell(m, x) for x in grid_lrs] for m in q.values()]) + "\n\n"
    return text


def _reached(r: dict):
    if r["updates_to_baseline_best"] is not None:
        return r["updates_to_baseline_best"]
    return "not reached" if r["baseline_best_ppl"] is not None else None


ARM_STYLE = {"tfixup": dict(color=methods.method("tfixup").color),
             "stock_matched": dict(color=methods.method("postln").color),
             "stock": dict(color=common.POSTLN_NO_WARMUP_COLOR), "tfixup_fsqk": dict(color="tab:pink"),
             "tfixup_noscale": dict(color="tab:orange"), "tfixup_mlpnorm": dict(color="tab:olive"),
             "tfixup_nogate": dict(color="tab:cyan"), "tfixup_headnorm": dict(color="tab:brown"),
             "dyt": dict(color="tab:purple"), "derf": dict(color="mediumvioletred"), "giadam": dict(color="tab:gray"),
             "tfixup_sigmoid": dict(color="tab:green"), "tfixup_gatescale": dict(color="darkgoldenrod"),
             "tfixup_giadam": dict(color="teal"), "stock_fsinit": dict(color="tab:red")}


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["family"], r["layers"]) for r in res["rows"]},
                    key=lambda p: (list(FAMILIES).index(p[0]), p[1]))
    q = res.get("llama_question") or {}
    grid_panels = 2 if any(m["seeds"] for m in q.values()) else 0  # each method at its best lr; ppl against lr
    n = len(panels) + grid_panels
    cols = 3
    fig, axes = plt.subplots(max(1, math.ceil(n / cols)), cols, figsize=(5.2 * cols, 3.9 * math.ceil(
        max(1, n) / cols)), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (fam, layers) in zip(axes.flat, panels):
        for r in res["rows"]:
            rec = res["records"][r["id"]]
            if (r["family"], r["layers"]) != (fam, layers) or not rec.get("valid_curve") or r.get("lr_in_id"):
                continue
            u, v = zip(*rec["valid_curve"])
            y = v if fam == "marian" else [min(2 ** x, 1e5) for x in v]
            ax.plot(u, y, ls="-" if r["seed"] == 1 else ":", lw=1.3, label=label(r), **ARM_STYLE[r["arm"]])
        for arm, fs in (res.get("fairseq") or {}).items() if fam == "marian" else ():
            ax.plot(*zip(*fs["valid_curve"]), ls="--", lw=1, label=f"fairseq, {ARMS[arm].label.replace('stock', 'Post-LN')}",
                    **ARM_STYLE[arm])
        if fam != "marian":
            ax.set_yscale("log")
        ax.set_title(f"{FAMILIES[fam]}, {layers}{'+' + str(layers) if fam == 'marian' else ''} layers", fontsize=9)
        ax.set_xlabel("updates")
        ax.set_ylabel("valid loss (bits, label-smoothed)" if fam == "marian" else
                      "masked-token valid perplexity" if fam == "bert" else "valid perplexity")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if grid_panels:
        plot_llama_question(res, q, axes.flat[len(panels)], axes.flat[len(panels) + 1])
    common.save_titled_figure(path, fig, "T-Fixup in transformers models on Multi30k: valid loss against updates")


def plot_llama_question(res: dict, q: dict, curves, by_lr) -> None:
    """Two panels of the Llama lr grid: each method's valid perplexity at its best lr (every seed there), and the
    first seed's best valid perplexity against lr (a cross: diverged)."""
    depth = res["config"]["lm"]["lr_grid"]["depth"]
    for arm, m in q.items():
        for r in m["seeds"]:
            rec = res["records"][r["id"]]
            if rec.get("valid_curve"):
                u, v = zip(*rec["valid_curve"])
                curves.plot(u, [min(2 ** x, 1e5) for x in v], ls="-" if r["seed"] == 1 else ":", lw=1.3,
                            label=f"{m['label']}, lr {m['best_lr']:g}" if r["seed"] == 1 else None, **ARM_STYLE[arm])
        pts = sorted((c["lr"], c["best_ppl"]) for c in m["grid"] if c["status"] == "ok" and c["best_ppl"])
        if pts:
            by_lr.plot(*zip(*pts), marker="o", lw=1.3, label=m["label"], **ARM_STYLE[arm])
        nan = [c["lr"] for c in m["grid"] if c["status"] == "nan"]
        if nan:
            top = max([p for _, p in pts], default=100)
            by_lr.plot(nan, [top] * len(nan), ls="none", marker="x", ms=7, **ARM_STYLE[arm])
    curves.set_title(f"Llama, {depth} layers: each method at its best lr (dotted: seed 2)", fontsize=9)
    by_lr.set_title(f"Llama, {depth} layers: best valid perplexity against lr (x: diverged)", fontsize=9)
    for ax, x in ((curves, "updates"), (by_lr, "peak lr")):
        ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel("valid perplexity")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    by_lr.set_xscale("log")


# ---------------------------------------------------------------- CPU estimate


def estimate(cfg: dict, data: pathlib.Path, updates: int = 3, jobs: int = 1) -> list:
    """Seconds per update of each run type here (stock model, 1 thread, the runs' batches), after one
    untimed update; with each run's number of updates, its CPU time. Returns one row per run."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    timed = {}
    for spec in make_specs(cfg):
        kind = (spec["family"], spec["layers"])
        if kind not in timed:
            spec1 = {**spec, "arm": BASELINE, "updates": updates + 1, "valid_every": 10 ** 9, "epochs": 1,
                     "max_updates": updates + 1, "valid_lines": 8}
            torch.manual_seed(1)
            model = build_model(spec1, {lang: len(read_vocab(data, lang)) for lang in (SRC, TGT)})
            tr = Trainer(model, spec1, torch.device("cpu"))
            if spec["family"] == "marian":  # the training part only (the test is timed below)
                src, tgt = read_split(data, "train", SRC), read_split(data, "train", TGT)
                bs = translation_batches(src, tgt, spec["max_tokens"], 1, 1)
                per_epoch = len(bs)
                for idx in bs[:updates + 1]:
                    tr.step(lambda mm, b: _marian_loss(mm, b, spec["label_smoothing"]),
                            translation_tensors(src, tgt, idx))
                t0 = time.time()
                test_src = read_split(data, "test", SRC, 20)
                with torch.no_grad():
                    s = pad_rows(test_src)
                    model.generate(input_ids=s, attention_mask=(s != PAD).long(), num_beams=spec["beam"],
                                   max_new_tokens=30, min_new_tokens=15)
                decode_s = (time.time() - t0) / 20 * len(read_split(data, "test", SRC))
            else:
                TRAIN[spec["family"]](spec1, data, tr)
                per_epoch, decode_s = None, 0.0
            timed[kind] = (float(np.median(tr.times[1:])), per_epoch, decode_s)
        s_upd, per_epoch, decode_s = timed[kind]
        n = per_epoch * spec["epochs"] if spec["family"] == "marian" else spec["updates"]
        yield {"run": run_id(spec), "s_per_update": round(s_upd, 3), "updates": n, "cpu_s": round(s_upd * n + decode_s)}


def _marian_loss(model, b, eps):
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=b["decoder_input_ids"])
    loss, _, n = smoothed_loss(out.logits, b["labels"], eps)
    return loss / n, loss.item() / n / math.log(2)


# ---------------------------------------------------------------- command line


def parser():
    p = runlib.study_parser(__doc__.split("\n\n")[0], "hf.{json,md,png}, hf/runs/")
    for action in p._actions:
        if action.dest == "data":
            action.help = "the exported data folder (python -m harness.bench.hf export --out DIR); default work/hf-data"
        if action.dest == "data_root":
            action.help = argparse.SUPPRESS
        if action.dest == "out":
            action.required = False  # not with --estimate
    p.epilog = ("first, where fairseq is: python -m harness.bench.hf export --out DIR (the data folder --data "
                "reads; export --help). 'python -m harness.bench.hf one' runs a single run (the study starts these).")
    p.add_argument("--device", default="cpu", help="torch device of every run: cpu (default) or cuda")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each its own process (default 1)")
    p.add_argument("--in-process", action="store_true",
                   help="run each run in this process, one at a time (tests, debugging); default: a process each")
    p.add_argument("--estimate", action="store_true",
                   help="time a few updates of each run type on this CPU and print the study's CPU time; run nothing")
    p.add_argument("--select", nargs="+", metavar="GLOB",
                   help="run just the planned runs whose ids match one of these shell patterns (e.g. 'llama-L24-*-s2': "
                        "the second seeds at each method's best lr, once its grid is in), round after round while "
                        "the lr grid grows")
    p.add_argument("--rounds", type=int, default=8, help="rounds of growing the lr grid at most (default 8)")
    return p


def one_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.hf one", description="one run (the study starts these)")
    p.add_argument("--spec", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--result", required=True)
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
    print(f"wrote {out}: {data_description(out)}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    if argv[:1] == ["one"]:
        return one_main(argv[1:])
    p = parser()
    args = p.parse_args(argv)
    if not args.out and not args.estimate:
        p.error("the following arguments are required: --out")
    data = check_data(pathlib.Path(args.data or "work/hf-data"))
    cfg = {**make_config(args.mode), "threads": args.threads, "device": args.device}
    if args.estimate:
        rows = list(estimate(cfg, data))
        print(common.md_table(["run", "s/update (1 CPU thread)", "updates", "CPU s"],
                              [[r["run"], r["s_per_update"], r["updates"], r["cpu_s"]] for r in rows]))
        total = sum(r["cpu_s"] for r in rows)
        longest = max(r["cpu_s"] for r in rows)
        print(f"\nall {len(rows)} runs: {total / 3600:.1f} CPU hours; with --jobs {args.jobs} on as many free cores at "
              f"least {max(total / max(args.jobs, 1), longest) / 3600:.1f} h (the longest run: {longest / 60:.0f} min). "
              f"Measured on {common.machine()['cpu']}, {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f} at the end: a busy machine's seconds are longer")
        return 0
    out = pathlib.Path(args.out)
    failed_dir = out / (STEM + args.tag) / "failed"
    failed_dir.mkdir(parents=True, exist_ok=True)
    store = out / (STEM + args.tag) / "runs"
    for round_ in range(max(1, args.rounds)):
        all_runs = make_runs(cfg, data, runlib.load_records(store))
        only = args.only
        if args.select:
            only = [r.id for r in all_runs if any(fnmatch.fnmatchcase(r.id, g) for g in args.select)]
            if not only:
                common.log(f"--select {' '.join(args.select)}: no planned run matches (yet); nothing to run")
                break

        def summary(records, n=len(all_runs)):
            return summarise(cfg, records, data, n, runlib.load_records(failed_dir))

        runlib.run_study(STEM + args.tag, out, all_runs, summary, plot, report,
                         "valid loss against updates, every run", 1 if args.in_process else args.jobs,
                         execute=lambda r, work: execute(r, work, failed_dir, args.device, args.threads, args.in_process),
                         report_only=args.report_only, only=only, quiet=round_ > 0)
        grown = {r.id for r in make_runs(cfg, data, runlib.load_records(store))} - {r.id for r in all_runs}
        if args.report_only or args.only or not grown:
            break
        common.log(f"round {round_ + 1}: the lr grid grows by {len(grown)} runs: {' '.join(sorted(grown))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
