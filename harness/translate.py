"""Translate your own text with a trained run (scripts/translate.sh): the text is made into tokens
exactly as the run's data-bin was (the steps its manifest records, ``manifest.json["preprocess"]``:
punctuation normalization, Moses tokenizer, lowercasing, the data-bin's BPE codes), the run's final
model translates it (beam and length penalty of its config), and the output is detokenized (and
sentence-cased when the data-bin was lowercased: its first letter and "I" upper-case).

    python3 -m harness.translate RUN_DIR [FILE]   one translation per input line (stdin without FILE)
    python3 -m harness.translate --show RUN_DIR   the model, data-bin, dictionaries and BPE codes it uses

The model loads through fairseq's hub (``TransformerModel.from_pretrained``) after ``import
fairseq_tfixup``, which lets torch's safe loader (``weights_only=True``) read fairseq's checkpoints.
"""

import argparse
import json
import logging
import os
import pathlib
import pickle
import re
import shlex
import sys
import warnings
from typing import Dict, List, Optional, Sequence

from harness import config, manifest

# the final model of a run, best first: the checkpoint average scripts/evaluate.sh scored, else
# fairseq's best (lowest valid loss), else its last
MODEL_CANDIDATES = ("eval/averaged.pt", "checkpoints/checkpoint_best.pt", "checkpoints/checkpoint_last.pt")


class TranslateError(ValueError):
    """What stops a translation, in one line naming the input and the fix."""


def final_model(run) -> pathlib.Path:
    run = pathlib.Path(run)
    for rel in MODEL_CANDIDATES:
        if (run / rel).is_file():
            return run / rel
    raise TranslateError(f"{run} holds no model ({', '.join(MODEL_CANDIDATES)}): train it with scripts/train.sh "
                         "(and evaluate it with scripts/evaluate.sh for the averaged model)")


def run_data(run) -> pathlib.Path:
    """The data-bin the run trained on (its record, config.resolved.json)."""
    try:
        rec = config.read_record(run)
    except config.ConfigError as e:
        raise TranslateError(str(e)) from None
    path = (rec.get("data") or {}).get("path")
    if not path or not pathlib.Path(path).is_dir():
        raise TranslateError(f"the data-bin {run} trained on ({path or 'not recorded'}) is not there: "
                             "its dictionaries and BPE codes are needed to translate")
    return pathlib.Path(path)


def rebuild_command(run, data, params: Dict) -> str:
    """The command that makes DATA again with the same parameters (for a data-bin made before a field
    was recorded): the run's PREPARE, its output and line counts."""
    try:
        words = config.prepare_words(config.resolve_run(run, environ={}).values["PREPARE"])
    except (config.ConfigError, KeyError):
        words = []
    if not words:
        return f"rm -rf {shlex.quote(str(data))}, then rerun the scripts/prepare-*.sh command that made it"
    cmd = ["bash", f"scripts/{words[0]}", *words[1:], "--out", str(data)]
    # the sizes the manifest recorded, in place of the config's (e.g. BPE_MERGES for a smoke run)
    for key in ("bpe_merges", "bpe_tokens", "train_lines", "valid_lines", "test_lines"):
        flag, value = f"--{key.replace('_', '-')}", str(params.get(key, "0"))
        if flag in cmd:
            i = cmd.index(flag)
            del cmd[i:i + 2]
        if value != "0" or key.startswith("bpe_") and key in params:
            cmd += [flag, value]
    return f"rm -rf {shlex.quote(str(data))} && " + " ".join(shlex.quote(w) for w in cmd)


def text_steps(data, run=None) -> Dict:
    """The data-bin's preprocessing (manifest["preprocess"], harness/manifest.py PREPROCESS_KEYS) plus
    its languages. A prepare-corpus.sh data-bin made before the field was recorded has it in its
    parameters (tokenizer, lowercase, bpe_merges); any other one must be made again."""
    data = pathlib.Path(data)
    m = manifest.read(str(data))
    if not m or m.get("complete") is not True:
        raise TranslateError(f"{data} has no complete {manifest.NAME}: the preprocessing its text had is unknown; "
                             f"remake it with its scripts/prepare-*.sh")
    params = m.get("params", {})
    steps = m.get("preprocess")
    if steps is None and m.get("made_by") == "scripts/prepare-corpus.sh" and "tokenizer" in params:
        bpe = str(params.get("bpe_merges", "0")) != "0"
        steps = {"normalize_punctuation": False, "remove_nonprinting": False, "tokenizer": params["tokenizer"],
                 "aggressive_dash_splits": False, "lowercase": str(params.get("lowercase")) == "1",
                 "bpe": "subword_nmt" if bpe else "none", "bpe_codes": "code" if bpe else ""}
    if steps is None:
        raise TranslateError(f"{data}/{manifest.NAME} lacks the field 'preprocess' (made before it was recorded): "
                             f"make the data-bin again: {rebuild_command(run, data, params) if run else 'its prepare script'}")
    missing = [k for k in manifest.PREPROCESS_KEYS if k not in steps]
    if missing or not params.get("src") or not params.get("tgt"):
        field = f"preprocess.{missing[0]}" if missing else "params.src/tgt"
        raise TranslateError(f"{data}/{manifest.NAME} lacks the field '{field}': make the data-bin again: "
                             f"{rebuild_command(run, data, params) if run else 'its prepare script'}")
    check_steps(steps, data, rebuild_command(run, data, params) if run else "its prepare script")
    return {**steps, "src": params["src"], "tgt": params["tgt"]}


