"""``tfixup-diagnose update-size --family torch|hf``: one SGD step's output change vs depth for plain-PyTorch
stacks and HuggingFace models (docs/derivation.md §6-7, its numeric check). Needs torch (and transformers for
``hf``), not fairseq.

    tfixup-diagnose update-size --family torch --out DIR [--untied] [--encdec | --encoder-only]
    tfixup-diagnose update-size --family hf --out DIR [--families gpt2,llama,bert] [--methods tfixup,stock]

T-Fixup's goal (§3.2): one SGD step of learning rate eta moves the model's output by Theta(eta), whatever the
depth. ``--family torch`` measures it for a decoder-only language model made of torch's
``nn.TransformerEncoder`` run with a causal mask (N layers, L = 2N residual blocks), token embedding tied to
the output projection, no positional embedding (the causal mask tells positions apart), dropout 0, float64:

* ``tfixup``: no LayerNorm, ``tfixup.torch_tfixup.apply_tfixup`` (the derived (6N)^-1/4 scale);
* ``xavier``: no LayerNorm, the same draws unscaled (value/output/MLP Xavier, MLP bias 0, embedding
  N(0, d^-1/2)), written out here independently of ``apply_tfixup``;
* ``postln``: those draws with Post-LN's LayerNorms kept; ``preln``: with Pre-LN's (and its final norm).

With ``--untied`` the output projection is its own ``nn.Linear`` (no bias), left at torch's default
initialisation, as T-Fixup leaves an untied output projection. With ``--encdec`` the model is torch's
``nn.Transformer`` with N + N layers instead, and T-Fixup is the paper's (0.67 N^-1/4, (9N)^-1/4); its Post-LN
keeps the final LayerNorm torch puts on each stack. With ``--encoder-only`` the single stack runs without its
causal mask (the update is measured the same way; the next word is then in view, which does not matter for
the size of one step at initialisation).

``--family hf``: models built by ``transformers`` from a config (dropout 0, eager attention, float64): GPT-2,
Llama (RMSNorm, SwiGLU, rotary positions, grouped KV heads) and BERT, each in the forms

* ``tfixup``: ``apply_tfixup(model, input_scale=False)`` (every norm gone, (6N)^-1/4; the token embedding's
  output without the sqrt(d) multiplier apply_tfixup gives by default, a constant factor on the stack's input
  whose effect on these slopes is not measured);
* ``stock``: the model as HuggingFace initialises it, norms kept (GPT-2 and Llama: pre-norm with a final norm;
  BERT: Post-LN);
* ``tfixup-attention``, ``tfixup-mlp``: T-Fixup, with the step taken on the attention blocks' parameters only,
  or the MLP blocks' only (derivation.md §7.4: a gated MLP block's share of the update is Theta(1/L^2) where
  an attention block's is Theta(1/L), so the MLP-only update should shrink like 1/N).

Their logits are the model's own head (GPT-2's and BERT's tied to the token embedding, Llama's ``lm_head``
untied at HF's init); ``hidden`` is the last hidden state (after the final norm where one is kept). BERT runs
without a causal mask and is stepped on the same next-token loss.

On a fixed batch of real English text (the Multi30k train sentences' English side, lowercased words: the
``vocab - 2`` most frequent, <unk> and end of sentence), the gradient of the mean next-token cross-entropy, then
one step p -= eta * grad (tfixup/update_size.py). Two outputs f: the logits, and the stack's output h (the
paper's f_d, before the output projection). ||Delta f||: root mean square over tokens of the L2 norm of f's
change, divided by eta; averaged over ``inits`` initialisations; then the log-log slope against N (0:
independent of depth, the paper's goal). Each step is taken twice: on every parameter, and on every parameter
but the biases (``*_nobias``), which the paper's scalar analysis has none of.
"""

import argparse
import collections
import datetime
import gzip
import os
import pathlib
import platform
import re
import sys
import time
from typing import List

import numpy as np
import torch
from torch import nn

from tfixup import atomic
from tfixup import update_size as us
from tfixup.torch_tfixup import apply_tfixup

