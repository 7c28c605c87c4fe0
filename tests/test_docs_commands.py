"""Every shell command in README.md and docs/*.md runs as written.

The commands are read from the Markdown (fenced blocks in bash/sh/no language, and indented
code blocks; a line continued with a backslash is one command, ``a; b`` are two). Each must be
in COVERED, which says how it is checked; a command added to the docs that COVERED does not
know fails ``test_every_documented_command_is_covered``, and so does an entry of COVERED that
the docs no longer hold. The checks run from the repo root, as the docs assume:

| kind    | what is run                                                                      |
|---------|----------------------------------------------------------------------------------|
| run     | the command as written (cheap: a dry run, a report of what is there)             |
| dry     | a full run: the command as written plus ``--dry-run`` (config, overrides and     |
|         | paths resolved, fairseq's command printed, nothing trained)                      |
| flags   | needs what is not here or takes hours (GPU, downloads, archives, studies): its   |
|         | program's ``--help`` runs and lists every ``--flag`` the command uses             |
| parse   | a fairseq-train line: fairseq's parser with the plugin accepts it (``DATA`` ->   |
|         | a data-bin; ``...`` and ``[optional]`` dropped); a complete one also names a     |
|         | batch size and a --save-dir under work/                                         |
| tiny    | the one real run: the CPU main job, tiny model and data (conftest.cpu_main_job)   |
| model   | a command on the main job's model: run as written on the tiny run's work folder  |
| summary | a command the main job's summary prints (there with the tiny run's work folder): |
|         | the same words (test_translate.py runs the printed one)                          |
| no-gpu  | as written; without a GPU it must stop at once with one line and write nothing   |
| install | a manual install step (not run: it installs packages); scripts/install.sh, which |
|         | made this environment, must hold the same step (the marker given)               |
| suite   | this suite's runner (not run: it would run this test); ``bash -n``               |
| lm      | the language-model recipe of docs/pipelines.md, its block run in order as written |
|         | on the first lines of the data with a tiny model (test_lm_recipe_...)            |
| example | an examples/hf_*.py script (minutes): its --help lists every flag the command    |
|         | uses; test_hf_examples.py runs it with tiny arguments (needs transformers)       |
"""

import functools
import gzip
import os
import pathlib
import re
import shlex
import subprocess

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}

_SHRUNK_IWSLT = ("MAX_EPOCH=0 MAX_UPDATE=300 MAX_TOKENS=2048 EMBED_DIM=128 FFN_DIM=256 HEADS=2 ENCODER_LAYERS=2 "
                 "DECODER_LAYERS=2 AVG_CANDIDATES=1 2 SAVE_INTERVAL_UPDATES=100 ")
