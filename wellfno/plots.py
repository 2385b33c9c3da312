"""Figures: reference vs prediction vs error over a rollout."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from wellfno.cli import atomic_write_bytes  # noqa: E402


def rollout_figure(true, pred, field_names, path, *, mean=None, std=None, steps=None,
                   model_vrmse=None, persistence_vrmse=None):
    """For every field: rows reference / prediction / error, columns rollout steps.

    true, pred: (T, H, W, F) z-scored; mean/std (per field) turn them back into physical units.
    Reference and prediction share one colour scale per field; the error has its own
    symmetric scale, shared across steps, so growth of the error is visible.
    """
    true, pred = np.asarray(true, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    if mean is not None:
        true, pred = true * np.asarray(std) + np.asarray(mean), pred * np.asarray(std) + np.asarray(mean)
    n_t = true.shape[0]
    if steps is None:
        steps = sorted({0, 1, 4, min(9, n_t - 1), n_t // 2, n_t - 1} & set(range(n_t)))
    n_f = len(field_names)
    fig, axes = plt.subplots(3 * n_f, len(steps), figsize=(1.9 * len(steps) + 1.2, 5.4 * n_f), squeeze=False)
    for f, name in enumerate(field_names):
        lo, hi = true[..., f].min(), true[..., f].max()  # the reference sets the scale; outliers saturate
        err = pred[..., f] - true[..., f]
        emax = np.abs(err[steps]).max() or 1.0
        for c, t in enumerate(steps):
            for r, (label, img, kw) in enumerate([
                ("reference", true[t, ..., f], dict(vmin=lo, vmax=hi, cmap="viridis")),
                ("prediction", pred[t, ..., f], dict(vmin=lo, vmax=hi, cmap="viridis")),
                ("error", err[t], dict(vmin=-emax, vmax=emax, cmap="RdBu_r")),
            ]):
                ax = axes[3 * f + r, c]
                im = ax.imshow(img.T, origin="lower", **kw)
                ax.set_xticks([]), ax.set_yticks([])
                if r == 0:
                    ax.set_title(f"step {t + 1}", fontsize=9)
                if c == 0:
                    ax.set_ylabel(f"{name}\n{label}", fontsize=9)
                if c == len(steps) - 1:
                    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    title = "Autoregressive rollout on a validation trajectory"
    if model_vrmse is not None:
        title += f"\nVRMSE step 1: model {model_vrmse[0]:.3f}, persistence {persistence_vrmse[0]:.3f}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def save_png(fig, path, dpi=100, **savefig_kwargs):
    """Render `fig` to PNG in memory, write it atomically (no half picture), close the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig_kwargs)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
