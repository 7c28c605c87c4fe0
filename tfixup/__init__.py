"""T-Fixup without fairseq: the method table and command builder (``tfixup.methods``) and the atomic
file writer (``tfixup.atomic``) that the fairseq plugin (``fairseq_tfixup``), its diagnostics and this
repository's harness share. Importing it imports neither fairseq nor torch."""
