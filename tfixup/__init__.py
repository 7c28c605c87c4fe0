"""T-Fixup without fairseq: the method table and command builder (``tfixup.methods``) and the atomic
file writer (``tfixup.atomic``) that the fairseq plugin (``fairseq_tfixup``), its diagnostics and this
repository's harness share, and T-Fixup for any PyTorch model (``tfixup.torch_tfixup``, which needs torch
only). Importing the package imports neither fairseq nor torch."""
