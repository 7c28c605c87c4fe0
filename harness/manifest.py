"""A data-bin's manifest.json: what made it (inputs with sha256, parameters, sentence counts, <unk> rates) and what it
holds (every file's size), written by scripts/prepare-*.sh only after every check passed.

    python -m harness.manifest params [--base JSON] KEY VALUE ...   -> the parameters as JSON (one line)
    python -m harness.manifest status DIR PARAMS_JSON        -> current | differs | changed PATH | missing | foreign
    python -m harness.manifest write OUT --made-by SCRIPT --params JSON --counts train=N ... --inputs FILE ...
                                      [--preprocess-log LOG --max-unk P] [--bpe-merges N]
                                      [--keep-log FILE] [--preprocess KEY=VALUE ...]
    python -m harness.manifest check DIR       -> exit 0 complete (or none: a warning line), 1 incomplete or changed
    python -m harness.manifest count DIR SPLIT -> its sentence pairs
"""

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import re
import shutil
import sys

NAME = "manifest.json"
# fairseq-preprocess: "[de] .../valid.de: 1014 sents, 17000 tokens, 0.35% replaced (by <unk>)"
# (the path may hold spaces: everything up to the last "/" before the split's file name)
_PREPROCESS = re.compile(r"\[(\w+)\] (?:.*/)?(train|valid|test)\.(\w+): (\d+) sents, (\d+) tokens, ([\d.]+)% replaced")


class DataError(ValueError):
    """Data that must not be published, in one line naming the file and the fix."""


# How the text was made into the data-bin's tokens, recorded as manifest["preprocess"] so that new text can be made
# into the same tokens (harness/translate.py): each step in the order the prepare scripts run it. Keys and what their
# values may be (bools are written 0/1 on the command line).
PREPROCESS_KEYS = {
    "normalize_punctuation": bool,  # sacremoses normalize (Moses normalize-punctuation.perl)
    "remove_nonprinting": bool,     # Moses remove-non-printing-char.perl (harness.corpus nonprint)
    "tokenizer": ("moses", "none"),  # sacremoses tokenize (escaping on, as its command line does)
    "aggressive_dash_splits": bool,  # its -a
    "lowercase": bool,              # after tokenizing
    "bpe": ("subword_nmt", "none"),  # subword-nmt apply-bpe, separator @@
    "bpe_codes": str,               # a file of the data-bin ("code"); "" without BPE
}


def preprocess_record(pairs) -> dict:
    """KEY=VALUE words -> manifest["preprocess"], every key of PREPROCESS_KEYS given once with a valid value."""
    record = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        kind = PREPROCESS_KEYS.get(key)
        if not sep or kind is None or key in record:
            raise DataError(f"--preprocess {pair!r}: expected each of {', '.join(PREPROCESS_KEYS)} once, as KEY=VALUE")
        if kind is bool and value not in ("0", "1") or isinstance(kind, tuple) and value not in kind:
            allowed = "0 or 1" if kind is bool else f"one of {', '.join(kind)}"
            raise DataError(f"--preprocess {key}={value}: must be {allowed}")
        record[key] = value == "1" if kind is bool else value
    missing = [k for k in PREPROCESS_KEYS if k not in record]
    if missing:
        raise DataError(f"--preprocess lacks {', '.join(missing)}")
    return record


