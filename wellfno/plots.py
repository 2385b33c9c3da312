"""Figures: reference vs prediction vs error over a rollout."""
from __future__ import annotations

import io

import numpy as np

from wellfno.cli import atomic_write_bytes

MAX_FIELDS = 6  # rows of three panels each; more would make a figure nobody can read


def rollout_figure(true, pred, field_names, path, *, mean=None, std=None, steps=None,
                   model_vrmse=None, persistence_vrmse=None):
    """For every field: rows reference / prediction / error, columns rollout steps.

    true, pred: (T, H, W, F) or, 3-D, (T, X, Y, Z, F), z-scored; mean/std (per field) turn them
    back into physical units. A 3-D field is shown on its middle plane across the last axis.
    At most MAX_FIELDS fields are drawn (the first ones), so the figure stays readable.
    Reference and prediction share one colour scale per field; the error has its own
    symmetric scale, shared across steps, so growth of the error is visible.
    """
    plt = pyplot()

    true, pred = np.asarray(true, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    if mean is not None:
        true, pred = true * np.asarray(std) + np.asarray(mean), pred * np.asarray(std) + np.asarray(mean)
    notes = []
    if true.ndim == 5:  # (T, X, Y, Z, F): one plane, z at its middle
        depth = true.shape[3]
        true, pred = true[:, :, :, depth // 2], pred[:, :, :, depth // 2]
        notes.append(f"3-D: the plane {depth // 2} of {depth} along the last axis")
    n_t = true.shape[0]
    if steps is None:
        steps = sorted({0, 1, 4, min(9, n_t - 1), n_t // 2, n_t - 1} & set(range(n_t)))
    if len(field_names) > MAX_FIELDS:
        notes.append(f"the first {MAX_FIELDS} of {len(field_names)} fields")
        field_names = field_names[:MAX_FIELDS]
    n_f, width, height = len(field_names), true.shape[1], true.shape[2]
    centres = [i * (width + 1) + (width - 1) / 2 for i in range(len(steps))]
    row_inches = 1.35  # each row's image this tall, as wide as its frames make it, within 16 inches
    figure_width = min(16.0, max(6.0, row_inches * len(steps) * (width + 1) / height + 1.6))
    fig, axes = plt.subplots(3 * n_f, 1, figsize=(figure_width, 1.8 * 3 * n_f), squeeze=False)
    for f, name in enumerate(field_names):
        lo, hi = true[..., f].min(), true[..., f].max()  # the reference sets the scale; outliers saturate
        err = pred[..., f] - true[..., f]
        emax = np.abs(err[steps]).max() or 1.0
        for r, (label, frames, kw) in enumerate([
            ("reference", true[steps, ..., f], dict(vmin=lo, vmax=hi, cmap="viridis")),
            ("prediction", pred[steps, ..., f], dict(vmin=lo, vmax=hi, cmap="viridis")),
            ("error", err[steps], dict(vmin=-emax, vmax=emax, cmap="RdBu_r")),
        ]):
            ax = axes[3 * f + r, 0]
            im = ax.imshow(mosaic(frames), origin="lower", interpolation="nearest", **kw)
            if r == 0:  # each field's first row names the steps, above the frames
                ax.set_xticks(centres, [f"step {t + 1}" for t in steps], fontsize=9)
                ax.xaxis.set_ticks_position("top")
            else:
                ax.set_xticks([])
            ax.tick_params(length=0), ax.set_yticks([])
            ax.set_ylabel(f"{name}\n{label}", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046 / len(steps), pad=0.01)
    title = "Autoregressive rollout on a validation trajectory" + "".join(f"\n{note}" for note in notes)
    if model_vrmse is not None:
        title += f"\nVRMSE step 1: model {model_vrmse[0]:.3f}, persistence {persistence_vrmse[0]:.3f}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.18 * (title.count("\n") + 1) / fig.get_figheight()))  # room for the title
    save_png(fig, path, dpi=90)


def mosaic(frames) -> np.ma.MaskedArray:
    """Frames (N, X, Y) side by side as one image (Y, N*(X+1)-1) for imshow(origin="lower"), a
    masked (blank) column between neighbours. One image per row of the figure, not one axes per
    frame: Gray-Scott's figure took 1.4 s of CPU with 36 axes, 0.5 s with these 6."""
    n, width, height = frames.shape
    # zeros under the mask, not np.ma.masked_all's uninitialised memory: matplotlib scales the
    # masked values too, and garbage there made it warn of overflows
    image = np.ma.array(np.zeros((height, n * (width + 1) - 1)), mask=True)
    for i, frame in enumerate(frames):
        image[:, i * (width + 1):i * (width + 1) + width] = frame.T  # x across, y up
    return image


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on compute nodes). Imported here, on the
    first figure, not at the top: matplotlib and pyplot cost about half a second of CPU, and most
    processes that import this module never draw (a job's other ranks, a refused command)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path, dpi=100, **savefig_kwargs):
    """Render `fig` to PNG in memory, write it atomically (no half picture), close the figure."""
    import matplotlib.pyplot as plt  # loaded by whoever made `fig`

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig_kwargs)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
