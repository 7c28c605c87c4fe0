"""Reproduction pipeline helpers called by ``scripts/*.sh``.

* ``config``  : read ``configs/*.sh`` (the single source of truth for each experiment);
* ``average`` : average the last K checkpoints with fairseq's checkpoint utilities and
  pick K on the VALID set;
* ``score``   : BLEU of a ``fairseq-generate`` output: tokenized (compound-split for
  En-De, as fairseq's ``compound_split_bleu.sh``) and detokenized sacreBLEU with its signature;
* ``report``  : results JSON -> Markdown table next to the paper's numbers.

Run as ``python -m fairseq_tfixup.pipeline <command> --help``.
"""
