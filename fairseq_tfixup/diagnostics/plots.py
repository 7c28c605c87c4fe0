"""The PNG figures. Each function takes plain arrays and returns a matplotlib Figure (Agg backend)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from tfixup.methods import METHODS  # noqa: E402


def label(model: str) -> str:
    """A method's label in every figure (its row in tfixup/methods.py); any other name as it is."""
    return METHODS[model].label if model in METHODS else model


def color(model: str):
    """A method's color in every figure (its row in tfixup/methods.py); None (matplotlib's next) for any
    other name."""
    return METHODS[model].color if model in METHODS else None


def hessian_density(curves: dict, top: dict, title: str):
    """curves: model -> (grid, density); top: model -> top eigenvalues. Log-density vs eigenvalue."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m, (grid, dens) in curves.items():
        ax.semilogy(grid, np.maximum(dens, 1e-12), color=color(m), label=f"{label(m)} (λmax={top[m][0]:.3g})")
    ax.set_ylim(1e-6, None)
    ax.set_xlabel("eigenvalue of the loss Hessian")
    ax.set_ylabel("density (SLQ, Gaussian-broadened)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def grad_hist(runs: dict, edges: np.ndarray, title: str):
    """runs: name -> {"grad": counts[steps, bins], "update": counts[steps, bins]} (nonzero magnitudes only)."""
    names = list(runs)
    fig, axes = plt.subplots(len(names), 2, figsize=(10, 2.6 * len(names)), squeeze=False)
    for r, name in enumerate(names):
        for c, key in enumerate(("grad", "update")):
            counts = runs[name][key]
            ax = axes[r][c]
            im = ax.imshow(np.log10(counts.T + 1), aspect="auto", origin="lower", cmap="viridis",
                           extent=(0.5, counts.shape[0] + 0.5, edges[0], edges[-1]))
            ax.set_title(f"{name}: {'gradient' if key == 'grad' else 'Adam update'}", fontsize=9)
            ax.set_ylabel("log10 |value|")
            if r == len(names) - 1:
                ax.set_xlabel("training step")
            fig.colorbar(im, ax=ax, label="log10(1 + count)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def ln_norms(runs: dict, dim: int, title: str):
    """runs: name -> norms[steps, layers]. One panel per run, one line per decoder layer."""
    names = list(runs)
    ymax = max(float(np.nanmax(v)) for v in runs.values()) * 1.05
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        norms = runs[name]
        cmap = plt.get_cmap("viridis", norms.shape[1])
        for layer in range(norms.shape[1]):
            ax.plot(np.arange(1, norms.shape[0] + 1), norms[:, layer], color=cmap(layer), label=f"layer {layer + 1}")
        ax.axhline(np.sqrt(dim), color="k", ls=":", lw=1, label="√d")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylim(0, ymax)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean L2 norm of the LN input")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # outside: lines stay visible
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def grad_norms(per_layer: dict, layer_names: list, depths: list, last_fc2: dict, title: str):
    """Left: per-layer gradient norm at init. Right: last decoder layer's fc2 gradient norm vs depth (log-log)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.6, 1]})
    x = np.arange(len(layer_names))
    for m, norms in per_layer.items():
        norms = np.asarray(norms, dtype=float)
        have = np.isfinite(norms)  # e.g. only Pre-LN has final LayerNorms
        a.semilogy(x[have], norms[have], "o-", color=color(m), label=label(m))
    a.set_xticks(x)
    a.set_xticklabels(layer_names, rotation=60, ha="right", fontsize=7)
    a.set_ylabel("‖∇θ‖ of the layer's parameters")
    a.set_title("gradient norm per layer at initialisation", fontsize=9)
    a.grid(alpha=0.3)
    a.legend()
    d = np.asarray(depths, dtype=float)
    for m, norms in last_fc2.items():
        norms = np.asarray(norms)
        b.loglog(d, norms, "o-", color=color(m), label=label(m))
        b.loglog(d, norms[0] * np.sqrt(d[0] / d), ":", color=color(m), lw=1)
    b.set_xticks(d)
    b.set_xticklabels([str(int(v)) for v in d])
    b.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    b.set_xlabel("layers L (encoder = decoder)")
    b.set_ylabel(r"$\Vert\nabla W^{2,L}\Vert$ (last decoder FFN fc2)")  # mathtext: superscript 2,L
    b.set_title("last-layer FFN gradient vs depth (dotted: ∝ 1/√L)", fontsize=9)
    b.grid(alpha=0.3, which="both")
    b.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def update_size(depths: list, curves: dict, summary: dict, eta: float, adam_lr: float, title: str):
    """curves: model -> array[depth, (SGD ||df||/eta, Adam ||df||)]. Two log-log panels with fitted slopes."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    d = np.asarray(depths, dtype=float)
    for j, (key, what) in enumerate((("sgd_loglog_slope", f"SGD step: ‖Δf‖ / η  (η = {eta:g})"),
                                     ("adam_loglog_slope", f"Adam's first step: ‖Δf‖  (lr = {adam_lr:g})"))):
        ax = axes[j]
        for m, values in curves.items():
            ax.loglog(d, values[:, j], "o-", color=color(m), label=f"{label(m)} (slope {summary[m][key]:+.2f})")
        ax.set_xlabel("layers per side N (encoder = decoder)")
        ax.set_ylabel(what)
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def update_decomposition(depths: list, variants: dict, eta: str, title: str):
    """variants: name -> {"etas": {eta: {selection: {"df_over_eta": {N: value}, "loglog_slope": s}}}}.
    One log-log panel per variant: ||df||/eta of each group's step alone against depth."""
    n = len(variants)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4.6), sharey=True, squeeze=False)
    d = np.asarray(depths, dtype=float)
    for ax, (vname, v) in zip(axes[0], variants.items()):
        for j, (sel, r) in enumerate(v["etas"][eta].items()):
            y = np.asarray([r["df_over_eta"][str(x)] for x in depths], dtype=float)
            style = "-" if sel in ("weights", "biases", "all") else "--"
            ax.loglog(d, y, "o" + style, color=plt.cm.tab20(j % 20), markersize=3,
                      lw=2 if sel in ("weights", "all") else 1, label=f"{sel} ({r['loglog_slope']:+.2f})")
        ax.set_title(vname, fontsize=9)
        ax.set_xlabel("layers per side N")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    axes[0][0].set_ylabel("‖Δf‖ / η, that group stepped alone")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def fp16_headroom(models: list, depths: list, curves: dict, quantities: tuple, fp16_max: float, title: str):
    """curves: "method/N" -> {quantity: [max per update]}. One row per quantity, one column per depth,
    one line per method; fp16's largest value dashed."""
    fig, axes = plt.subplots(len(quantities), len(depths), figsize=(4.2 * len(depths), 2.6 * len(quantities)),
                             sharex=True, sharey="row", squeeze=False)
    for j, n in enumerate(depths):
        for i, q in enumerate(quantities):
            ax = axes[i][j]
            for m in models:
                y = curves.get(f"{m}/{n}", {}).get(q)
                if y:
                    ax.semilogy(np.arange(1, len(y) + 1), y, color=color(m), label=label(m), lw=1)
            ax.axhline(fp16_max, color="k", ls="--", lw=0.8)
            ax.grid(alpha=0.3, which="both")
            if i == 0:
                ax.set_title(f"N = {n} layers per side", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"max |{q}|", fontsize=8)
            if i == len(quantities) - 1:
                ax.set_xlabel("update")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
