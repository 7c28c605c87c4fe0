"""Optimisation diagnostics from the T-Fixup paper and Xiong et al. (2020), for fairseq translation models.

Python API (each ``run_*`` writes a PNG, raw arrays and a JSON summary to ``out`` and returns the summary):

* :func:`~fairseq_tfixup.diagnostics.grad_hist.run_grad_hist`: embedding gradient / Adam update histograms;
* :func:`~fairseq_tfixup.diagnostics.ln_norms.run_ln_norms`: decoder LayerNorm-input norms during training;
* :func:`~fairseq_tfixup.diagnostics.grad_norms.run_grad_norms`: per-layer gradient norms at init, depth sweep;
* :func:`~fairseq_tfixup.diagnostics.hessian.run_hessian`: Hessian top eigenvalues and SLQ density at init;
* :func:`~fairseq_tfixup.diagnostics.update_size.run_update_size`: the output change after one SGD/Adam step
  at init vs depth (T-Fixup §3.2's goal; the measurement is tfixup/update_size.py, shared with plain-PyTorch
  and HuggingFace models: ``tfixup-diagnose update-size --family torch|hf``).

Building blocks: :mod:`.models` (model + task through fairseq's parser), :mod:`.data`, :mod:`.lanczos`,
:mod:`.hessian` (Hessian-vector products), :mod:`.train` (a minimal fairseq-train loop), :mod:`.plots`.
The command line is ``tfixup-diagnose`` (:mod:`.cli`). Submodules import fairseq lazily.
"""