TORCH_METHODS = ("tfixup", "xavier", "postln", "preln")
FAMILIES = ("gpt2", "llama", "bert")
HF_METHODS = ("tfixup", "stock", "tfixup-attention", "tfixup-mlp")
# parameter names of each part, across the three HF families (BERT's MLP output is layer.N.output, its
# attention's output attention.output)
PARTS = {"attention": re.compile(r"\.(self_attn|attn|attention)\."),
         "mlp": re.compile(r"\.(mlp|intermediate)\.|\.layer\.\d+\.output\.")}
KEYS = ("logits", "hidden", "logits_nobias", "hidden_nobias")
REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_TEXT = pathlib.Path(os.environ.get("TFIXUP_SHARED_DATA", REPO.parent / "shared" / "data")) / \
    "multi30k" / "train.en.gz"


def token_batch(text: pathlib.Path, vocab: int, batch: int, length: int) -> torch.Tensor:
    """[batch, length + 1] word ids: the first sentences of ``text`` (gzip), lowercased words, concatenated
    (an end-of-sentence id between sentences) and cut into ``batch`` rows; ids over the ``vocab - 2`` most
    frequent words of those sentences, 0 = <unk>, 1 = end of sentence."""
    need = batch * (length + 1)
    words: List[str] = []
    with gzip.open(text, "rt", encoding="utf-8") as f:
        for line in f:
            words.extend(re.findall(r"\w+|[^\w\s]", line.lower()) + ["</s>"])
            if len(words) >= need:
                break
    if len(words) < need:
        raise ValueError(f"{text} holds {len(words)} words, fewer than batch x (length + 1) = {need}")
    counts = collections.Counter(w for w in words[:need] if w != "</s>")
    ids = {w: i + 2 for i, (w, _) in enumerate(counts.most_common(vocab - 2))}
    ids["</s>"] = 1
    return torch.tensor([ids.get(w, 0) for w in words[:need]]).view(batch, length + 1)


class DecoderOnlyLM(nn.Module):
    """Token embedding -> N torch encoder layers under a causal mask -> tied output projection."""

    def __init__(self, vocab: int, dim: int, ffn: int, heads: int, layers: int, norm_first: bool = False,
                 untied: bool = False, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False) if untied else None
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.stack = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(dim) if norm_first else None,
                                           enable_nested_tensor=False)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.causal:  # encoder-only: every position sees every other
            return self.stack(self.embed(tokens))
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=self.embed.weight.dtype)
        return self.stack(self.embed(tokens), mask=mask, is_causal=True)

    def forward(self, tokens: torch.Tensor):
        h = self.hidden(tokens)
        return h, (self.head(h) if self.head is not None else h @ self.embed.weight.t())


class EncoderDecoderLM(nn.Module):
    """``--encdec``: torch's nn.Transformer, N + N layers; the decoder predicts the batch's next words, the
    encoder reads another row of the batch (the rows rolled by one). Target embedding tied to the output
    projection unless untied; source embedding of its own."""

    def __init__(self, vocab: int, dim: int, ffn: int, heads: int, layers: int, norm_first: bool = False,
                 untied: bool = False):
        super().__init__()
        self.embed, self.src_embed = nn.Embedding(vocab, dim), nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False) if untied else None
        self.stack = nn.Transformer(dim, heads, layers, layers, ffn, dropout=0.0, batch_first=True,
                                    norm_first=norm_first)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], dtype=self.embed.weight.dtype)
        return self.stack(self.src_embed(tokens.roll(1, 0)), self.embed(tokens), tgt_mask=mask, tgt_is_causal=True)

    forward = DecoderOnlyLM.forward


