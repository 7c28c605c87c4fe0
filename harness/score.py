"""BLEU of a ``fairseq-generate`` output, both kinds papers use: tokenized BLEU (Moses tokens as fairseq prints
them, BPE removed, whitespace-split like ``fairseq-score``/multi-bleu; for En-De, hyphenated compounds split first
exactly as fairseq's ``examples/translation/compound_split_bleu.sh`` does) and detokenized sacreBLEU (sacremoses'
detokenized hypotheses against the raw reference text when the data dir has it, ``test.raw.TGT`` from the prepare
scripts, else the detokenized references), with sacreBLEU's signature so that the number can be compared."""

import re
from typing import Dict, List, Optional, Sequence, Tuple

import sacrebleu


def generate_lines(text: str) -> Dict[str, Dict[int, str]]:
    """fairseq-generate's per-sentence lines by kind and sentence id: sources (S-*), references
    (T-*) and hypotheses (H-*, the text after the score); other lines are left out."""
    out: Dict[str, Dict[int, str]] = {"S": {}, "T": {}, "H": {}}
    for line in text.splitlines():
        head, _, rest = line.partition("\t")
        if head[1:2] == "-" and head[:1] in out and head[2:].isdigit():
            out[head[:1]][int(head[2:])] = rest.split("\t")[-1] if head[0] == "H" else rest
    return out


def read_generate_output(text: str, expected: Optional[int] = None) -> Tuple[List[str], List[str], List[int]]:
    """Hypotheses (H-*), references (T-*) and sentence ids, in sentence-id order. An output that lost sentences
    (a hypothesis without reference, fewer than ``expected``) is refused: a BLEU on part of it is not comparable."""
    lines = generate_lines(text)
    hyps, refs = lines["H"], lines["T"]
    if not hyps:
        raise ValueError("no hypotheses (H-* lines) in the fairseq-generate output")
    if set(hyps) != set(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references in the generate output")
    if expected is not None and len(hyps) != expected:
        raise ValueError(f"the generate output has {len(hyps)} of the {expected} test sentences")
    ids = sorted(hyps)
    return [hyps[i] for i in ids], [refs[i] for i in ids], ids


def compound_split(line: str) -> str:
    """fairseq's compound_split_bleu.sh: perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'. The perl substitution
    does not re-scan the character it consumed, so one pass over non-overlapping matches (``re.sub``) is it."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], split_compounds: bool) -> float:
    if split_compounds:
        hyps, refs = [compound_split(h) for h in hyps], [compound_split(r) for r in refs]
    return sacrebleu.BLEU(tokenize="none", force=True).corpus_score(list(hyps), [list(refs)]).score


def detokenize(lines: Sequence[str], lang: str) -> List[str]:
    from sacremoses import MosesDetokenizer  # here: scoring tokenized BLEU needs sacrebleu alone

    md = MosesDetokenizer(lang=lang)
    # "@-@" is Moses' aggressive hyphen split (tokenizer -a); sacremoses undoes it
    return [md.detokenize(line.split()) for line in lines]


def detok_bleu(hyps: Sequence[str], raw_refs: Sequence[str], lowercase: bool) -> Tuple[float, str]:
    bleu = sacrebleu.BLEU(lowercase=lowercase)
    return bleu.corpus_score(list(hyps), [list(raw_refs)]).score, str(bleu.get_signature())


def score_generate_output(text: str, tgt_lang: str, split_compounds: bool, lowercase: bool,
                          raw_refs: Optional[Sequence[str]] = None) -> Dict:
    hyps, refs, ids = read_generate_output(text)
    result = {"sentences": len(hyps), "bleu_tok": tokenized_bleu(hyps, refs, split_compounds),
              "bleu_tok_compound_split": bool(split_compounds)}
    detok_hyps = detokenize(hyps, tgt_lang)
    if raw_refs is not None:
        if len(ids) != len(raw_refs):  # a BLEU on part of the test set is not comparable: refuse it
            raise ValueError(f"the generate output has {len(ids)} of the {len(raw_refs)} test sentences")
        detok_refs = [raw_refs[i] for i in ids]
        result["detok_reference"] = "raw test set text"
    else:
        detok_refs = detokenize(refs, tgt_lang)
        result["detok_reference"] = "detokenized fairseq references (no raw text in the data dir)"
    result["bleu_detok"], result["sacrebleu_signature"] = detok_bleu(detok_hyps, detok_refs, lowercase)
    return result


def paired_bootstrap(hyps_a: Sequence[str], hyps_b: Sequence[str], refs: Sequence[str], lowercase: bool,
                     samples: int = 1000, seed: int = 12345) -> Dict:
    """sacreBLEU's paired bootstrap (Koehn 2004) of the gap BLEU(a) - BLEU(b) on one test set: the same resampled
    sentences for both systems, scored from sacreBLEU's own per-sentence statistics. Returns the gap, its 95%
    interval (2.5th and 97.5th percentiles of the resampled gaps) and the one-sided p-value of a gap <= 0."""
    import numpy as np

    if not (len(hyps_a) == len(hyps_b) == len(refs)):
        raise ValueError(f"paired bootstrap needs as many hypotheses as references: {len(hyps_a)}, "
                         f"{len(hyps_b)}, {len(refs)}")
    bleu = sacrebleu.BLEU(lowercase=lowercase)
    stats = [np.array(bleu._extract_corpus_statistics(list(h), [list(refs)]), dtype=float) for h in (hyps_a, hyps_b)]
    score = lambda s: bleu._compute_score_from_stats(list(s.sum(axis=0))).score  # noqa: E731
    rng = np.random.default_rng(seed)
    idxs = (rng.integers(0, len(refs), len(refs)) for _ in range(samples))
    gaps = np.array([score(stats[0][idx]) - score(stats[1][idx]) for idx in idxs])
    return {"gap": round(score(stats[0]) - score(stats[1]), 2),
            "ci95": [round(float(np.percentile(gaps, 2.5)), 2), round(float(np.percentile(gaps, 97.5)), 2)],
            "p_gap_le_0": round(float((gaps <= 0).mean()), 4), "samples": samples, "seed": seed,
            "signature": str(bleu.get_signature())}
