"""Translate your own text with a trained run (scripts/translate.sh): the text is made into tokens exactly as the
run's data-bin was (the steps its manifest records, ``manifest.json["preprocess"]``: punctuation normalization,
Moses tokenizer, lowercasing, the data-bin's BPE codes), the run's final model translates it (beam and length penalty
of its config), and the output is detokenized (and sentence-cased when the data-bin was lowercased: its first
letter and "I" upper-case).

    python3 -m harness.translate RUN_DIR [FILE]   one translation per input line (stdin without FILE)
    python3 -m harness.translate --show RUN_DIR   the model, data-bin, dictionaries and BPE codes it uses

The model loads through fairseq's hub after ``import fairseq_tfixup``, which lets torch's safe loader
(``weights_only=True``) read fairseq's checkpoints.
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

# a run's final model, best first: the checkpoint average evaluate.sh scored, fairseq's best (lowest valid loss), last
MODEL_CANDIDATES = ("eval/averaged.pt", "checkpoints/checkpoint_best.pt", "checkpoints/checkpoint_last.pt")


class TranslateError(ValueError):
    """What stops a translation, in one line naming the input and the fix."""


def final_model(run) -> pathlib.Path:
    found = [pathlib.Path(run) / rel for rel in MODEL_CANDIDATES if (pathlib.Path(run) / rel).is_file()]
    if found:
        return found[0]
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
    """The command that makes DATA again with the same parameters: the run's PREPARE, its output and line counts."""
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
    """The data-bin's preprocessing (manifest["preprocess"], manifest.PREPROCESS_KEYS) plus its languages. A
    prepare-corpus.sh data-bin made before the field was recorded has it in its parameters (tokenizer, lowercase,
    bpe_merges); any other one must be made again."""
    data = pathlib.Path(data)
    m = manifest.read(str(data))
    if not m or m.get("complete") is not True:
        raise TranslateError(f"{data} has no complete {manifest.NAME}: the preprocessing its text had is unknown; "
                             f"remake it with its scripts/prepare-*.sh")
    params = m.get("params", {})
    rebuild = rebuild_command(run, data, params) if run else "its prepare script"
    steps = m.get("preprocess")
    if steps is None and m.get("made_by") == "scripts/prepare-corpus.sh" and "tokenizer" in params:
        bpe = str(params.get("bpe_merges", "0")) != "0"
        steps = {"normalize_punctuation": False, "remove_nonprinting": False, "tokenizer": params["tokenizer"],
                 "aggressive_dash_splits": False, "lowercase": str(params.get("lowercase")) == "1",
                 "bpe": "subword_nmt" if bpe else "none", "bpe_codes": "code" if bpe else ""}
    missing = ["preprocess"] if steps is None else [f"preprocess.{k}" for k in manifest.PREPROCESS_KEYS
                                                    if k not in steps]
    if missing or not params.get("src") or not params.get("tgt"):
        why = " (made before it was recorded)" if steps is None else ""
        raise TranslateError(f"{data}/{manifest.NAME} lacks the field '{(missing or ['params.src/tgt'])[0]}'{why}: "
                             f"make the data-bin again: {rebuild}")
    check_steps(steps, data, rebuild)
    return {**steps, "src": params["src"], "tgt": params["tgt"]}


# BPE codes the prepare scripts write are well under 1 MB (40k merges); a file larger than this is
# no codes file of theirs, and subword-nmt would read it whole into memory
MAX_CODES_BYTES = 64 << 20


def check_steps(steps: Dict, data: pathlib.Path, rebuild: str) -> None:
    """Each step has a value of its kind (a manifest may come from elsewhere, and a value this code does not know,
    a tokenizer '-a', was silently no step at all); the BPE codes are a file of the data-bin itself, of a sane size."""
    for key, kind in manifest.PREPROCESS_KEYS.items():
        value = steps[key]
        ok = (isinstance(value, bool) if kind is bool else value in kind if isinstance(kind, tuple)
              else isinstance(value, str))
        if not ok:
            allowed = "true or false" if kind is bool else " or ".join(kind) if isinstance(kind, tuple) else "a string"
            raise TranslateError(f"{data}/{manifest.NAME}: preprocess.{key} is {value!r}, not {allowed}: "
                                 f"make the data-bin again: {rebuild}")
    codes, path = steps["bpe_codes"], data / steps["bpe_codes"]
    if steps["bpe"] == "none":
        return
    if not codes or pathlib.PurePath(codes).name != codes or codes in (".", "..") \
            or os.path.realpath(path) != os.path.join(os.path.realpath(data), codes):
        raise TranslateError(f"{data}/{manifest.NAME}: preprocess.bpe_codes {codes!r} is not a file of the data-bin (a "
                             f"plain name such as 'code', no folder, no link out): make the data-bin again: {rebuild}")
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
    """A lowercased model's output as a sentence: its first letter and the pronoun "i" upper-case (names stay lower)."""
    text = re.sub(r"(?<![\w'])i(?=$|[\s,.;:!?'])", "I", text)
    return text[:1].upper() + text[1:]


