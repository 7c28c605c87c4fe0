"""One SGD step's output change vs depth for a plain-PyTorch decoder-only stack (docs/derivation.md, its check).

    python -m harness.stack_update_size --out results/diagnostics

T-Fixup's goal (§3.2): one SGD step of learning rate eta moves the model's output by Theta(eta), whatever the
depth. This measures it without fairseq, for a decoder-only language model made of torch's
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

On a fixed batch of real English text (the Multi30k train sentences' English side, lowercased words: the
``vocab - 2`` most frequent, <unk> and end of sentence), the gradient of the mean next-token cross-entropy, then one step
p -= eta * grad. Two outputs f: the logits, and the stack's output h (the paper's f_d, before the output
projection). ||Delta f||: root mean square over tokens of the L2 norm of f's change, divided by eta; averaged
over ``inits`` initialisations; then the log-log slope against N (0: independent of depth, the paper's goal).
Each step is taken twice: on every parameter, and on every parameter but the biases (``*_nobias``), which the
paper's scalar analysis has none of.
"""

import argparse
import collections
import datetime
import gzip
import math
import os
import pathlib
import platform
import re
import sys
import time
from typing import Dict, List, Sequence

import numpy as np
import torch
from torch import nn

from tfixup import atomic
from tfixup.torch_tfixup import apply_tfixup

MODELS = ("tfixup", "xavier", "postln", "preln")
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


def torch_layers(model) -> list:
    stacks = [model.stack.encoder, model.stack.decoder] if isinstance(model.stack, nn.Transformer) else [model.stack]
    return [layer for stack in stacks for layer in stack.layers]


@torch.no_grad()
def xavier_draws(model, keep_norms: bool) -> None:
    """The draws T-Fixup starts from, unscaled: Xavier (gain 1) for value rows, output and MLP weights, MLP
    biases 0, embeddings N(0, d^-1/2); LayerNorms replaced by identities unless ``keep_norms`` (nn.Transformer's
    final norms of each stack too)."""
    for embed in (model.embed, getattr(model, "src_embed", None)):
        if embed is not None:
            nn.init.normal_(embed.weight, std=embed.embedding_dim ** -0.5)
    for layer in torch_layers(model):
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