def read(path_dir):
    path = os.path.join(path_dir, NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def status(path_dir, params) -> str:
    """current: complete, made with PARAMS from inputs that still have their recorded sha256; differs: complete, other
    parameters; changed PATH: same parameters, but the input PATH's content changed (or it is gone); missing: no such
    folder; foreign: a folder without a complete manifest (half-made or not ours)."""
    if not os.path.exists(path_dir):
        return "missing"
    m = read(path_dir)
    if not m or m.get("complete") is not True:
        return "foreign"
    if m.get("params") != params:
        return "differs"
    for entry in m.get("inputs", []):
        path = entry.get("path", "")
        if not os.path.isfile(path) or sha256(path) != entry.get("sha256"):
            return f"changed {path}"
    return "current"


def unk_rates(log_text, counts):
    """<unk> rate per split.lang from fairseq-preprocess's log, checking its sentence counts."""
    rates = {}
    for lang, split, _l2, sents, _tokens, rate in _PREPROCESS.findall(log_text):
        if int(sents) != counts[split]:
            raise DataError(f"fairseq-preprocess binarized {sents} {split}.{lang} sentences, expected {counts[split]}")
        rates[f"{split}.{lang}"] = float(rate)
    return rates


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(params, counts, inputs, made_by, log_text=None, max_unk=None, bpe_merges=None, folder=None, preprocess=None):
    manifest = {"complete": True, "made_by": made_by, "params": params,
                "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "inputs": [{"path": os.path.realpath(p), "sha256": sha256(p)} for p in inputs], "sentences": counts}
    if folder is not None:  # every file of the data-bin but the manifest and fairseq-preprocess's log: name -> bytes
        manifest["files"] = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
                             if name not in (NAME, "preprocess.log") and os.path.isfile(os.path.join(folder, name))}
    if bpe_merges is not None:
        manifest["bpe_merges"] = bpe_merges
    if preprocess is not None:
        codes = preprocess["bpe_codes"]
        if (preprocess["bpe"] == "none") != (codes == ""):
            raise DataError(f"preprocess: bpe={preprocess['bpe']} with bpe_codes={codes!r}")
        if codes and folder is not None and not os.path.isfile(os.path.join(folder, codes)):
            raise DataError(f"preprocess names BPE codes {codes}, which the data-bin lacks")
        manifest["preprocess"] = preprocess
    if log_text is not None:
        unk = unk_rates(log_text, counts)
        want = 2 * len(counts)
        if len(unk) != want:
            raise DataError(f"fairseq-preprocess reported {len(unk)} of {want} files in its log")
        bad = {k: v for k, v in unk.items() if not k.startswith("train.") and v > max_unk}
        if bad:
            raise DataError(f"<unk> rate above {max_unk}% in {bad}: the BPE codes or the data do not match "
                            "(check the inputs, languages and tokenizer, or --max-unk-rate)")
        manifest["unk_rate_percent"] = unk
    return manifest


def check(path_dir):
    """For train.sh: None when complete, else the reason (one line)."""
    m = read(path_dir)
    if m is None:
        return None
    if m.get("complete") is not True:
        return f"{path_dir}/{NAME} says the data is incomplete"
    src, tgt = m.get("params", {}).get("src"), m.get("params", {}).get("tgt")
    bins = [f"{split}.{src}-{tgt}.{lang}.bin" for split in m.get("sentences", {}) for lang in (src, tgt) if src and tgt]
    for name in bins:
        if not os.path.exists(os.path.join(path_dir, name)):
            return f"{path_dir} lacks {name} that {NAME} lists"
    for name, size in m.get("files", {}).items():  # manifests before sizes were recorded have none
        path = os.path.join(path_dir, name)
        if not os.path.isfile(path):
            return f"{path_dir} lacks {name} that {NAME} lists"
        if os.path.getsize(path) != size:
            return (f"{path} is {os.path.getsize(path)} bytes, but {NAME} says {size} (truncated or replaced "
                    "after it was made)")
    return None


def sentence_counts(path_dir, src: str = "", tgt: str = "") -> dict:
    """Sentence pairs per split of a data-bin: from its manifest (what fairseq-preprocess reported when it was made),
    else from fairseq's own index reader (imports fairseq)."""
    m = read(path_dir)
    if m and m.get("complete") is True and m.get("sentences"):
        return {k: int(v) for k, v in m["sentences"].items()}
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    counts = {}
    for split in ("train", "valid", "test"):
        found = sorted(pathlib.Path(path_dir).glob(f"{split}.{src or '*'}-{tgt or '*'}.{src or '*'}.idx"))
        if found:
            counts[split] = len(MMapIndexedDataset.Index(str(found[0])))
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m harness.manifest")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("params")
    s.add_argument("--base", default="{}", help="parameters (JSON) to extend")
    s.add_argument("pairs", nargs="*")
    s = sub.add_parser("status")
    s.add_argument("dir")
    s.add_argument("params")
    s = sub.add_parser("write")
    s.add_argument("out")
    s.add_argument("--params", required=True)
    s.add_argument("--counts", nargs="+", required=True, help="SPLIT=N")
    s.add_argument("--inputs", nargs="+", required=True)
    s.add_argument("--made-by", required=True)
    s.add_argument("--preprocess-log")
    s.add_argument("--max-unk", type=float, default=2.0)
    s.add_argument("--bpe-merges", type=int)
    s.add_argument("--keep-log", help="where fairseq-preprocess's log is copied when the data is refused "
                                      "(the temp folder that holds it is removed)")
    s.add_argument("--preprocess", nargs="+", metavar="KEY=VALUE",
                   help=f"how the text was made into tokens: {', '.join(PREPROCESS_KEYS)}")
    s = sub.add_parser("check")
    s.add_argument("dir")
    s = sub.add_parser("count", help="sentence pairs of a split")
    s.add_argument("dir")
    s.add_argument("split")
    args = p.parse_args(argv)
    try:
        if args.cmd == "params":
            params = {**json.loads(args.base), **dict(zip(args.pairs[::2], args.pairs[1::2]))}
            print(json.dumps(params, sort_keys=True))
        elif args.cmd == "status":
            print(status(args.dir, json.loads(args.params)))
        elif args.cmd == "write":
            counts = {k: int(v) for k, v in (c.split("=", 1) for c in args.counts)}
            log_text = open(args.preprocess_log, encoding="utf-8").read() if args.preprocess_log else None
            try:
                preprocess = preprocess_record(args.preprocess) if args.preprocess else None
                m = build(json.loads(args.params), counts, args.inputs, args.made_by, log_text, args.max_unk,
                          bpe_merges=args.bpe_merges, folder=os.path.dirname(os.path.abspath(args.out)),
                          preprocess=preprocess)
            except DataError as e:
                if args.keep_log and args.preprocess_log:
                    shutil.copyfile(args.preprocess_log, args.keep_log)
                    raise DataError(f"{e} (kept: {args.keep_log})") from None
                raise
            # written into the temp folder that is published whole (no atomic rename needed here, and
            # fairseq_tfixup's import would load fairseq)
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(m, f, indent=1, sort_keys=True)
                f.write("\n")
        elif args.cmd == "count":
            print(sentence_counts(args.dir).get(args.split, "?"))
        elif args.cmd == "check":
            if read(args.dir) is None:  # data-bins made otherwise than by scripts/prepare-*.sh are used
                print(f"warning: {args.dir} has no manifest.json (made before manifests): its completeness is "
                      "not checked", file=sys.stderr)
                return
            if reason := check(args.dir):
                raise DataError(reason)
    except DataError as e:
        sys.exit(f"error: {e}; nothing published" if args.cmd == "write"
                 else f"error: {e}: rebuild it with scripts/prepare-*.sh")


if __name__ == "__main__":
    main()
