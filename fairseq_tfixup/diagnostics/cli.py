"""``tfixup-diagnose``: the papers' optimisation diagnostics for fairseq translation models.

    tfixup-diagnose grad-hist  --data DATA_BIN --model postln,tfixup --out DIR
    tfixup-diagnose ln-norms   --data DATA_BIN --model postln,tfixup --out DIR
    tfixup-diagnose grad-norms --data DATA_BIN --model postln,preln,tfixup --out DIR
    tfixup-diagnose hessian    [--data DATA_BIN] --model postln,preln,tfixup --out DIR
    tfixup-diagnose update-size --data DATA_BIN --model tfixup,postln,preln,noln --out DIR
    tfixup-diagnose update-size --family torch|hf --out DIR   (plain-PyTorch stacks, HuggingFace models)
    tfixup-diagnose update-decomposition --data DATA_BIN --model tfixup --out DIR
    tfixup-diagnose fp16-headroom --data DATA_BIN --model tfixup,postln,preln --depths 6,24,100 --out DIR

Each writes a PNG plus the raw arrays (.npz) and a .json summary to --out (update-size --family torch|hf:
a .json and a .md table; its flags: tfixup-diagnose update-size --family torch --help).
"""

import argparse
import logging
import os
import pathlib
import shlex
import signal
import sys
import tempfile
import warnings

from fairseq_tfixup.diagnostics.models import ModelSpec
from fairseq_tfixup.diagnostics.update_decomposition import VARIANTS
from tfixup.methods import METHODS, SCHEDULES

MODELS = list(METHODS)  # any method of the paper's tables, and the Fig. 3c ablations
FAMILIES = ("fairseq", "torch", "hf")  # update-size's models: fairseq here, the others tfixup/update_size_stacks.py


def comma_list(kind, choices=None):
    def parse(text):
        items = [kind(x) for x in text.split(",") if x]
        bad = [x for x in items if choices and x not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {'/'.join(choices or [kind.__name__])}, "
                                             f"got {text!r}")
        return items
    return parse


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def common_parser(default_models: str, default_dropout: float) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and data")
    g.add_argument("--data", help="fairseq data-bin folder (e.g. from scripts/prepare-iwslt14.sh)")
    g.add_argument("--model", type=comma_list(str, MODELS), default=default_models.split(","),
                   help=f"comma list of {', '.join(MODELS)} (default {default_models})")
    g.add_argument("--dim", type=int, default=128, help="embedding dim, encoder and decoder (default 128)")
    g.add_argument("--ffn-dim", type=int, default=256, help="FFN inner dim (default 256)")
    g.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    g.add_argument("--layers", type=int, default=6, help="encoder layers = decoder layers (default 6)")
    g.add_argument("--dropout", type=float, default=default_dropout, help=f"dropout (default {default_dropout})")
    g.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch (default 2048)")
    g.add_argument("--fairseq-args", default="",
                   help="more fairseq-train flags, one quoted string, applied last, e.g. "
                        "\"--share-decoder-input-output-embed --criterion label_smoothed_cross_entropy\"")
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--device", default="cpu", help="torch device (default cpu), e.g. cuda:0")
    g.add_argument("--seed", type=int, default=1, help="seed for init, data order and probes (default 1)")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    return p