COVERED = {
    # README.md
    "fairseq-train data-bin/iwslt14.tokenized.de-en --user-dir fairseq_tfixup --arch transformer_tfixup_iwslt_de_en "
    "--share-decoder-input-output-embed --optimizer adam --adam-betas (0.9,0.98) --lr 5e-4 "
    "--lr-scheduler inverse_sqrt_nowarmup --decay-period 4000 --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1 --dropout 0.5 --max-tokens 4000 --save-dir work/checkpoints/iwslt14-tfixup": ("parse",),
    "bash scripts/quickstart.sh --cpu": ("tiny",),
    "bash scripts/quickstart.sh": ("no-gpu",),
    "bash scripts/test.sh": ("suite",),
    "python3 -m venv .venv": ("install", '"$PYTHON" -m venv "$VENV"'),
    ". .venv/bin/activate": ("install", '. "$VENV/bin/activate"'),
    "pip install torch==2.13.0": ("install", "TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}"),
    "echo torch==$(python -c 'import torch; print(torch.__version__.split(+)[0])') > /tmp/torch.txt":
        ("install", 'echo "$TORCH_SPEC" > "$pin"'),
    "PIP_CONSTRAINT=/tmp/torch.txt PIP_BUILD_CONSTRAINT=/tmp/torch.txt pip install .[test,hf]":
        ("install", 'PIP_CONSTRAINT=$pin PIP_BUILD_CONSTRAINT=$pin pip_logged "$TFIXUP_ROOT[test,hf]"'),
    "bash scripts/prepare-iwslt14.sh --src de": ("flags",),
    "bash scripts/train.sh iwslt14_de_en_tfixup data-bin/iwslt14.tokenized.de-en work/runs/iwslt14_de_en_tfixup":
        ("dry",),
    # evaluate.sh --dry-run needs the config a trained run recorded: its --help instead
    "bash scripts/evaluate.sh iwslt14_de_en_tfixup data-bin/iwslt14.tokenized.de-en work/runs/iwslt14_de_en_tfixup":
        ("flags",),
    "bash scripts/table1.sh --dry-run": ("run",),
    # docs/baselines.md
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_iwslt_de_en --optimizer radam "
    "--adam-betas (0.9, 0.98) --adam-eps 1e-8 --weight-decay 1e-4 --lr 5e-4 --lr-scheduler inverse_sqrt_nowarmup "
    "--decay-period 4000 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_dsinit_wmt_en_de --encoder-layers 12 "
    "--decoder-layers 12 [--ds-init-alpha 1.0] --optimizer adam --adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt "
    "--warmup-updates 4000 --warmup-init-lr 1e-7 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_deepnorm_deep_narrow --encoder-layers 100 "
    "--decoder-layers 100 --optimizer adam --adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt "
    "--warmup-updates 4000 --warmup-init-lr 1e-7 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_lri_wmt_en_de --encoder-layers 24 "
    "--decoder-layers 24 --optimizer adam --adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt "
    "--warmup-updates 4000 --warmup-init-lr 1e-7 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_dyt_iwslt_de_en --optimizer adam "
    "--adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_rezero_iwslt_de_en --optimizer adam "
    "--adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000 ...": ("parse",),
    "fairseq-train DATA --user-dir fairseq_tfixup --arch transformer_iwslt_de_en --optimizer giadam "
    "--adam-betas (0.9, 0.98) --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000 ...": ("parse",),
    # docs/diagnostics.md
    "bash scripts/prepare-iwslt14.sh --out data-bin/iwslt14.de-en": ("flags",),
    "tfixup-diagnose grad-hist --data data-bin/iwslt14.de-en --model postln,tfixup --steps 100 --out diag": ("flags",),
    "tfixup-diagnose ln-norms --data data-bin/iwslt14.de-en --model postln,tfixup --steps 100 --out diag": ("flags",),
    "tfixup-diagnose grad-norms --data data-bin/iwslt14.de-en --depths 2,4,6,8,12 --out diag": ("flags",),
    "tfixup-diagnose hessian --model postln,preln,tfixup --dim 64 --ffn-dim 128 --heads 2 --out diag": ("flags",),
    "tfixup-diagnose update-size --data data-bin/iwslt14.de-en --model tfixup,postln,preln,noln --dim 64 "
    "--ffn-dim 128 --heads 2 --depths 1,2,4 --out diag": ("flags",),
    "tfixup-diagnose update-size --family torch --depths 1,2,4,8 --inits 1 --out diag": ("flags",),
    "tfixup-diagnose update-size --family hf --families llama --methods tfixup,stock --depths 1,2,4 --out diag":
        ("flags",),
    "tfixup-diagnose update-decomposition --data data-bin/iwslt14.de-en --model tfixup --dim 64 --ffn-dim 128 "
    "--heads 2 --depths 1,4,16 --variants as_built,zero_attn_bias_no_positions --out diag": ("flags",),
    "tfixup-diagnose fp16-headroom --data data-bin/iwslt14.de-en --model tfixup,postln,preln --dim 64 --ffn-dim 128 "
    "--heads 2 --depths 6,24 --steps 20 --out diag": ("flags",),
    # docs/measurements.md
    "python -m harness.bench.speed --out results/bench": ("flags",),
    "python -m harness.stack_update_size --out results/diagnostics": ("flags",),
    "python -m harness.stack_update_size --out results/diagnostics --untied": ("flags",),
    "python -m harness.stack_update_size --out results/diagnostics --encdec": ("flags",),
    "python -m harness.stack_update_size --out results/diagnostics --encdec --untied": ("flags",),
    "python -m harness.stack_update_size --out results/diagnostics --encoder-only --untied --methods tfixup,postln":
        ("flags",),
    # docs/beyond-fairseq.md: the install without fairseq
    "bash scripts/install.sh --hf-only": ("install", "--hf-only) HF_ONLY=1"),
    "pip install -r requirements-hf.txt": ("install", 'pip_logged -r "$TFIXUP_ROOT/requirements-hf.txt"'),
    "pip install --no-deps .": ("install", 'pip_logged --no-deps "$TFIXUP_ROOT"'),
    # docs/derivation.md
    "python -m harness.hf_update_size --out results/hf": ("flags",),
    "python -m harness.hf_trace --out results/hf": ("flags",),
    "python -m harness.hf_trace --out results/hf --stem hf_trace_normfree --updates 60 --arms "
    "tfixup,tfixup_sigmoid,tfixup_gatescale,tfixup_giadam": ("flags",),
    "python -m harness.hf_trace --data work/hf-data --out results/hf --stem hf_trace_normfree_L48 --layers 48 "
    "--updates 60 --arms tfixup,tfixup_sigmoid,tfixup_gatescale,tfixup_giadam": ("flags",),
    "python -m harness.hf_update_size --out results/hf --stem hf_update_size_parts --families llama,gpt2 "
    "--methods tfixup-attention,tfixup-mlp": ("flags",),
    # docs/beyond-fairseq.md: the plain-PyTorch example, as written (a 6-layer model, 100 steps: seconds)
    "python examples/tfixup_lm.py --layers 6 --steps 100": ("run",),
    # docs/pipelines.md
    "bash scripts/quickstart.sh --cpu --dry-run --no-install": ("run",),
    _SHRUNK_IWSLT + "bash scripts/quickstart.sh --cpu --experiment iwslt14_de_en_tfixup --valid-lines 500 "
    "--test-lines 300": ("dry",),
    "bash scripts/prepare-iwslt14.sh --src en --archive /data/de-en.tgz": ("flags",),
    "bash scripts/prepare-wmt17-en-de.sh": ("flags",),
    "bash scripts/prepare-wmt17-en-de.sh --archives /data/wmt --testsets /data/newstest": ("flags",),
    "bash scripts/prepare-wmt14-en-de.sh": ("flags",),
    "bash scripts/prepare-wmt18-fi-en.sh": ("flags",),
    "bash scripts/train.sh --dry-run wmt17_en_de_big_tfixup data-bin/wmt17_en_de work/runs/big": ("run",),
    "bash scripts/table1.sh -- --nproc 4": ("dry",),
    "bash scripts/table2.sh": ("dry",),
    "bash scripts/table3.sh": ("dry",),
    "bash scripts/fig4b.sh": ("dry",),
    "bash scripts/report.sh --runs work/runs iwslt14_de_en_tfixup iwslt14_de_en_postln": ("run",),
    _SHRUNK_IWSLT + "bash scripts/quickstart-iwslt14.sh --no-install --cpu --work /tmp/qs --valid-lines 500 "
    "--test-lines 300": ("dry",),
    # docs/baselines.md: the other methods' table rows
    "bash scripts/train.sh --set METHOD=radam --set PAPER_BLEU= --set ROW=WMT'17 En-De base, RAdam "
    "wmt17_en_de_base_postln data-bin/wmt17_en_de work/runs/wmt17_en_de_base_radam": ("dry",),
    "bash scripts/table1.sh --only iwslt14_de_en_rfixup --only iwslt14_de_en_radam": ("dry",),
    "bash scripts/table2.sh --only wmt17_en_de_base_25l_dlcl --only wmt17_en_de_base_30l_dlcl_preln -- --nproc 4":
        ("dry",),
    "bash scripts/table3.sh --only wmt14_en_de_base_12l_dsinit --only wmt14_en_de_base_20l_dsinit -- --nproc 4":
        ("dry",),
    "bash scripts/table3.sh --only wmt14_en_de_base_12l_lri --only wmt14_en_de_base_24l_lri -- --nproc 4": ("dry",),
    "bash scripts/prepare-iwslt14.sh --src de --out data-bin/iwslt14.tokenized.de-en": ("flags",),
    "bash scripts/train.sh iwslt14_de_en_radam data-bin/iwslt14.tokenized.de-en work/runs/iwslt14_de_en_radam":
        ("dry",),
    "bash scripts/evaluate.sh iwslt14_de_en_radam data-bin/iwslt14.tokenized.de-en work/runs/iwslt14_de_en_radam":
        ("flags",),  # --dry-run needs a trained run's record
    # docs/pipelines.md: the main job's model
    "echo Zwei Männer spielen Fußball im Park. | bash scripts/translate.sh "
    "work/quickstart-cpu-multi30k_de_en_cpu_tfixup/runs/multi30k_de_en_cpu_tfixup": ("summary",),
    "bash scripts/translate.sh --show work/quickstart-cpu-multi30k_de_en_cpu_tfixup/runs/multi30k_de_en_cpu_tfixup":
        ("model",),
    "MAX_EPOCH=14 bash scripts/quickstart.sh --cpu": ("dry",),
    # docs/measurements.md: the evidence studies
    "bash scripts/prepare-iwslt14.sh --out work/data-bin/iwslt14-v1000 --valid-lines 1000": ("flags",),
    "bash scripts/prepare-corpus.sh --src de --tgt en --train ../shared/data/multi30k/train "
    "--valid ../shared/data/multi30k/val --test ../shared/data/multi30k/test_2016_flickr "
    "--lowercase --bpe-merges 8000 --out work/data-bin/multi30k.de-en": ("flags",),
    "python -m harness.bench.convergence --out results/bench --data work/data-bin/iwslt14-v1000": ("flags",),
    "python -m harness.bench.quality --out results/bench --multi30k work/data-bin/multi30k.de-en "
    "--iwslt work/data-bin/iwslt14-v1000": ("flags",),
    "python -m harness.bench.depth --out results/bench --data work/data-bin/iwslt14-v1000": ("flags",),
    "python -m harness.bench.batch --out results/bench --data work/data-bin/iwslt14-v1000": ("flags",),
    "python -m harness.bench.lm --out results/bench --jobs 1": ("flags",),
    # docs/measurements.md: the GPU study, prepared here (downloads fairseq's sources) and its CPU mode
    # (tests/test_bench_gpu.py runs both on small data)
    "python -m harness.bench.gpu prepare": ("flags",),
    "python -m harness.bench.gpu --device cpu --smoke --out /tmp/gpu --data work/data-bin/iwslt14-v1000 "
    "--hf-data work/hf-data": ("flags",),
    # docs/pipelines.md: a language model with fairseq's own tools (one block, run in order)
    "mkdir -p work/lm-text": ("lm",),
    "zcat ../shared/data/multi30k/train.en.gz | sacremoses -l en -j 1 tokenize | tr [:upper:] [:lower:] > "
    "work/lm-text/train.txt": ("lm",),
    "zcat ../shared/data/multi30k/val.en.gz | sacremoses -l en -j 1 tokenize | tr [:upper:] [:lower:] > "
    "work/lm-text/valid.txt": ("lm",),
    "fairseq-preprocess --only-source --trainpref work/lm-text/train.txt --validpref work/lm-text/valid.txt "
    "--thresholdsrc 2 --destdir work/data-bin/lm-multi30k-en --workers 1": ("lm",),
    "fairseq-train work/data-bin/lm-multi30k-en --user-dir fairseq_tfixup --task language_modeling "
    "--arch transformer_lm_tfixup_small --share-decoder-input-output-embed --optimizer adam --adam-betas (0.9,0.98) "
    "--lr 1e-3 --lr-scheduler inverse_sqrt_nowarmup --decay-period 4000 --tokens-per-sample 64 "
    "--sample-break-mode none --max-tokens 1024 --max-update 400 --dropout 0.1 --save-dir work/checkpoints/lm-tfixup":
        ("lm",),
    "fairseq-eval-lm work/data-bin/lm-multi30k-en --user-dir fairseq_tfixup "
    "--path work/checkpoints/lm-tfixup/checkpoint_best.pt --gen-subset valid --tokens-per-sample 64 --max-tokens 1024":
        ("lm",),
    # docs/beyond-fairseq.md: the HuggingFace examples and the study (the study on a GPU machine)
    "python examples/hf_translation.py": ("example",),
    "python examples/hf_causal_lm.py --model llama": ("example",),
    "python examples/hf_causal_lm.py --model gpt2": ("example",),
    "python examples/hf_causal_lm.py --model llama --layers 24 --keep-mlp-norm": ("example",),
    "python examples/hf_masked_lm.py": ("example",),
    "python examples/hf_trainer.py --model gpt2 --out work/hf-trainer-gpt2": ("example",),
    "python examples/hf_trainer.py --model llama --keep-mlp-norm --out work/hf-trainer-llama": ("example",),
    "python examples/hf_trainer.py --model marian --out work/hf-trainer-marian": ("example",),
    "python -m harness.bench.hf export --out work/hf-data": ("flags",),
    # docs/measurements.md: the lr study's fairseq bundle for a GPU machine without a package index
    "python -m tools.device_bundle make": ("flags",),
    "python -m harness.bench.hf --estimate --data work/hf-data": ("flags",),
    "python -m harness.bench.hf --out results/bench --data work/hf-data --device cuda --jobs 8": ("flags",),
    "python -m harness.bench.hf --out results/bench --data work/hf-data --report-only": ("flags",),
    "python -m harness.bench.hf --out results/bench --data work/hf-data --select llama-L24-*-s2": ("flags",),
}


