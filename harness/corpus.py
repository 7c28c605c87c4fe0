"""Small text steps of fairseq's examples/translation/prepare-*.sh recipes that
Moses does in perl, here in Python so that only pip tools are needed.

``python -m harness.corpus clean|segs|nonprint ...``
"""

import argparse
import re
import sys
import unicodedata

_SEG = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")


def clean_pair_ok(src: str, tgt: str, min_len: int, max_len: int, ratio: float) -> bool:
    """Moses clean-corpus-n.perl: both sides min..max tokens, length ratio <= ratio."""
    s, t = len(src.split()), len(tgt.split())
    if s < min_len or t < min_len or s > max_len or t > max_len:
        return False
    return s / t <= ratio and t / s <= ratio


def clean(args) -> None:
    kept = total = 0
    with open(args.src_in, encoding="utf-8") as fs, open(args.tgt_in, encoding="utf-8") as ft, \
            open(args.src_out, "w", encoding="utf-8") as os_, open(args.tgt_out, "w", encoding="utf-8") as ot:
        for s, t in zip(fs, ft):
            total += 1
            # clean-corpus-n also squeezes whitespace
            s, t = " ".join(s.split()), " ".join(t.split())
            if clean_pair_ok(s, t, args.min, args.max, args.ratio):
                os_.write(s + "\n")
                ot.write(t + "\n")
                kept += 1
    print(f"clean: kept {kept} of {total} pairs", file=sys.stderr)


def segs(args) -> None:
    """Text of the <seg> elements of mteval XML/SGML files, in order (fairseq's grep+sed,
    including its replacement of the right single quote by ASCII ')."""
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _SEG.search(line)
                if m:
                    sys.stdout.write(m.group(1).replace("\u2019", "'") + "\n")


def nonprinting_to_space(line: str) -> str:
    """Moses remove-non-printing-char.perl on one line: control/format characters become spaces, tabs stay."""
    return "".join(c if c == "\t" or unicodedata.category(c)[0] != "C" else " " for c in line)


def nonprint(_args) -> None:
    for line in sys.stdin:
        sys.stdout.write(nonprinting_to_space(line.rstrip("\n")) + "\n")


def lower(_args) -> None:
    """Moses lowercase.perl (perl lc on UTF-8 text)."""
    for line in sys.stdin:
        sys.stdout.write(line.lower())


def strip_talk_tags(_args) -> None:
    """fairseq prepare-iwslt14.sh: drop <url>/<talkid>/<keywords> lines, unwrap <title>/<description>."""
    for line in sys.stdin:
        if "<url>" in line or "<talkid>" in line or "<keywords>" in line:
            continue
        for tag in ("<title>", "</title>", "<description>", "</description>"):
            line = line.replace(tag, "")
        sys.stdout.write(line)


def git_blob_sha1(args) -> None:
    """Git's blob id of a file (sha1 of "blob <size>\0" + content), to check a file whose
    only published identity is its git blob id."""
    import hashlib
    import os

    h = hashlib.sha1(f"blob {os.path.getsize(args.file)}\0".encode())
    with open(args.file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    print(h.hexdigest())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.corpus")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("clean", help="clean-corpus-n: length 1..N and ratio filter of a parallel corpus")
    for name in ("src_in", "tgt_in", "src_out", "tgt_out"):
        c.add_argument(name)
    c.add_argument("--min", type=int, default=1)
    c.add_argument("--max", type=int, default=250)
    c.add_argument("--ratio", type=float, default=1.5)
    c.set_defaults(func=clean)
    s = sub.add_parser("segs", help="<seg> text of mteval XML/SGML files")
    s.add_argument("files", nargs="+")
    s.set_defaults(func=segs)
    n = sub.add_parser("nonprint", help="remove non-printing characters (stdin -> stdout)")
    n.set_defaults(func=nonprint)
    sub.add_parser("lower", help="lowercase (stdin -> stdout)").set_defaults(func=lower)
    sub.add_parser("strip-talk-tags", help="IWSLT train.tags -> text").set_defaults(func=strip_talk_tags)
    g = sub.add_parser("git-blob-sha1", help="git blob id of a file")
    g.add_argument("file")
    g.set_defaults(func=git_blob_sha1)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
