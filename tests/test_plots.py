"""The rollout figure: one image per row (reference, prediction, error of each field), the chosen
steps side by side in it, each frame exactly the data it shows."""
from __future__ import annotations

import warnings

import numpy as np

from wellfno import plots


def test_mosaic_puts_each_frame_in_its_place_with_a_blank_column_between():
    frames = np.random.default_rng(0).normal(size=(3, 5, 4))  # (N, X, Y)
    image = plots.mosaic(frames)
    assert image.shape == (4, 3 * 6 - 1)
    for i, frame in enumerate(frames):
        np.testing.assert_array_equal(image[:, 6 * i:6 * i + 5], frame.T)  # x across, y up
    gaps = [6 * i + 5 for i in range(2)]
    assert image.mask[:, gaps].all() and not np.delete(image.mask, gaps, axis=1).any()
    assert (image.data[:, gaps] == 0).all()  # matplotlib scales masked values too: no garbage there


def test_rollout_figure_draws_one_image_per_row_with_the_steps_labelled(tmp_path, monkeypatch):
    import matplotlib.figure

    rng = np.random.default_rng(1)
    true = rng.normal(size=(12, 8, 6, 2))  # (T, X, Y, F)
    pred = true + 0.1
    drawn, save = {}, plots.save_png

    def keep_and_save(fig, path, **kwargs):
        drawn["fig"] = fig
        return save(fig, path, **kwargs)

    monkeypatch.setattr(plots, "save_png", keep_and_save)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warning from the scaling
        plots.rollout_figure(true, pred, ["u", "v"], tmp_path / "rollout.png", mean=[1.0, 2.0],
                             std=[2.0, 3.0])
    assert (tmp_path / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig: matplotlib.figure.Figure = drawn["fig"]
    rows = [ax for ax in fig.axes if ax.images and ax.get_ylabel()]
    assert [ax.get_ylabel() for ax in rows] == [f"{f}\n{r}" for f in "uv"
                                                for r in ("reference", "prediction", "error")]
    steps = [0, 1, 4, 6, 9, 11]  # default: 1, 2, 5, 10, the middle and the last
    assert [t.get_text() for t in rows[0].get_xticklabels()] == [f"step {t + 1}" for t in steps]
    reference = rows[3].images[0].get_array()  # field v, in physical units
    np.testing.assert_allclose(reference[:, 9 * 2:9 * 2 + 8], (true[4, ..., 1] * 3.0 + 2.0).T)
    error = rows[5].images[0].get_array()
    np.testing.assert_allclose(error.compressed(), 0.1 * 3.0)


def test_importing_a_training_script_does_not_import_matplotlib():
    """matplotlib costs every process about 0.1 s of CPU to import, pyplot 0.4 s more; most
    processes never draw (a job's other ranks, a refused command), so it comes with the first
    figure."""
    import subprocess

    from tests.conftest import PYTHON, REPO

    # matplotlib itself, not modules named after it (torch 2.5's sympy 1.13 imports
    # sympy.plotting.backends.matplotlibbackend, which does not import matplotlib)
    probe = ("import sys, fno, wellfno.rollout; print(sorted(m for m in sys.modules "
             "if m.split('.')[0] == 'matplotlib'))")
    r = subprocess.run([PYTHON, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