# ---------------------------------------------------------------- reading the Markdown


def code_blocks(text: str) -> list:
    """Shell code blocks: fenced ones in a shell language (or none), and indented ones
    (4 spaces, after a blank line: an indented line cannot continue a paragraph)."""
    out, fence, fenced, indented, prev_blank = [], None, [], [], True
    for line in text.splitlines() + [""]:
        if fence is not None:
            if line.strip().startswith("```"):
                if fence in SHELL_LANGS:
                    out.append(fenced)
                fence = None
            else:
                fenced.append(line)
            continue
        m = re.match(r"^\s*```(\w*)", line)
        if m:
            fence, fenced, prev_blank = m.group(1), [], False
            continue
        if line.startswith("    ") and (indented or prev_blank):
            indented.append(line[4:])
            continue
        if indented:
            out.append(indented)
            indented = []
        prev_blank = not line.strip()
    return out


def commands(block: list) -> list:
    """One word list per command: continuation lines joined, comments dropped, split on ';',
    words as the shell reads them (quotes removed)."""
    lines, cur = [], ""
    for line in block:
        cur += line
        if cur.rstrip().endswith("\\"):
            cur = cur.rstrip()[:-1] + " "
            continue
        lines.append(cur)
        cur = ""
    out = []
    for line in lines:
        lex = shlex.shlex(line, posix=True, punctuation_chars=";")
        lex.whitespace_split = True
        cmd = []
        for tok in [*lex, ";"]:
            if tok == ";":
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(tok)
    return out