@torch.no_grad()
def xavier_draws(model, keep_norms: bool) -> None:
    """The draws T-Fixup starts from, unscaled: Xavier (gain 1) for value rows, output and MLP weights, MLP
    biases 0, embeddings N(0, d^-1/2); LayerNorms replaced by identities unless ``keep_norms`` (nn.Transformer's
    final norms of each stack too)."""
    for embed in (model.embed, getattr(model, "src_embed", None)):
        if embed is not None:
            nn.init.normal_(embed.weight, std=embed.embedding_dim ** -0.5)
    stacks = [model.stack.encoder, model.stack.decoder] if isinstance(model.stack, nn.Transformer) else [model.stack]
    for layer in (layer for stack in stacks for layer in stack.layers):
        for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
            if attn is not None:
                e = attn.embed_dim
                nn.init.xavier_uniform_(attn.in_proj_weight[2 * e:])
                nn.init.xavier_uniform_(attn.out_proj.weight)
        for linear in (layer.linear1, layer.linear2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        if not keep_norms:
            for name in ("norm1", "norm2", "norm3"):
                if hasattr(layer, name):
                    setattr(layer, name, nn.Identity())
    if not keep_norms and isinstance(model.stack, nn.Transformer):
        model.stack.encoder.norm, model.stack.decoder.norm = nn.Identity(), nn.Identity()


def build_torch(method: str, vocab: int, dim: int, ffn: int, heads: int, layers: int, seed: int,
                untied: bool = False, encdec: bool = False, causal: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    if encdec:
        model = EncoderDecoderLM(vocab, dim, ffn, heads, layers, norm_first=(method == "preln"), untied=untied)
    else:
        model = DecoderOnlyLM(vocab, dim, ffn, heads, layers, norm_first=(method == "preln"), untied=untied,
                              causal=causal)
    if method == "tfixup" and encdec:  # the paper's constants
        apply_tfixup(model.stack, embeddings=[model.src_embed], decoder_embeddings=[model.embed])
    elif method == "tfixup":
        apply_tfixup(model.stack, embeddings=[model.embed])
    elif method in ("xavier", "postln", "preln"):
        xavier_draws(model, keep_norms=(method != "xavier"))
    else:
        raise ValueError(f"unknown method {method!r}: one of {', '.join(TORCH_METHODS)}")
    return model.double()


def hf_model(family: str, vocab: int, dim: int, ffn: int, heads: int, layers: int) -> nn.Module:
    import transformers as t  # the hf extra (requirements-hf.txt)

    common = dict(vocab_size=vocab, attn_implementation="eager")
    if family == "gpt2":
        config = t.GPT2Config(n_embd=dim, n_inner=ffn, n_layer=layers, n_head=heads, n_positions=64, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1, **common)
        return t.GPT2LMHeadModel(config)
    if family == "llama":
        config = t.LlamaConfig(hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                               max_position_embeddings=64, bos_token_id=0, eos_token_id=1, **common)
        return t.LlamaForCausalLM(config)
    if family == "bert":
        config = t.BertConfig(hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
                              num_attention_heads=heads, max_position_embeddings=64, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, pad_token_id=0, **common)
        return t.BertForMaskedLM(config)
    raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")


def build_hf(family: str, method: str, vocab: int, dim: int, ffn: int, heads: int, layers: int,
             seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = hf_model(family, vocab, dim, ffn, heads, layers)
    if method not in HF_METHODS:
        raise ValueError(f"unknown method {method!r}: one of {', '.join(HF_METHODS)}")
    if method.startswith("tfixup"):  # the stack's input at the scalar analysis's unit, as §7.5 measured it
        apply_tfixup(model, input_scale=False)
    if "-" in method:  # one part stepped: the others get no gradient, and the step leaves them
        part = PARTS[method.split("-", 1)[1]]
        for name, p in model.named_parameters():
            p.requires_grad_(bool(part.search(name)))
    return us.HFModel(model).double().train()


def sgd_step(model: nn.Module, tokens: torch.Tensor, eta: float, biases: bool = True) -> dict:
    """{logits, hidden: ||Delta f|| / eta} after one SGD step of the mean next-token loss (every parameter,
    or all but the biases); the model is left as it was."""
    change = us.one_step(model, tokens, us.lm_loss, us.lm_outputs, us.sgd(eta), us.trainable(model, biases))
    return {k: v / eta for k, v in change.items()}


def sweep(name: str, build_at, depths, tokens, eta: float, inits: int, seed: int, tag: str, note: str = "") -> dict:
    """One model family across DEPTHS (``build_at(n, seed)``): per depth the mean over INITS of one SGD step's
    output change (every parameter stepped, and biases held), then each key's log-log slope against N."""
    def measure(n, s):
        model = build_at(n, s)
        full, nobias = sgd_step(model, tokens, eta), sgd_step(model, tokens, eta, biases=False)
        return {**full, **{f"{key}_nobias": v for key, v in nobias.items()}}

    def log(n, at):
        m = {key: float(np.mean(at[key])) for key in KEYS}
        print(f"[{tag}] {name} N={n}: ||df||/eta logits {m['logits']:.4g}, hidden {m['hidden']:.4g} (biases not "
              f"stepped: {m['logits_nobias']:.4g}, {m['hidden_nobias']:.4g})", flush=True)

    sizes = {key: [float(np.mean(row)) for row in a] for key, a in us.sweep(depths, inits, seed, measure, log).items()}
    result = {**{key: sizes[key] for key in KEYS}, **{f"{key}_loglog_slope": us.loglog_slope(depths, sizes[key])
                                                      for key in KEYS}}
    print(f"[{tag}] {name}: log-log slope vs N: "
          + ", ".join(f"{key} {result[key + '_loglog_slope']:+.3f}" for key in KEYS) + note, flush=True)
    return result


def table(meta: dict) -> str:
    depths = meta["depths"]
    lines = [f"| method | f | {' | '.join(f'N={n}' for n in depths)} | log-log slope |",
             "|---|---|" + "---|" * len(depths) + "---|"]
    for m, r in meta["methods"].items():
        for key in KEYS:
            lines.append(f"| {m} | {key.replace('_nobias', ', biases not stepped')} | "
                         f"{' | '.join(f'{v:.3g}' for v in r[key])} | **{r[f'{key}_loglog_slope']:+.2f}** |")
    return "\n".join(lines)


def parse_args(argv, family: str, prog: str):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=("torch", "hf"), default=family,
                   help=f"torch: nn.Transformer* stacks; hf: HuggingFace models (default {family})")
    p.add_argument("--out", required=True, help="writes STEM.{json,md} here")
    p.add_argument("--stem", help="the output files' name (default: torch, stack_update_size{,_encdec,"
                                  "_encoder_only}{,_untied} after the flags; hf, hf_update_size)")
    p.add_argument("--methods", help=f"comma-separated; torch: of {', '.join(TORCH_METHODS)} (default all); "
                                     f"hf: of {', '.join(HF_METHODS)} (default tfixup,stock)")
    p.add_argument("--families", help=f"hf: comma-separated, of {', '.join(FAMILIES)} (default all)")
    p.add_argument("--depths", help="layers N, comma-separated (default torch 1,2,4,8,16,32,64; hf 1,2,4,8,16,32)")
    p.add_argument("--text", default=str(DEFAULT_TEXT), help="gzip'd English text, one sentence a line")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="rows of the fixed batch")
    p.add_argument("--length", type=int, default=32, help="tokens per row")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128, help="MLP width (Llama: of each of gate and up)")
    p.add_argument("--heads", type=int, default=4, help="query heads (Llama: half as many KV heads)")
    p.add_argument("--eta", type=float, default=1e-4, help="the SGD step's learning rate")
    p.add_argument("--inits", type=int, help="initialisations averaged per point (default torch 3, hf 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--untied", action="store_true", help="torch: an output projection of its own (default init)")
    p.add_argument("--encdec", action="store_true",
                   help="torch: nn.Transformer with N + N layers instead (T-Fixup: the paper's constants)")
    p.add_argument("--encoder-only", action="store_true",
                   help="torch: the single stack without its causal mask (T-Fixup: (6N)^-1/4 as for decoder-only)")
    a = p.parse_args(argv)
    hf = a.family == "hf"
    if hf and (a.untied or a.encdec or a.encoder_only):
        p.error("--untied, --encdec and --encoder-only are for --family torch")
    if not hf and a.families:
        p.error("--families is for --family hf")
    if a.encdec and a.encoder_only:
        p.error("--encdec and --encoder-only: choose one")
    if not pathlib.Path(a.text).is_file():
        p.error(f"--text {a.text}: no such file; give gzip'd English text, one sentence a line (the default is "
                "$TFIXUP_SHARED_DATA/multi30k/train.en.gz)")
    a.methods = (a.methods or ("tfixup,stock" if hf else ",".join(TORCH_METHODS))).split(",")
    a.families = (a.families or ",".join(FAMILIES)).split(",") if hf else []
    for value, known, flag in ((a.families, FAMILIES, "--families"),
                               (a.methods, HF_METHODS if hf else TORCH_METHODS, "--methods")):
        for v in value:
            if v not in known:
                p.error(f"{flag} {v}: unknown, use {', '.join(known)}")
    a.depths = [int(n) for n in (a.depths or ("1,2,4,8,16,32" if hf else "1,2,4,8,16,32,64")).split(",")]
    a.inits = a.inits or (2 if hf else 3)
    a.stem = a.stem or ("hf_update_size" if hf else "stack_update_size" + "_encdec" * a.encdec
                        + "_encoder_only" * a.encoder_only + "_untied" * a.untied)
    return a


