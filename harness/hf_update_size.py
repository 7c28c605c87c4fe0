"""One SGD step's output change vs depth for HuggingFace models: GPT-2, Llama (RMSNorm, SwiGLU, rotary positions,
grouped KV heads) and BERT (docs/derivation.md, section 7).

    python -m harness.hf_update_size --out results/hf

The measurement of ``harness.stack_update_size`` (same fixed batch of Multi30k English, same step, same
outputs, same log-log slope against the number of layers N), on models built by ``transformers`` from a config
(dropout 0, eager attention, float64), each family in two forms:

* ``tfixup``: ``apply_tfixup(model, input_scale=False)`` (tfixup/hf.py: every norm gone, (6N)^-1/4; the token
  embedding's output without the sqrt(d) multiplier apply_tfixup gives by default, a constant factor on the
  stack's input whose effect on these slopes is not measured);
* ``stock``: the model as HuggingFace initialises it, norms kept (GPT-2 and Llama: pre-norm with a final norm;
  BERT: Post-LN);
* ``tfixup-attention``, ``tfixup-mlp``: T-Fixup, with the step taken on the attention blocks' parameters only,
  or the MLP blocks' only (derivation.md §7.4: a gated MLP block's share of the update is Theta(1/L^2) where
  an attention block's is Theta(1/L), so the MLP-only update should shrink like 1/N).

The logits are the model's own head (GPT-2's and BERT's tied to the token embedding, Llama's ``lm_head`` untied
at HF's init); ``hidden`` is the model's last hidden state (after the final norm where one is kept). BERT runs
without a causal mask and is stepped on the same next-token loss (as ``--encoder-only`` there: the size of one
step at initialisation is what is measured, not a task).
"""

import argparse
import datetime
import os
import pathlib
import platform
import re
import sys
import time

import torch
from torch import nn

from harness.stack_update_size import DEFAULT_TEXT, sweep, token_batch, write
from tfixup.torch_tfixup import apply_tfixup

FAMILIES = ("gpt2", "llama", "bert")
METHODS = ("tfixup", "stock", "tfixup-attention", "tfixup-mlp")
# parameter names of each part, across the three families (BERT's MLP output is layer.N.output, its attention's
# output attention.output)
PARTS = {"attention": re.compile(r"\.(self_attn|attn|attention)\."),
         "mlp": re.compile(r"\.(mlp|intermediate)\.|\.layer\.\d+\.output\.")}


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


class Wrapped(nn.Module):
    """(last hidden state, logits) of a HuggingFace model, as harness.stack_update_size.one_sgd_step reads them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor):
        out = self.model(input_ids=tokens, output_hidden_states=True)
        return out.hidden_states[-1], out.logits


def build(family: str, method: str, vocab: int, dim: int, ffn: int, heads: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = hf_model(family, vocab, dim, ffn, heads, layers)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")
    if method.startswith("tfixup"):  # the stack's input at the scalar analysis's unit, as §7.5 measured it
        apply_tfixup(model, input_scale=False)
    if "-" in method:  # one part stepped: the others get no gradient, and one_sgd_step leaves them
        part = PARTS[method.split("-", 1)[1]]
        for name, p in model.named_parameters():
            p.requires_grad_(bool(part.search(name)))
    return Wrapped(model).double().train()


def measure(families, methods, depths, tokens, vocab, dim, ffn, heads, eta, inits, seed, log=print) -> dict:
    return {f"{family} {m}": sweep(f"{family} {m}", lambda n, s, family=family, m=m: build(family, m, vocab, dim, ffn,
                                                                                          heads, n, s),
                                   depths, tokens, eta, inits, seed, log, tag="hf-update-size")
            for family in families for m in methods}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness.hf_update_size", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="writes STEM.{json,md} here")
    p.add_argument("--stem", default="hf_update_size", help="the output files' name (default hf_update_size)")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    p.add_argument("--methods", default="tfixup,stock", help="comma-separated, of " + ", ".join(METHODS))
    p.add_argument("--depths", default="1,2,4,8,16,32", help="layers N, comma-separated")
    p.add_argument("--text", default=str(DEFAULT_TEXT), help="gzip'd English text, one sentence a line")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="rows of the fixed batch")
    p.add_argument("--length", type=int, default=32, help="tokens per row")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128, help="MLP width (Llama: of each of gate and up)")
    p.add_argument("--heads", type=int, default=4, help="query heads (Llama: half as many KV heads)")
    p.add_argument("--eta", type=float, default=1e-4, help="the SGD step's learning rate")
    p.add_argument("--inits", type=int, default=2, help="initialisations averaged per point")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: nothing to fetch
    families, methods = a.families.split(","), a.methods.split(",")
    for value, known, flag in ((families, FAMILIES, "--families"), (methods, METHODS, "--methods")):
        for v in value:
            if v not in known:
                raise SystemExit(f"error: {flag} {v}: unknown, use {', '.join(known)}")
    depths = [int(n) for n in a.depths.split(",")]
    t0 = time.time()
    tokens = token_batch(pathlib.Path(a.text), a.vocab, a.batch, a.length)
    results = measure(families, methods, depths, tokens, a.vocab, a.dim, a.ffn, a.heads, a.eta, a.inits, a.seed)
    import transformers

    meta = {"command": "python -m harness.hf_update_size " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, transformers "
                       f"{transformers.__version__}, {torch.get_num_threads()} thread(s)",
            "seconds": round(time.time() - t0, 1), "text": a.text, "vocab": a.vocab, "batch": a.batch,
            "length": a.length, "dim": a.dim, "ffn": a.ffn, "heads": a.heads, "eta": a.eta, "inits": a.inits,
            "seed": a.seed, "depths": depths, "methods": results}
    out = pathlib.Path(a.out)
    return write(out, a.stem, meta, f"d={a.dim}, MLP {a.ffn}, {a.heads} heads (Llama: {max(1, a.heads // 2)} KV "
                 f"heads), batch {a.batch}x{a.length} tokens; GPT-2 and BERT: output tied to the token embedding, "
                 "Llama: untied `lm_head`", "hf-update-size")


if __name__ == "__main__":
    main()