def documented() -> dict:
    """command (its words joined by spaces, the key of COVERED) -> (its words, the files that show it)."""
    found = {}
    for doc in DOCS:
        for block in code_blocks(doc.read_text(encoding="utf-8")):
            for words in commands(block):
                found.setdefault(" ".join(words), (words, []))[1].append(doc.name)
    return found


def split_env(words: list):
    """(environment assignments, argv) of a command's words."""
    words = list(words)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def run(argv, env=None, cwd=REPO, check=True):
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    if check:
        assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc


def gpu_visible() -> bool:
    return run(["bash", "-c", ". scripts/lib.sh; . scripts/pipeline-lib.sh; gpu_count"]).stdout.strip() != "0"


# ---------------------------------------------------------------- the checks


def test_extractor_reads_blocks_continuations_comments_and_semicolons():
    md = ("text\n\n    a --x 1 \\\n        --y 2   # comment\n    b\nparagraph\n    not code\n\n"
          "```bash\nc; d 'e f'\n```\n```python\nprint(1)\n```\n")
    assert [c for b in code_blocks(md) for c in commands(b)] == [
        ["a", "--x", "1", "--y", "2"], ["b"], ["c"], ["d", "e f"]]


def test_every_documented_command_is_covered():
    found = DOCUMENTED
    unknown = [f"{cmd}  ({', '.join(files)})" for cmd, (_, files) in found.items() if cmd not in COVERED]
    assert not unknown, "documented commands this test does not check (add each to COVERED):\n" + "\n".join(unknown)
    stale = [cmd for cmd in COVERED if cmd not in found]
    assert not stale, "COVERED lists commands the docs no longer show:\n" + "\n".join(stale)