def main(argv=None, family: str = "torch", prog: str = "tfixup-diagnose update-size") -> dict:
    """The command; ``prog``: its name in the record (the harness modules' names, which the records carry)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv, family, prog)
    hf = a.family == "hf"
    if hf:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: nothing to fetch
    t0 = time.time()
    tokens = token_batch(pathlib.Path(a.text), a.vocab, a.batch, a.length)
    size = (a.vocab, a.dim, a.ffn, a.heads)
    if hf:
        results = {f"{f} {m}": sweep(f"{f} {m}", lambda n, s, f=f, m=m: build_hf(f, m, *size, n, s), a.depths,
                                     tokens, a.eta, a.inits, a.seed, "hf-update-size")
                   for f in a.families for m in a.methods}
        import transformers
        libraries = f"torch {torch.__version__}, transformers {transformers.__version__}"
    else:
        results = {m: sweep(m, lambda n, s, m=m: build_torch(m, *size, n, s, a.untied, a.encdec, not a.encoder_only),
                            a.depths, tokens, a.eta, a.inits, a.seed, "stack-update-size", " (0: independent of depth)")
                   for m in a.methods}
        libraries = f"torch {torch.__version__}"
    meta = {"command": f"{prog} {' '.join(argv)}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {libraries}, "
                       f"{torch.get_num_threads()} thread(s)",
            "seconds": round(time.time() - t0, 1), "text": a.text, "vocab": a.vocab, "batch": a.batch,
            "length": a.length, "dim": a.dim, "ffn": a.ffn, "heads": a.heads, "eta": a.eta, "inits": a.inits,
            "seed": a.seed, **({} if hf else {"untied": a.untied, "encdec": a.encdec, "encoder_only": a.encoder_only}),
            "depths": a.depths, "methods": results}
    setting = (f"d={a.dim}, MLP {a.ffn}, {a.heads} heads (Llama: {max(1, a.heads // 2)} KV heads), batch "
               f"{a.batch}x{a.length} tokens; GPT-2 and BERT: output tied to the token embedding, Llama: untied "
               "`lm_head`" if hf else
               f"d={a.dim}, ffn={a.ffn}, heads={a.heads}, batch {a.batch}x{a.length} tokens, "
               f"{'untied' if a.untied else 'tied'} output projection"
               f"{', encoder-decoder (N + N layers)' if a.encdec else ''}"
               f"{', encoder-only (no causal mask)' if a.encoder_only else ''}")
    out = pathlib.Path(a.out)
    atomic.write_json(out / f"{a.stem}.json", meta)
    atomic.write_text(out / f"{a.stem}.md",
                      f"`{meta['command']}`\n\n{meta['machine']}, {meta['date']}, {meta['seconds']} s\n\n"
                      f"||Δf|| / η after one SGD step (η = {meta['eta']:g}), mean of {meta['inits']} inits; "
                      f"{setting}\n\n{table(meta)}\n")
    print(table(meta))
    print(f"[{'hf' if hf else 'stack'}-update-size] wrote {out}/{a.stem}.{{json,md}} ({meta['seconds']} s)")
    return meta