def training_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, default=100, help="Adam updates (default 100)")
    g.add_argument("--schedule", type=comma_list(str, list(SCHEDULES)), default=["warmup", "nowarmup"],
                   help="comma list of warmup (inverse_sqrt with --warmup-updates) and nowarmup "
                        "(inverse_sqrt_nowarmup, decay period = --warmup-updates); default both")
    g.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (default 5e-4)")
    g.add_argument("--warmup-updates", type=int, default=4000, help="warmup length / decay period (default 4000)")
    g.add_argument("--split", default="train", help="data split to train on (default train)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfixup-diagnose", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("grad-hist", parents=[common_parser("postln,tfixup", 0.1)],
                       help="T-Fixup Fig. 2: histograms of encoder embedding gradients and Adam updates")
    training_options(p)
    p.add_argument("--bins", type=int, default=60, help="log10-magnitude bins (default 60)")
    p.add_argument("--range", type=float, nargs=2, default=(-14.0, 1.0), metavar=("LO", "HI"),
                   help="log10-magnitude range of the bins (default -14 1); outside values go to edge bins")

    p = sub.add_parser("ln-norms", parents=[common_parser("postln,tfixup", 0.1)],
                       help="T-Fixup Fig. 3a/b: mean L2 norm of the decoder's LayerNorm input after self-attention")
    training_options(p)

    p = sub.add_parser("grad-norms", parents=[common_parser("postln,preln,tfixup", 0.0)],
                       help="Xiong et al. Fig. 3: per-layer gradient norms at init; last FFN gradient vs depth")
    p.add_argument("--depths", type=comma_list(int), default=[2, 4, 6, 8, 12],
                   help="comma list of depths for the depth sweep (default 2,4,6,8,12)")
    p.add_argument("--split", default="valid", help="data split (default valid)")
    p.add_argument("--sentences", type=int, default=500, help="first N sentence pairs of the split (default 500)")
    p.add_argument("--inits", type=int, default=3, help="random initialisations averaged (default 3)")

    p = sub.add_parser("hessian", parents=[common_parser("postln,preln,tfixup", 0.0)],
                       help="Hessian top eigenvalues and spectral density (SLQ) at initialisation")
    p.add_argument("--split", default="train", help="data split (default train: with the Multi30k default, "
                                                    "the first --sentences pairs of Multi30k val)")
    p.add_argument("--sentences", type=int, default=1000, help="sentence pairs in the loss (default 1000)")
    p.add_argument("--lanczos-steps", type=positive_int, default=20, help="Lanczos steps per probe (default 20)")
    p.add_argument("--probes", type=int, default=1, help="random probe vectors for the density (default 1)")
    p.add_argument("--top-k", type=int, default=5, help="eigenvalues to report (default 5)")
    p.add_argument("--shared", default=os.environ.get("TFIXUP_SHARED_DATA"),
                   help="shared data folder holding multi30k/ and iwslt14-de-en/, for the default Multi30k data "
                        "(default $TFIXUP_SHARED_DATA)")
    p.add_argument("--cache", default=str(pathlib.Path(tempfile.gettempdir()) / "tfixup-diagnose"),
                   help="where the Multi30k data-bin is built when --data is not given")
    p = sub.add_parser("update-size", parents=[common_parser("tfixup,postln,preln,noln", 0.0)],
                       help="T-Fixup §3.2's goal: the output change after one SGD / Adam step at init, vs depth")
    p.add_argument("--family", choices=FAMILIES, default="fairseq",
                   help="fairseq (default): a fairseq translation model, these flags; torch, hf: plain-PyTorch "
                        "nn.Transformer* stacks or HuggingFace models, flags of their own "
                        "(tfixup-diagnose update-size --family torch --help; tfixup/update_size_stacks.py)")
    p.add_argument("--depths", type=comma_list(int), default=[1, 2, 4, 8, 16, 32, 64, 128, 200],
                   help="comma list of layers per side (default 1,2,4,8,16,32,64,128,200)")
    p.add_argument("--eta", type=float, default=1e-4, help="SGD step size (default 1e-4: the first-order regime)")
    p.add_argument("--adam-lr", type=float, default=5e-4, help="Adam's learning rate (default 5e-4)")
    p.add_argument("--split", default="valid", help="data split (default valid)")
    p.add_argument("--sentences", type=int, default=64, help="first N sentence pairs of the split (default 64)")
    p.add_argument("--inits", type=int, default=2, help="random initialisations averaged (default 2)")
    p.add_argument("--no-bias-step", dest="biases", action="store_false",
                   help="leave every bias out of the step (the zero-initialised branch biases T-Fixup does not scale)")
    p = sub.add_parser("update-decomposition", parents=[common_parser("tfixup", 0.0)],
                       help="one SGD step's output change at init split by parameter group, per model variant, "
                            "vs depth")
    p.add_argument("--depths", type=comma_list(int), default=[1, 4, 16, 64],
                   help="comma list of layers per side (default 1,4,16,64)")
    p.add_argument("--etas", type=comma_list(float), default=[1e-4, 1e-5],
                   help="comma list of SGD step sizes (default 1e-4,1e-5)")
    p.add_argument("--variants", type=comma_list(str, list(VARIANTS)), default=list(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (default all)")
    p.add_argument("--split", default="valid", help="data split (default valid)")
    p.add_argument("--sentences", type=int, default=64, help="first N sentence pairs of the split (default 64)")
    p.add_argument("--inits", type=int, default=2, help="random initialisations averaged (default 2)")
    p = sub.add_parser("fp16-headroom", parents=[common_parser("tfixup,postln,preln", 0.1)],
                       help="the largest |value| of the residual stream, attention logits, FFN hidden units and "
                            "gradients over the first updates, against fp16's 65504")
    p.add_argument("--depths", type=comma_list(int), default=[6, 24, 100],
                   help="comma list of layers per side (default 6,24,100)")
    p.add_argument("--steps", type=comma_list(positive_int), default=[200],
                   help="updates per run: one number, or a comma list with one per depth (default 200)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup-updates", type=int, default=200,
                   help="a warmup method's matched warmup W (default 200)")
    p.add_argument("--decay-period", type=int, default=4000, help="P of lr * sqrt(P / (P + t)) (default 4000)")
    p.add_argument("--split", default="train", help="data split to train on (default train)")
    return parser


def spec_from(a) -> ModelSpec:
    extra = shlex.split(a.fairseq_args) + ["--max-tokens", str(a.max_tokens)]
    if hasattr(a, "lr") and a.command != "fp16-headroom":  # fp16-headroom sets its lr per run
        extra += ["--lr", str(a.lr)]
    return ModelSpec(dim=a.dim, ffn_dim=a.ffn_dim, heads=a.heads, encoder_layers=a.layers,
                     decoder_layers=a.layers, dropout=a.dropout, extra=extra)


def log(msg: str) -> None:
    print(msg, flush=True)


def provenance(argv) -> dict:
    """The command, date and machine a summary was written by (kept in its JSON and table)."""
    import datetime
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"command": "tfixup-diagnose " + " ".join(shlex.quote(a) for a in argv),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{cpu} ({os.cpu_count()} CPUs), {platform.platform()}; Python {platform.python_version()}, "
                       f"torch {torch.__version__}, {torch.get_num_threads()} threads"}


def run(a) -> None:
    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    spec = spec_from(a)
    common = dict(out=a.out, models=a.model, spec=spec, seed=a.seed, device=a.device, log=log)
    if a.command == "hessian":
        from fairseq_tfixup.diagnostics.data import prepare_multi30k
        from fairseq_tfixup.diagnostics.hessian import run_hessian

        data_bin = a.data
        if data_bin is None:
            if not a.shared:
                raise ValueError("hessian without --data needs --shared DIR (or TFIXUP_SHARED_DATA) for Multi30k")
            data_bin = prepare_multi30k(pathlib.Path(a.shared), pathlib.Path(a.cache) / f"multi30k-val-{a.sentences}",
                                        lines=a.sentences)
            log(f"[hessian] data: Multi30k val De->En, first {a.sentences} pairs -> {data_bin}")
        run_hessian(data_bin, split=a.split, n_sentences=a.sentences, steps=a.lanczos_steps,
                    probes=a.probes, top_k=a.top_k, **common)
        return
    if a.data is None:
        raise ValueError(f"{a.command} needs --data DATA_BIN (e.g. from scripts/prepare-iwslt14.sh)")
    if a.command == "grad-hist":
        from fairseq_tfixup.diagnostics.grad_hist import run_grad_hist

        run_grad_hist(a.data, steps=a.steps, schedules=a.schedule, warmup_updates=a.warmup_updates,
                      split=a.split, bins=a.bins, log_range=tuple(a.range), **common)
    elif a.command == "ln-norms":
        from fairseq_tfixup.diagnostics.ln_norms import run_ln_norms

        run_ln_norms(a.data, steps=a.steps, schedules=a.schedule, warmup_updates=a.warmup_updates,
                     split=a.split, **common)
    elif a.command == "grad-norms":
        from fairseq_tfixup.diagnostics.grad_norms import run_grad_norms

        run_grad_norms(a.data, depths=a.depths, split=a.split, n_sentences=a.sentences, inits=a.inits, **common)
    elif a.command == "update-size":
        from fairseq_tfixup.diagnostics.update_size import run_update_size

        run_update_size(a.data, depths=a.depths, eta=a.eta, adam_lr=a.adam_lr, split=a.split,
                        n_sentences=a.sentences, inits=a.inits, biases=a.biases, **common)
    elif a.command == "fp16-headroom":
        from fairseq_tfixup.diagnostics.fp16_headroom import run_fp16_headroom

        run_fp16_headroom(a.data, depths=a.depths, steps=a.steps, lr=a.lr, warmup_updates=a.warmup_updates,
                          decay_period=a.decay_period, split=a.split, written_by=provenance(a.argv), **common)
    elif a.command == "update-decomposition":
        from fairseq_tfixup.diagnostics.update_decomposition import run_update_decomposition

        if len(a.model) != 1:
            raise ValueError(f"update-decomposition takes one --model, got {','.join(a.model)}")
        common.pop("models")
        run_update_decomposition(a.data, model=a.model[0], variants={v: VARIANTS[v] for v in a.variants},
                                 depths=a.depths, etas=a.etas, split=a.split, n_sentences=a.sentences,
                                 inits=a.inits, written_by=provenance(a.argv), **common)


def family(argv) -> str:
    """update-size's --family (fairseq unless given): torch and hf have a parser of their own."""
    if argv[:1] != ["update-size"]:
        return "fairseq"
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--family", default="fairseq")  # a wrong one: update-size's parser says so
    return p.parse_known_args(argv[1:])[0].family


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    stacks = family(argv) in ("torch", "hf")
    a = argparse.Namespace(command="update-size") if stacks else build_parser().parse_args(argv)
    a.argv = argv
    # hydra's and fairseq's deprecation notes would bury the progress lines; other warnings stay
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(hydra|omegaconf|fairseq)(\.|$)")
    for name in ("fairseq", "fairseq_tfixup", "hydra", "matplotlib", "PIL"):  # the progress lines are ours
        logging.getLogger(name).setLevel(logging.WARNING)
    previous = signal.signal(signal.SIGTERM, _interrupted)  # SIGTERM as Ctrl-C: one line, no traceback
    try:
        if stacks:
            from tfixup.update_size_stacks import main as update_size_stacks

            update_size_stacks(argv[1:], prog="tfixup-diagnose update-size")
        else:
            run(a)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"tfixup-diagnose: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tfixup-diagnose {a.command}: interrupted; nothing is half-made (every file it writes is written "
              "whole, at the end or per finished run); rerun the same command to run it again", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