def _with_dry_run(argv):
    """--dry-run before a '--' that passes the rest on, else at the end."""
    i = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:i], "--dry-run", *argv[i:]]


@functools.lru_cache(maxsize=None)
def _help(program: tuple) -> str:
    """PROGRAM --help: a script in a subprocess, a Python entry point in this process (fairseq is
    imported once, not once per command)."""
    if program[0] == "bash":
        return run([*program, "--help"]).stdout
    import contextlib
    import importlib
    import io

    module, args = (program[2], []) if program[0] == "python" else ("fairseq_tfixup.diagnostics.cli", [*program[1:]])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        importlib.import_module(module).main([*args, "--help"])
    assert done.value.code in (0, None), out.getvalue()
    return out.getvalue()


def _example_help(script: str) -> str:
    """examples/X.py --help, in this process (transformers is imported once)."""
    import contextlib
    import importlib
    import io
    import sys

    sys.path.insert(0, str(REPO / "examples"))
    try:
        module = importlib.import_module(pathlib.Path(script).stem)
    finally:
        sys.path.remove(str(REPO / "examples"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code in (0, None), out.getvalue()
    return out.getvalue()


def _program(argv):
    """The words that name the program (and its subcommand) of argv."""
    if argv[0] == "bash":
        return tuple(argv[:2])
    if argv[:2] == ["python", "-m"]:
        return tuple(argv[:3])
    if argv[0] == "tfixup-diagnose":  # update-size --family torch|hf: a parser of its own
        return tuple(argv[:4] if argv[2:3] == ["--family"] else argv[:2])
    raise AssertionError(f"no --help rule for {argv}")


def _parse_fairseq_train(argv):
    from fairseq import options

    import fairseq_tfixup  # noqa: F401  (what --user-dir fairseq_tfixup loads)

    words = [w.strip("[]") for w in argv[1:] if w != "..."]
    words = ["/nonexistent/data-bin" if w == "DATA" else w for w in words]
    return options.parse_args_and_arch(options.get_training_parser(), input_args=words)


DOCUMENTED = documented()
# the tiny run has its own test; a command missing from the docs fails the coverage test
CHECKS = sorted(c for c, how in COVERED.items() if how[0] not in ("tiny", "model", "summary", "lm") and c in DOCUMENTED)
MAIN_JOB_WORK = "work/quickstart-cpu-multi30k_de_en_cpu_tfixup"


@pytest.mark.parametrize("cmd", CHECKS, ids=[c[:60] for c in CHECKS])
def test_documented_command(cmd):
    kind, *detail = COVERED[cmd]
    env, argv = split_env(DOCUMENTED[cmd][0])
    if kind == "run":
        run(argv, env)
    elif kind == "dry":
        if "quickstart" in argv[1]:
            argv = [*argv, "--no-install"] if "--no-install" not in argv else argv
        out = run(_with_dry_run(argv), env).stdout
        assert "fairseq-train" in out or "bash " in out, out[-2000:]
    elif kind == "flags":
        text = _help(_program(argv))
        for flag in (w for w in argv if w.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", text), f"{flag} is not in {' '.join(_program(argv))} --help"
    elif kind == "example":
        pytest.importorskip("transformers")
        text = _example_help(argv[1])
        for flag in (w for w in argv if w.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", text), f"{flag} is not in {argv[1]} --help"
    elif kind == "parse":
        args = _parse_fairseq_train(argv)
        assert args.user_dir == "fairseq_tfixup"
        if "..." not in argv:  # a complete command: it must run, and write under work/
            assert args.max_tokens or args.batch_size, "fairseq-train needs --max-tokens or --batch-size"
            assert args.save_dir.startswith("work/"), f"--save-dir {args.save_dir}: checkpoints belong under work/"
    elif kind == "no-gpu":
        if gpu_visible():
            run([*argv, "--dry-run", "--no-install"], env)
            return
        # "at once": before installing, preparing or training anything (its one line, nothing written)
        before = set(REPO.glob("work/quickstart-*"))
        proc = run(argv, env, check=False)
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [
            "error: no CUDA GPU visible: rerun with --cpu (the CPU main job: a small model on Multi30k De-En)"]
        assert set(REPO.glob("work/quickstart-*")) == before
    elif kind == "install":
        assert detail[0] in (REPO / "scripts" / "install.sh").read_text(), f"scripts/install.sh lacks: {detail[0]}"
    elif kind == "suite":
        run(["bash", "-n", argv[1]])
        assert re.search(r"^python -m pytest -q .*\btests\b", (REPO / argv[1]).read_text(), re.M)
    else:
        raise AssertionError(f"unknown kind {kind}")


@pytest.mark.parametrize("cmd", [c for c, how in COVERED.items() if how[0] in ("model", "summary")])
def test_documented_command_on_the_main_jobs_model(cmd, cpu_main_job):
    """As written, in the tiny main job's work folder instead of the default one; or, a command the summary
    prints, the same words as the summary's."""
    work, summary, _ = cpu_main_job
    words = [w.replace(MAIN_JOB_WORK, str(work)) for w in DOCUMENTED[cmd][0]]
    assert MAIN_JOB_WORK in cmd
    if COVERED[cmd][0] == "summary":
        # the summary's command lines (its example sentences may hold a lone quote: not split)
        printed = [shlex.split(line) for line in summary.splitlines() if "bash scripts/" in line]
        assert words in printed, f"the summary prints no such command: {' '.join(words)}"
        return
    line = " ".join(w if w == "|" else shlex.quote(w) for w in words)
    assert run(["bash", "-c", line], {"OMP_NUM_THREADS": "1"}).stdout.strip()


def test_cpu_main_job_tiny_run_prints_bleu_translations_curve_and_report(shared_data, cpu_main_job):
    """`bash scripts/quickstart.sh --cpu` with its config shrunk (conftest.cpu_main_job) and --work
    in a temp folder, to the end: BLEU with signature, the first three test sentences, the
    curve as a PNG, the report; nothing written outside --work."""
    work, out, left_in_checkout = cpu_main_job
    assert re.search(r"tokenized BLEU +\d+\.\d\d", out), out
    assert re.search(r"sacreBLEU +\d+\.\d\d +nrefs:1\|case:lc\|", out), out
    triples = re.findall(r"\[(\d+)\] source: +(.+)\n +reference: +(.+)\n +hypothesis: (.*)", out)
    assert [t[0] for t in triples] == ["0", "1", "2"], out
    # the references shown are the first test sentences of the real data (tokenized, lowercased)
    with gzip.open(shared_data / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        first = [next(f) for _ in range(3)]
    letters = lambda s: re.sub(r"\W", "", s.lower())
    assert [letters(t[2]) for t in triples] == [letters(s) for s in first]
    assert [int(e) for e in re.findall(r"epoch +(\d+) +updates", out)] == [1, 2]
    assert re.search(r"epoch +2 +updates +\d+ +valid loss \d+\.\d+ +valid BLEU \d+\.\d\d", out), out
    run_dir = work / "runs" / "multi30k_de_en_cpu_tfixup"
    png, report = run_dir / "learning-curve.png", run_dir / "report.md"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Learning curve (PNG): {png}" in out and f"Report: {report}" in out
    assert "| Main job (CPU): Multi30k De-En, T-Fixup |" in report.read_text()
    assert (work / "data-bin" / "multi30k.de-en-n1000-v40-t20" / "dict.de.txt").is_file()
    assert left_in_checkout == []


# what the LM recipe's fairseq-train gets before its --save-dir (later flags win): a model and run of seconds
_TINY_LM = ("--decoder-layers 2 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 2 "
            "--max-update 6 ")


def test_lm_recipe_trains_saves_a_checkpoint_and_evaluates(shared_data, tmp_path):
    """The block of docs/pipelines.md that holds fairseq-eval-lm, run by bash in order as written, with three
    changes: the first 2000 train and 200 valid lines of the data, work/ under a temp folder, a tiny model
    (the flags above, added before --save-dir); the tools come from this Python's environment."""
    import gzip
    import sys

    text = (REPO / "docs" / "pipelines.md").read_text(encoding="utf-8")
    block = next("\n".join(b) for b in code_blocks(text) if any("fairseq-eval-lm" in line for line in b))
    data = tmp_path / "multi30k"
    data.mkdir()
    for split, n in (("train", 2000), ("val", 200)):
        with gzip.open(shared_data / "multi30k" / f"{split}.en.gz", "rt", encoding="utf-8") as f, \
                gzip.open(data / f"{split}.en.gz", "wt", encoding="utf-8") as out:
            out.writelines(line for _, line in zip(range(n), f))
    assert block.count("--save-dir ") == 1 and "../shared/data/multi30k/" in block
    script = (block.replace(". .venv/bin/activate\n", "")
              .replace("../shared/data/multi30k/", f"{data}/").replace("work/", f"{tmp_path}/work/")
              .replace("--save-dir ", _TINY_LM + "--save-dir "))
    assert script.count("work/") == script.count(f"{tmp_path}/work/")  # nothing written into the checkout
    env = {"OMP_NUM_THREADS": "1", "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert (tmp_path / "work" / "checkpoints" / "lm-tfixup" / "checkpoint_best.pt").is_file()
    assert "TransformerLanguageModel" in out or "transformer_lm_tfixup_small" in out, out[-3000:]
    assert re.search(r"Loss \(base 2\): \d+\.\d+, Perplexity: \d+\.\d+", out), out[-3000:]