# BPE codes the prepare scripts write are well under 1 MB (40k merges); a file larger than this is
# no codes file of theirs, and subword-nmt would read it whole into memory
MAX_CODES_BYTES = 64 << 20


def check_steps(steps: Dict, data: pathlib.Path, rebuild: str) -> None:
    """Each recorded step has a value of its kind (manifest.PREPROCESS_KEYS): a manifest is read from a
    data-bin that may come from elsewhere, and a value this code does not know (a tokenizer '-a') was
    silently no step at all. The BPE codes are a file of the data-bin itself, of a sane size."""
    for key, kind in manifest.PREPROCESS_KEYS.items():
        value = steps[key]
        ok = (isinstance(value, bool) if kind is bool else value in kind if isinstance(kind, tuple)
              else isinstance(value, str))
        if not ok:
            allowed = "true or false" if kind is bool else " or ".join(kind) if isinstance(kind, tuple) else "a string"
            raise TranslateError(f"{data}/{manifest.NAME}: preprocess.{key} is {value!r}, not {allowed}: "
                                 f"make the data-bin again: {rebuild}")
    codes = steps["bpe_codes"]
    if steps["bpe"] == "none":
        return
    path = data / codes
    if not codes or pathlib.PurePath(codes).name != codes or codes in (".", "..") \
            or os.path.realpath(path) != os.path.join(os.path.realpath(data), codes):
        raise TranslateError(f"{data}/{manifest.NAME}: preprocess.bpe_codes {codes!r} is not a file of the data-bin "
                             f"(a plain name such as 'code', no folder, no link out): make the data-bin again: {rebuild}")
    if not path.is_file():
        raise TranslateError(f"{data} lacks its BPE codes {codes} that {manifest.NAME} names")
    if path.stat().st_size > MAX_CODES_BYTES:
        raise TranslateError(f"{path} is {path.stat().st_size >> 20} MB, not BPE codes the prepare scripts write (at "
                             f"most {MAX_CODES_BYTES >> 20} MB): make the data-bin again: {rebuild}")


class TextPipeline:
    """Raw text -> the data-bin's tokens, and the model's tokens -> text (sacremoses, subword-nmt)."""

    def __init__(self, steps: Dict, data):
        from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

        self.steps = steps
        src, tgt = steps["src"], steps["tgt"]
        # as `sacremoses normalize` / `tokenize` run in the prepare scripts (their command-line defaults)
        self.normalizer = MosesPunctNormalizer(src) if steps["normalize_punctuation"] else None
        self.tokenizer = MosesTokenizer(lang=src) if steps["tokenizer"] == "moses" else None
        self.detokenizer = MosesDetokenizer(lang=tgt) if steps["tokenizer"] == "moses" else None
        self.bpe = None
        if steps["bpe"] == "subword_nmt":
            from subword_nmt.apply_bpe import BPE

            with open(pathlib.Path(data) / steps["bpe_codes"], encoding="utf-8") as f:
                self.bpe = BPE(f)

    def encode(self, line: str) -> str:
        line = line.strip()
        if self.normalizer:
            line = self.normalizer.normalize(line)
        if self.steps["remove_nonprinting"]:
            from harness.corpus import nonprinting_to_space

            line = nonprinting_to_space(line)
        if self.tokenizer:
            line = self.tokenizer.tokenize(line, return_str=True, escape=True,
                                           aggressive_dash_splits=self.steps["aggressive_dash_splits"])
        if self.steps["lowercase"]:
            line = line.lower()
        if self.bpe:
            line = self.bpe.process_line(line)
        return line.strip()

    def decode(self, tokens: str) -> str:
        if self.bpe:  # fairseq's --remove-bpe (subword_nmt): "@@ " joins
            tokens = (tokens + " ").replace("@@ ", "").rstrip()
        if self.detokenizer:
            tokens = self.detokenizer.detokenize(tokens.split())
        return recase(tokens) if self.steps["lowercase"] else tokens


