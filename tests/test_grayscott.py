"""The embedded dataset: real Gray-Scott physics, written in The Well's exact format."""
import h5py
import numpy as np
import pytest
import torch

from wellfno import grayscott
from wellfno.grayscott import DX, D_A, simulate


def test_homogeneous_steady_state_stays_put():
    a = np.ones((1, 16, 16))
    b = np.zeros((1, 16, 16))
    fa, fb = simulate(a, b, 0.03, 0.062, n_steps=5, save_every=50)
    np.testing.assert_allclose(fa, 1.0, atol=1e-12)
    np.testing.assert_allclose(fb, 0.0, atol=1e-12)


def test_pure_diffusion_matches_the_analytic_decay():
    # F = k = 0 and B = 0: A obeys the heat equation, a cosine mode decays as exp(-D k^2 t).
    n, eps = 32, 0.1
    x = np.arange(n) * DX
    wavenumber = 2 * np.pi / (n * DX)
    a = (1 + eps * np.cos(wavenumber * x))[None, :, None].repeat(n, axis=2)
    fa, _ = simulate(a, np.zeros_like(a), 0.0, 0.0, n_steps=2, save_every=200.0)
    amplitude = (fa[0, 1, :, 0].max() - fa[0, 1, :, 0].min()) / 2
    assert amplitude == pytest.approx(eps * np.exp(-D_A * wavenumber**2 * 200.0), rel=2e-3)


def test_patterns_form_in_a_pattern_forming_regime():
    rng = np.random.default_rng(0)
    a, b = grayscott.initial_condition(rng, 2, 32)
    F, k = grayscott.REGIMES["maze"]
    _, fb = simulate(a, b, F, k, n_steps=2, save_every=1000.0)
    final = fb[:, -1]
    assert (final.std(axis=(1, 2)) > 0.05).all(), "a maze regime must keep spatial structure"
    assert final.min() >= -0.05 and final.max() <= 1.0, "concentrations stay physical"


def test_generator_is_deterministic(tmp_path):
    spec = grayscott.SIZES["tiny"]
    one = grayscott.generate(tmp_path / "one", spec, seed=3, quiet=True)
    two = grayscott.generate(tmp_path / "two", spec, seed=3, quiet=True)
    for path in sorted(one.glob("data/*/*.hdf5")):
        with h5py.File(path) as f1, h5py.File(two / path.relative_to(one)) as f2:
            np.testing.assert_array_equal(f1["t0_fields/B"][:], f2["t0_fields/B"][:])


def test_layout_is_what_the_well_downloader_produces(tiny_dataset_dir):
    assert (tiny_dataset_dir / "stats.yaml").is_file()
    for split in ("train", "valid", "test"):
        files = sorted((tiny_dataset_dir / "data" / split).glob("*.hdf5"))
        assert len(files) == 2, split  # one file per (F, k) regime, like The Well


def test_files_follow_the_well_conventions(tiny_dataset_dir):
    path = next((tiny_dataset_dir / "data" / "train").glob("*maze*.hdf5"))
    with h5py.File(path) as f:
        assert f.attrs["dataset_name"] == "gray_scott_embedded"
        assert f.attrs["n_spatial_dims"] == 2 and f.attrs["grid_type"] == "cartesian"
        assert set(f) >= {"dimensions", "boundary_conditions", "scalars", "t0_fields", "t1_fields", "t2_fields"}
        assert list(f["t0_fields"].attrs["field_names"]) == ["A", "B"]
        assert list(f["t1_fields"].attrs["field_names"]) == [] == list(f["t2_fields"].attrs["field_names"])
        field = f["t0_fields/A"]
        assert field.shape == (2, 12, 16, 16) and field.dtype == np.float32
        assert field.attrs["time_varying"] and field.attrs["sample_varying"]
        assert list(field.attrs["dim_varying"]) == [True, True]
        assert list(f["dimensions"].attrs["spatial_dims"]) == ["x", "y"]
        assert f["dimensions/time"].shape == (12,)
        for name in ("x_periodic", "y_periodic"):
            bc = f["boundary_conditions"][name]
            assert bc.attrs["bc_type"] == "periodic"
            mask = bc["mask"][:]
            assert mask[0] and mask[-1] and not mask[1:-1].any()
        assert list(f["scalars"].attrs["field_names"]) == ["F", "k"]
        assert float(f["scalars/F"][()]) == pytest.approx(0.029) and not f["scalars/F"].attrs["time_varying"]


def test_well_dataset_zscore_gives_unit_normal_train_fields(tiny_dataset_dir):
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    # Whole trajectories, so every frame counts exactly once.
    ds = WellDataset(path=str(tiny_dataset_dir), well_split_name="train", n_steps_input=1,
                     full_trajectory_mode=True, use_normalization=True, normalization_type=ZScoreNormalization)
    frames = torch.cat([torch.cat([s["input_fields"], s["output_fields"]]) for s in ds])  # (N*T, H, W, F)
    values = frames.reshape(-1, frames.shape[-1]).double()
    np.testing.assert_allclose(values.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(values.std(0, unbiased=False), 1.0, atol=1e-5)
    sample = ds[0]
    assert sample["constant_scalars"].tolist() == pytest.approx([0.029, 0.057])  # F, k of the maze file


def test_neuraloperator_the_well_dataset_loads_it(tiny_data_dir):
    from pathlib import Path

    from neuralop.data.datasets.the_well_dataset import TheWellDataset

    ds = TheWellDataset(Path(tiny_data_dir), "gray_scott_embedded", download=False)
    sample = ds.train_db[0]
    assert sample["input_fields"].shape == (1, 16, 16, 2)


def test_split_files_lists_the_files_in_welldatasets_order(tiny_data_copy):
    """One listing for every reader: the_well's own WellDataset is the reference."""
    from the_well.data import WellDataset

    from wellfno.wellformat import split_files

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    train = dataset_dir / "data" / "train"
    first = sorted(train.glob("*.hdf5"))[0]
    # Both suffixes, a name that sorts between the others, and a temp file no reader may see.
    first.rename(train / "gray_scott_embedded_m.h5")
    (train / ".gray_scott_embedded_z.hdf5.abc.tmp").write_bytes(b"half a file")
    well = WellDataset(path=str(dataset_dir), well_split_name="train", use_normalization=False)
    assert [str(p) for p in split_files(dataset_dir, "train")] == list(well.files_paths)
    assert len(split_files(dataset_dir, "train")) == 2 and split_files(dataset_dir, "nonexistent") == []


def test_an_interrupted_write_leaves_no_file(tmp_path):
    from wellfno.wellformat import write_well_file

    path = tmp_path / "data" / "train" / "x.hdf5"
    bad = {"A": np.zeros((1, 3, 4, 4), dtype=np.float32), "B": object()}  # h5py cannot store the second field
    with pytest.raises(TypeError):
        write_well_file(path, dataset_name="x", time=np.arange(3), coords={"x": np.arange(4), "y": np.arange(4)},
                        t0_fields=bad)
    assert list(path.parent.iterdir()) == [], "neither the file nor a temporary file may be left"