def build(method: str, vocab: int, dim: int, ffn: int, heads: int, layers: int, seed: int,
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
        raise ValueError(f"unknown method {method!r}: one of {', '.join(MODELS)}")
    return model.double()


def rms_change(before: torch.Tensor, after: torch.Tensor) -> float:
    """Root mean square over tokens of the L2 norm (last axis) of after - before."""
    return float((after - before).pow(2).sum(-1).mean().sqrt())


def one_sgd_step(model: nn.Module, tokens: torch.Tensor, eta: float, biases: bool = True) -> Dict[str, float]:
    """||Delta f|| / eta for f = logits and f = hidden (the stack's output) after one SGD step of the mean
    next-token loss (on every parameter, or every one but the biases); the model is restored afterwards."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    params = [p for name, p in model.named_parameters() if biases or not name.endswith("bias")]
    saved = [p.detach().clone() for p in params]
    model.zero_grad(set_to_none=True)
    h, logits = model(inputs)
    nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    h, logits = h.detach(), logits.detach()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-eta)
        h1, logits1 = model(inputs)
        out = {"logits": rms_change(logits, logits1) / eta, "hidden": rms_change(h, h1) / eta}
        for p, s in zip(params, saved):
            p.copy_(s)
    model.zero_grad(set_to_none=True)
    return out


def loglog_slope(depths: Sequence[int], values: Sequence[float]) -> float:
    d, v = np.asarray(depths, dtype=float), np.asarray(values, dtype=float)
    ok = np.isfinite(v) & (v > 0)
    return float(np.polyfit(np.log(d[ok]), np.log(v[ok]), 1)[0]) if ok.sum() > 1 else float("nan")


KEYS = ("logits", "hidden", "logits_nobias", "hidden_nobias")


def sweep(name: str, build_at, depths: Sequence[int], tokens: torch.Tensor, eta: float, inits: int, seed: int,
          log=print, tag: str = "stack-update-size", note: str = "") -> dict:
    """One model family across DEPTHS: ``build_at(n, seed)`` builds it with n layers; per depth the mean over
    INITS of one SGD step's output change (every parameter stepped, and biases held), then each key's log-log
    slope against the depth."""
    sizes = {key: [] for key in KEYS}
    for n in depths:
        runs = []
        for k in range(inits):
            model = build_at(n, seed + k)
            full, nobias = one_sgd_step(model, tokens, eta), one_sgd_step(model, tokens, eta, biases=False)
            runs.append({**full, **{f"{key}_nobias": v for key, v in nobias.items()}})
        for key in KEYS:
            sizes[key].append(float(np.mean([r[key] for r in runs])))
        log(f"[{tag}] {name} N={n}: ||df||/eta logits {sizes['logits'][-1]:.4g}, "
            f"hidden {sizes['hidden'][-1]:.4g} (biases not stepped: {sizes['logits_nobias'][-1]:.4g}, "
            f"{sizes['hidden_nobias'][-1]:.4g})")
    result = {**sizes, **{f"{key}_loglog_slope": loglog_slope(depths, sizes[key]) for key in KEYS}}
    log(f"[{tag}] {name}: log-log slope vs N: "
        + ", ".join(f"{key} {result[key + '_loglog_slope']:+.3f}" for key in KEYS) + note)
    return result


def measure(methods: Sequence[str], depths: Sequence[int], tokens: torch.Tensor, vocab: int, dim: int, ffn: int,
            heads: int, eta: float, inits: int, seed: int, untied: bool = False, encdec: bool = False,
            causal: bool = True, log=print) -> dict:
    return {m: sweep(m, lambda n, s, m=m: build(m, vocab, dim, ffn, heads, n, s, untied, encdec, causal), depths,
                     tokens, eta, inits, seed, log, note=" (0: independent of depth)") for m in methods}


def table(meta: dict) -> str:
    depths = meta["depths"]
    lines = [f"| method | f | {' | '.join(f'N={n}' for n in depths)} | log-log slope |",
             "|---|---|" + "---|" * len(depths) + "---|"]
    for m, r in meta["methods"].items():
        for key in KEYS:
            lines.append(f"| {m} | {key.replace('_nobias', ', biases not stepped')} | {' | '.join(f'{v:.3g}' for v in r[key])} | "
                         f"**{r[f'{key}_loglog_slope']:+.2f}** |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness.stack_update_size", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True,
                   help="writes stack_update_size{,_encdec,_encoder_only}{,_untied}.{json,md} here")
    p.add_argument("--methods", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    p.add_argument("--depths", default="1,2,4,8,16,32,64", help="layers N, comma-separated")
    p.add_argument("--text", default=str(DEFAULT_TEXT), help="gzip'd English text, one sentence a line")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="rows of the fixed batch")
    p.add_argument("--length", type=int, default=32, help="tokens per row")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--eta", type=float, default=1e-4, help="the SGD step's learning rate")
    p.add_argument("--inits", type=int, default=3, help="initialisations averaged per point")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--untied", action="store_true", help="an output projection of its own (default init)")
    p.add_argument("--encdec", action="store_true",
                   help="nn.Transformer with N + N layers instead (T-Fixup: the paper's constants)")
    p.add_argument("--encoder-only", action="store_true",
                   help="the single stack without its causal mask (T-Fixup: (6N)^-1/4 as for decoder-only)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    a = parse_args(argv)
    methods, depths = a.methods.split(","), [int(n) for n in a.depths.split(",")]
    for m in methods:
        if m not in MODELS:
            raise SystemExit(f"error: --methods {m}: unknown, use {', '.join(MODELS)}")
    t0 = time.time()
    tokens = token_batch(pathlib.Path(a.text), a.vocab, a.batch, a.length)
    results = measure(methods, depths, tokens, a.vocab, a.dim, a.ffn, a.heads, a.eta, a.inits, a.seed,
                      a.untied, a.encdec, not a.encoder_only)
    meta = {"command": "python -m harness.stack_update_size " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                       f"{torch.get_num_threads()} thread(s)",
            "seconds": round(time.time() - t0, 1), "text": a.text, "vocab": a.vocab, "batch": a.batch,
            "length": a.length, "dim": a.dim, "ffn": a.ffn, "heads": a.heads, "eta": a.eta, "inits": a.inits,
            "seed": a.seed, "untied": a.untied, "encdec": a.encdec, "encoder_only": a.encoder_only, "depths": depths, "methods": results}
    out = pathlib.Path(a.out)
    if a.encdec and a.encoder_only:
        raise SystemExit("error: --encdec and --encoder-only: choose one")
    stem = ("stack_update_size" + ("_encdec" if a.encdec else "") + ("_encoder_only" if a.encoder_only else "")
            + ("_untied" if a.untied else ""))
    return write(out, stem, meta, f"d={a.dim}, ffn={a.ffn}, heads={a.heads}, batch {a.batch}x{a.length} tokens, "
                 f"{'untied' if a.untied else 'tied'} output projection"
                 f"{', encoder-decoder (N + N layers)' if a.encdec else ''}"
                 f"{', encoder-only (no causal mask)' if a.encoder_only else ''}", "stack-update-size")


def write(out: pathlib.Path, stem: str, meta: dict, setting: str, name: str) -> dict:
    """OUT/STEM.json (META) and OUT/STEM.md (its command, machine, date, SETTING and table), each atomically;
    the table printed."""
    atomic.write_json(out / f"{stem}.json", meta)
    atomic.write_text(out / f"{stem}.md",
                      f"`{meta['command']}`\n\n{meta['machine']}, {meta['date']}, {meta['seconds']} s\n\n"
                      f"||Δf|| / η after one SGD step (η = {meta['eta']:g}), mean of {meta['inits']} inits; "
                      f"{setting}\n\n{table(meta)}\n")
    print(table(meta))
    print(f"[{name}] wrote {out}/{stem}.{{json,md}} ({meta['seconds']} s)")
    return meta


if __name__ == "__main__":
    main()
