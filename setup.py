"""fairseq-tfixup: T-Fixup (Huang et al., ICML 2020) as a fairseq plugin.

Design card
-----------
* What: an encoder-decoder Transformer with no LayerNorm and no warmup,
  registered with fairseq as ``--arch transformer_tfixup*`` plus the
  ``inverse_sqrt_nowarmup`` scheduler; reproduction scripts, benchmarks and
  diagnostics around it.
* fairseq: 0.12.2 on Python <= 3.10, installed with pip < 24.1 (it needs
  omegaconf 2.0.x, whose metadata newer pip rejects); on Python >= 3.11 official
  0.12.2 does not import (a dataclass with a mutable default), so we take
  ``fairseq-fixed==0.12.3.1``, a fork that installs as the same ``fairseq``
  package. Both build from source and need torch at build time: install torch
  first (CPU: ``pip install torch==2.13.0``), then install this package with
  ``PIP_CONSTRAINT`` pinning that torch (see ``.ci/constraints.txt``) so that
  pip's isolated build does not fetch another one.
* torch is the user's choice (CUDA or CPU); we only require what fairseq does.
"""

from setuptools import find_packages, setup

setup(
    name="fairseq-tfixup",
    version="0.1.0",
    description="T-Fixup: Transformers without LayerNorm or warmup, as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    packages=find_packages(include=["tfixup", "tfixup.*", "fairseq_tfixup", "fairseq_tfixup.*"]),
    install_requires=[
        'fairseq==0.12.2; python_version < "3.11"',
        'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
        "sacrebleu>=2.0",
        "subword-nmt>=0.3.8",
        "sacremoses>=0.0.53",
        "matplotlib>=3.5",
        "numpy",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3"],  # xdist: scripts/test.sh uses every core
        # apply_tfixup on HuggingFace models (tfixup/hf.py); without fairseq: docs/beyond-fairseq.md, "Install"
        "hf": [line for line in open("requirements-hf.txt", encoding="utf-8").read().splitlines()
               if line.strip() and not line.startswith("#")],
    },
    entry_points={"console_scripts": ["tfixup-diagnose = fairseq_tfixup.diagnostics.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
