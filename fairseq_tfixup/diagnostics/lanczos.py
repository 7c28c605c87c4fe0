"""Lanczos iteration and stochastic Lanczos quadrature (SLQ) for a symmetric operator given only by v -> A v.

Used on the Hessian of a network's loss, which is never formed: only Hessian-vector
products are available (Ghorbani, Krishnan & Xiao 2019, "An Investigation into Neural
Net Optimization via Hessian Eigenvalue Density").
"""

from typing import Callable, Optional, Tuple

import numpy as np
import torch

MatVec = Callable[[torch.Tensor], torch.Tensor]


def lanczos(matvec: MatVec, n: int, steps: int, v0: Optional[torch.Tensor] = None,
            generator: Optional[torch.Generator] = None, dtype=torch.float32,
            progress: Optional[Callable[[int], None]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``steps`` Lanczos steps from ``v0`` (Rademacher if None); returns the tridiagonal's (alpha, beta).

    Full re-orthogonalisation against all previous Lanczos vectors (twice, classical
    Gram-Schmidt): without it, rounding makes copies of the extreme eigenvalues
    ("ghosts"), which would distort the density. Vectors are kept in ``dtype`` on the
    operator's device, so memory is ``steps * n`` numbers.
    """
    steps = min(steps, n)
    if v0 is None:
        v0 = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int64).to(dtype) * 2 - 1
    v = v0.to(dtype) / v0.norm()
    basis = torch.empty(steps, n, dtype=dtype, device=v.device)
    alpha, beta = [], []
    for j in range(steps):
        basis[j] = v
        w = matvec(v).to(dtype)
        a = torch.dot(w, v).item()
        alpha.append(a)
        for _ in range(2):  # twice is enough (Giraud et al. 2005)
            w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
        b = w.norm().item()
        if progress is not None:
            progress(j + 1)
        if j == steps - 1:
            break
        if b < 1e-10 * max(1.0, abs(a)):  # invariant subspace found: the spectrum is exhausted
            break
        beta.append(b)
        v = w / b
    return np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)


def tridiag_eig(alpha: np.ndarray, beta: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Ritz values (ascending) and the squared first components of the Ritz vectors (the SLQ weights)."""
    t = np.diag(alpha) + np.diag(beta, 1) + np.diag(beta, -1)
    theta, u = np.linalg.eigh(t)
    return theta, u[0] ** 2


def slq_density(nodes: np.ndarray, weights: np.ndarray, grid: np.ndarray, sigma: float) -> np.ndarray:
    """Spectral density on ``grid``: Gaussian-broadened quadrature, averaged over probes.

    ``nodes``/``weights`` have shape (probes, steps); each probe's weights sum to 1, so the
    density integrates to 1 (up to the part of the Gaussians outside the grid).
    """
    nodes, weights = np.atleast_2d(nodes), np.atleast_2d(weights)
    diff = grid[None, None, :] - nodes[:, :, None]
    g = np.exp(-0.5 * (diff / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))
    return (weights[:, :, None] * g).sum(axis=1).mean(axis=0)
