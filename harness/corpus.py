"""Small text steps of fairseq's examples/translation/prepare-*.sh recipes that Moses does in perl, here in
Python so that only pip tools are needed: ``python -m harness.corpus clean|segs|nonprint|... ARGS``."""

import argparse
import re
import sys
import unicodedata

_SEG = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")


def clean(args) -> None:
    """Moses clean-corpus-n.perl: keep the pairs whose sides both have MIN..MAX tokens, with a length ratio
    <= RATIO (whitespace squeezed, as clean-corpus-n does)."""
    kept = total = 0
    with open(args.src_in, encoding="utf-8") as fs, open(args.tgt_in, encoding="utf-8") as ft, \
            open(args.src_out, "w", encoding="utf-8") as os_, open(args.tgt_out, "w", encoding="utf-8") as ot:
        for s, t in zip(fs, ft):
            total += 1
            s, t = " ".join(s.split()), " ".join(t.split())
            ns, nt = len(s.split()), len(t.split())
            if args.min <= min(ns, nt) and max(ns, nt) <= args.max and max(ns / nt, nt / ns) <= args.ratio:
                os_.write(s + "\n")
                ot.write(t + "\n")
                kept += 1
    print(f"clean: kept {kept} of {total} pairs", file=sys.stderr)


def segs(args) -> None:
    """Text of the <seg> elements of mteval XML/SGML files, in order (fairseq's grep+sed, including its
    replacement of the right single quote by ASCII ')."""
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            for m in filter(None, map(_SEG.search, f)):
                sys.stdout.write(m.group(1).replace("\u2019", "'") + "\n")


def nonprinting_to_space(line: str) -> str:
    """Moses remove-non-printing-char.perl on one line: control/format characters become spaces, tabs stay."""
    return "".join(c if c == "\t" or unicodedata.category(c)[0] != "C" else " " for c in line)


def strip_talk_tags(line: str) -> str:
    """fairseq prepare-iwslt14.sh: drop <url>/<talkid>/<keywords> lines, unwrap <title>/<description>."""
    if "<url>" in line or "<talkid>" in line or "<keywords>" in line:
        return ""
    for tag in ("<title>", "</title>", "<description>", "</description>"):
        line = line.replace(tag, "")
    return line


# the stdin -> stdout steps: a function of each line (its newline included)
FILTERS = {"nonprint": ("remove non-printing characters (stdin -> stdout)",
                        lambda line: nonprinting_to_space(line.rstrip("\n")) + "\n"),
           "lower": ("lowercase (stdin -> stdout)", str.lower),  # Moses lowercase.perl (perl lc on UTF-8 text)
           "strip-talk-tags": ("IWSLT train.tags -> text", strip_talk_tags)}


def git_blob_sha1(args) -> None:
    """Git's blob id of a file (sha1 of "blob <size>\0" + content): some files' only published identity."""
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
    for name, (help_, _) in FILTERS.items():
        sub.add_parser(name, help=help_)
    g = sub.add_parser("git-blob-sha1", help="git blob id of a file")
    g.add_argument("file")
    g.set_defaults(func=git_blob_sha1)
    args = p.parse_args(argv)
    if args.cmd in FILTERS:
        sys.stdout.writelines(map(FILTERS[args.cmd][1], sys.stdin))
    else:
        args.func(args)


if __name__ == "__main__":
    main()