def load_hub(model: pathlib.Path, data: pathlib.Path):
    """fairseq's hub interface on MODEL with DATA's dictionaries, loaded safely (torch's weights_only). MODEL is
    read by the project's safe loader first (weights_only, CRCs, the literals fairseq evaluates; tensors
    memory-mapped): a corrupt or foreign file stops there in one line, not in fairseq's traceback."""
    from tfixup import checkpoints, literals

    try:
        checkpoints.load(model, mmap=True, check_crc=True)
    except (checkpoints.CorruptCheckpoint, pickle.UnpicklingError, literals.NotALiteral) as e:
        raise TranslateError(f"{e}: translate with another checkpoint of the run, or train it again") from None
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
        out = [{"source": line.rstrip("\n"), "tokens_in": self.text.encode(line), "tokens_out": "", "translation": ""}
               for line in lines]
        todo = [i for i, r in enumerate(out) if r["tokens_in"]]
        batch = [self.hub.binarize(out[i]["tokens_in"]) for i in todo]
        hypos = self.hub.generate(batch, **self.gen) if batch else []
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


# a sentence to show the model on, by source language (else the first sentence of the test set)
EXAMPLE_SOURCES = {"de": "Zwei Männer spielen Fußball im Park.", "en": "Two men are playing football in the park."}


def shown_path(path) -> str:
    """PATH as a user in the current folder types it: relative when below it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else os.path.abspath(path)


def hub_snippet(model: pathlib.Path, data: pathlib.Path, steps: Dict, sentence: str, beam: int) -> str:
    """Python that loads MODEL with fairseq's hub and translates SENTENCE, with the data-bin's steps as far as the
    hub has them (it has no lowercasing: the text is lowercased first)."""
    kwargs = [f"checkpoint_file={model.name!r}", f"data_name_or_path={shown_path(data)!r}"]
    if steps["tokenizer"] == "moses":
        kwargs.append("tokenizer='moses'")
        if not steps["aggressive_dash_splits"]:
            kwargs.append("moses_no_dash_splits=True")
    if steps["bpe"] == "subword_nmt":
        kwargs += ["bpe='subword_nmt'", f"bpe_codes={shown_path(data / steps['bpe_codes'])!r}"]
    text = repr(sentence) + (".lower()" if steps["lowercase"] else "")
    return "\n".join(["import fairseq_tfixup  # first: lets torch's safe loader read fairseq's checkpoints",
                      "from fairseq.models.transformer import TransformerModel",
                      f"model = TransformerModel.from_pretrained({shown_path(model.parent)!r}, {', '.join(kwargs)})",
                      f"print(model.translate({text}, beam={beam}))"])


def usage(run, translator: Optional["Translator"] = None) -> Dict:
    """Where a run's model is and how to use it: the files, the translate command with one example (translated by
    the model when TRANSLATOR is given), a hub snippet."""
    run = pathlib.Path(run)
    info = show(run)
    model, data, steps = pathlib.Path(info["model"]), pathlib.Path(info["data"]), info["preprocess"]
    raw = data / f"test.raw.{steps['src']}"
    sentence = EXAMPLE_SOURCES.get(steps["src"]) or (
        raw.read_text(encoding="utf-8").split("\n", 1)[0] if raw.is_file() else "...")
    script = shown_path(pathlib.Path(__file__).resolve().parents[1] / "scripts" / "translate.sh")
    info.update(
        src=steps["src"], tgt=steps["tgt"], example_source=sentence,
        translate_command=f"echo {shlex.quote(sentence)} | bash {shlex.quote(script)} {shlex.quote(shown_path(run))}",
        translate_file_command=f"bash {shlex.quote(script)} {shlex.quote(shown_path(run))} FILE",
        example_translation=translator.translate([sentence])[0]["translation"] if translator else None,
        hub=hub_snippet(model, data, steps, sentence, int(config.resolve_run(run, environ={}).values["BEAM"])),
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
        with open(args.file, encoding="utf-8") if args.file else sys.stdin as stream:
            if stream.isatty():  # typed: each line as it comes
                print(f"translating with {translator.model} ({translator.steps['src']} -> {translator.steps['tgt']}):"
                      " type a sentence, Enter; Ctrl-D ends", file=sys.stderr)
            for chunk in ([line] for line in stream) if stream.isatty() else [stream.readlines()]:
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