def recase(text: str) -> str:
    """A lowercased model's output as a sentence: its first letter and the pronoun "i" upper-case (the
    model saw no case; names stay lowercase)."""
    text = re.sub(r"(?<![\w'])i(?=$|[\s,.;:!?'])", "I", text)
    return text[:1].upper() + text[1:]


def check_model(model: pathlib.Path) -> None:
    """MODEL read by the project's safe loader first (weights_only, CRCs, the literals fairseq evaluates;
    tensors memory-mapped): a corrupt or foreign file stops here in one line, not in fairseq's traceback."""
    from tfixup import checkpoints, literals

    try:
        checkpoints.load(model, mmap=True, check_crc=True)
    except (checkpoints.CorruptCheckpoint, pickle.UnpicklingError, literals.NotALiteral) as e:
        raise TranslateError(f"{e}: translate with another checkpoint of the run, or train it again") from None


def load_hub(model: pathlib.Path, data: pathlib.Path):
    """fairseq's hub interface on MODEL with DATA's dictionaries, loaded safely (torch's weights_only)."""
    check_model(model)
    import fairseq_tfixup  # noqa: F401  (registers the plugin and the types torch may load)
    from fairseq.models.transformer import TransformerModel

    for name in ("fairseq", "fairseq_tfixup"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # torch's data loader, which fairseq's hub uses, warns on every batch of a machine without a GPU
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")
    try:
        return TransformerModel.from_pretrained(str(model.parent), checkpoint_file=model.name,
                                                data_name_or_path=str(data.resolve()))
    except pickle.UnpicklingError as e:
        cause = next((l.strip() for l in str(e).splitlines() if "GLOBAL" in l or "global" in l), "")
        raise TranslateError(f"{model}: refused by torch's safe loader: {cause} (not a checkpoint fairseq wrote)") \
            from None


class Translator:
    def __init__(self, run, model: Optional[pathlib.Path] = None):
        self.run = pathlib.Path(run)
        self.model = model or final_model(self.run)
        self.data = run_data(self.run)
        self.steps = text_steps(self.data, self.run)
        self.text = TextPipeline(self.steps, self.data)
        values = config.resolve_run(self.run, environ={}).values  # as the run was evaluated
        # the length cap of scripts/evaluate.sh (same environment variables and defaults): an undertrained
        # model would otherwise write up to 200 tokens a sentence
        self.gen = {"beam": int(values["BEAM"]), "lenpen": float(values["LENPEN"]),
                    "max_len_a": float(os.environ.get("MAX_LEN_A", "1.2")),
                    "max_len_b": int(os.environ.get("MAX_LEN_B", "10"))}
        self.hub = load_hub(self.model, self.data)

    def translate(self, lines: Sequence[str]) -> List[Dict]:
        """Per line: the source as the model saw it, the model's output tokens and the detokenized text."""
        out = [{"source": line.rstrip("\n"), "tokens_in": self.text.encode(line)} for line in lines]
        todo = [i for i, r in enumerate(out) if r["tokens_in"]]
        batch = [self.hub.binarize(out[i]["tokens_in"]) for i in todo]
        hypos = self.hub.generate(batch, **self.gen) if batch else []
        for r in out:
            r["tokens_out"], r["translation"] = "", ""
        for i, tokens, h in zip(todo, batch, hypos):
            out[i]["tokens_in"] = self.hub.src_dict.string(tokens)  # as the model read it: <unk> shows
            out[i]["tokens_out"] = self.hub.tgt_dict.string(h[0]["tokens"])
            out[i]["translation"] = self.text.decode(out[i]["tokens_out"])
        return out


def show(run) -> Dict:
    """Where a run's model and everything it needs to translate are."""
    run = pathlib.Path(run)
    data = run_data(run)
    steps = text_steps(data, run)
    return {"model": str(final_model(run)), "data": str(data),
            "dictionaries": [str(data / f"dict.{steps['src']}.txt"), str(data / f"dict.{steps['tgt']}.txt")],
            "bpe_codes": str(data / steps["bpe_codes"]) if steps["bpe_codes"] else None, "preprocess": steps}


# ---------------------------------------------------------------- telling a user how to use the model

# a sentence to show the model on, by source language (else the first sentence of the test set)
EXAMPLE_SOURCES = {"de": "Zwei Männer spielen Fußball im Park.", "en": "Two men are playing football in the park."}


def shown_path(path) -> str:
    """PATH as a user in the current folder types it: relative when below it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else os.path.abspath(path)


def example_source(data, src: str) -> str:
    if src in EXAMPLE_SOURCES:
        return EXAMPLE_SOURCES[src]
    raw = pathlib.Path(data) / f"test.raw.{src}"
    return raw.read_text(encoding="utf-8").split("\n", 1)[0] if raw.is_file() else "..."


def hub_snippet(run, model: pathlib.Path, data: pathlib.Path, steps: Dict, sentence: str, beam: int) -> str:
    """Python that loads MODEL with fairseq's hub and translates SENTENCE, with the data-bin's steps as far
    as fairseq's hub has them (it has no lowercasing: the text is lowercased first)."""
    kwargs = [f"checkpoint_file={model.name!r}", f"data_name_or_path={shown_path(data)!r}"]
    if steps["tokenizer"] == "moses":
        kwargs.append("tokenizer='moses'")
        if not steps["aggressive_dash_splits"]:
            kwargs.append("moses_no_dash_splits=True")
    if steps["bpe"] == "subword_nmt":
        kwargs += ["bpe='subword_nmt'", f"bpe_codes={shown_path(data / steps['bpe_codes'])!r}"]
    text = repr(sentence) + (".lower()" if steps["lowercase"] else "")
    return "\n".join([
        "import fairseq_tfixup  # first: lets torch's safe loader read fairseq's checkpoints",
        "from fairseq.models.transformer import TransformerModel",
        f"model = TransformerModel.from_pretrained({shown_path(model.parent)!r}, " + ", ".join(kwargs) + ")",
        f"print(model.translate({text}, beam={beam}))",
    ])


def usage(run, translator: Optional["Translator"] = None) -> Dict:
    """Where a run's model is and how to use it: the files, the translate command with one example
    (translated by the model when TRANSLATOR is given), a hub snippet."""
    run = pathlib.Path(run)
    info = show(run)
    model, data, steps = pathlib.Path(info["model"]), pathlib.Path(info["data"]), info["preprocess"]
    sentence = example_source(data, steps["src"])
    script = shown_path(pathlib.Path(__file__).resolve().parents[1] / "scripts" / "translate.sh")
    info.update(
        src=steps["src"], tgt=steps["tgt"], example_source=sentence,
        translate_command=f"echo {shlex.quote(sentence)} | bash {shlex.quote(script)} {shlex.quote(shown_path(run))}",
        translate_file_command=f"bash {shlex.quote(script)} {shlex.quote(shown_path(run))} FILE",
        example_translation=translator.translate([sentence])[0]["translation"] if translator else None,
        hub=hub_snippet(run, model, data, steps, sentence, int(config.resolve_run(run, environ={}).values["BEAM"])),
        steps_text=", ".join(filter(None, [
            "punctuation normalized" if steps["normalize_punctuation"] else "",
            "Moses-tokenized" if steps["tokenizer"] == "moses" else "",
            "lowercased" if steps["lowercase"] else "",
            f"BPE ({steps['bpe_codes']})" if steps["bpe"] != "none" else ""])) or "none",
    )
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/translate.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run of scripts/train.sh (its folder)")
    p.add_argument("file", nargs="?", help="text to translate, one sentence per line (default: stdin)")
    p.add_argument("--show", action="store_true", help="print the model, data-bin, dictionaries, BPE codes "
                                                       "and preprocessing used (JSON), translate nothing")
    p.add_argument("--verbose", action="store_true", help="also print, per line, the tokens the model read "
                                                          "(S:) and wrote (T:) on stderr")
    args = p.parse_args(argv)
    try:
        if args.show:
            print(json.dumps(show(args.run), indent=1))
            return 0
        translator = Translator(args.run)
        stream = open(args.file, encoding="utf-8") if args.file else sys.stdin
        with stream:
            if stream.isatty():  # typed: each line as it comes
                print(f"translating with {translator.model} ({translator.steps['src']} -> {translator.steps['tgt']}):"
                      " type a sentence, Enter; Ctrl-D ends", file=sys.stderr)
                chunks = ([line] for line in stream)
            else:
                chunks = iter([stream.readlines()])
            for chunk in chunks:
                for r in translator.translate(chunk):
                    if args.verbose:
                        print(f"S: {r['tokens_in']}\nT: {r['tokens_out']}", file=sys.stderr)
                    print(r["translation"], flush=True)
    except (TranslateError, config.ConfigError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: stop, without a traceback (the lines so far are printed)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
