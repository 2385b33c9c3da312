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


# --- A dataset is written whole or not at all, and never mixed with another (issue 35, point 1) ---

def dataset_files(dataset_dir):
    """Every file of a dataset folder with its bytes: what must not change when a run is refused."""
    return {str(p.relative_to(dataset_dir)): p.read_bytes() for p in sorted(dataset_dir.rglob("*"))
            if p.is_file()}


def grids_of(dataset_dir):
    with_grid = set()
    for path in dataset_dir.glob("data/*/*.hdf5"):
        with h5py.File(path) as f:
            with_grid.add(f["t0_fields/A"].shape[-2:])
    return with_grid


def test_a_dataset_of_another_size_is_refused_in_one_line_and_kept(tiny_data_copy):
    """Exercise 08's old hint (`--size tiny` into make data's folder) replaced two regimes' files
    of the demo set with 16x16 ones: now the folder is named with the fix, and nothing changes."""
    from tests.conftest import exit_of

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    before = dataset_files(dataset_dir)
    result = exit_of(grayscott, "--data-dir", tiny_data_copy, "--size", "demo")
    said = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(said) == 1 and said[0].startswith("error: "), result
    assert str(dataset_dir) in said[0] and "size tiny" in said[0] and "size demo" in said[0]
    assert "--data-dir data_demo" in said[0] and "--force" in said[0]
    assert dataset_files(dataset_dir) == before
    assert sorted(p.name for p in dataset_dir.parent.iterdir()) == [grayscott.EMBEDDED]


def test_the_same_dataset_again_is_nothing_to_do(tiny_data_copy):
    from tests.conftest import exit_of

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    before = {p: p.stat().st_mtime_ns for p in dataset_dir.rglob("*")}
    result = exit_of(grayscott, "--data-dir", tiny_data_copy, "--size", "tiny")
    assert result.returncode == 0 and "nothing to do" in result.stdout, result
    assert {p: p.stat().st_mtime_ns for p in dataset_dir.rglob("*")} == before


def test_a_dataset_without_a_record_is_kept_if_it_is_the_one_asked_for(tiny_data_copy):
    """A dataset an older generator left (no generator.json) that is, file by file, the size
    asked for: `make data` again keeps it, as before (nothing to do); another size is refused."""
    from tests.conftest import exit_of

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    (dataset_dir / grayscott.RECORD).unlink()
    before = dataset_files(dataset_dir)
    result = exit_of(grayscott, "--data-dir", tiny_data_copy, "--size", "tiny")
    assert result.returncode == 0 and "nothing to do" in result.stdout, result
    assert dataset_files(dataset_dir) == before
    result = exit_of(grayscott, "--data-dir", tiny_data_copy, "--size", "demo")
    assert result.returncode == 2 and "without a record" in result.stderr, result
    assert dataset_files(dataset_dir) == before


def test_a_mixed_dataset_without_a_record_is_refused(tiny_data_copy):
    """A dataset an older generator left (no generator.json) with one file of another grid (what
    exercise 08's old tiny-data hint did to `make data`'s dataset) is not written into."""
    from tests.conftest import exit_of

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    (dataset_dir / grayscott.RECORD).unlink()
    victim = sorted((dataset_dir / "data" / "train").glob("*.hdf5"))[0]
    import h5py

    with h5py.File(victim, "r+") as f:  # one regime's file at another grid, as the hint left it
        for name in list(f["t0_fields"]):
            data = f["t0_fields"][name][..., :8, :8]
            del f["t0_fields"][name]
            f["t0_fields"][name] = data
    before = dataset_files(dataset_dir)
    result = exit_of(grayscott, "--data-dir", tiny_data_copy, "--size", "tiny")
    assert result.returncode == 2 and "without a record" in result.stderr, result
    assert "--force" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert dataset_files(dataset_dir) == before


def test_force_replaces_the_whole_dataset(tiny_data_copy):
    from dataclasses import replace

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    assert grids_of(dataset_dir) == {(16, 16)}
    smaller = replace(grayscott.SIZES["tiny"], resolution=12, n_steps=3, regimes=("maze",))
    grayscott.generate(tiny_data_copy, smaller, quiet=True, force=True)
    assert grids_of(dataset_dir) == {(12, 12)}
    assert not list(dataset_dir.glob("data/*/*spots*")), "no file of the old dataset may be left"
    assert sorted(p.name for p in dataset_dir.parent.iterdir()) == [grayscott.EMBEDDED]


@pytest.mark.parametrize("already_there", [False, True])
def test_a_failed_generation_leaves_no_half_dataset(tiny_data_copy, tmp_path, monkeypatch,
                                                    already_there):
    """Killed or failing after its first file: the old dataset (with --force) or none, no mix."""
    data_dir = tiny_data_copy if already_there else tmp_path / "fresh"
    dataset_dir = data_dir / "datasets" / grayscott.EMBEDDED
    before = dataset_files(dataset_dir) if already_there else None
    written = []

    def one_file_then_interrupt(path, **kwargs):
        if written:
            raise KeyboardInterrupt  # Ctrl-C, or a job's time limit, halfway through
        written.append(path)
        return write_well_file(path, **kwargs)

    from wellfno.wellformat import write_well_file

    monkeypatch.setattr(grayscott, "write_well_file", one_file_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        grayscott.generate(data_dir, "tiny", seed=1, quiet=True, force=True)
    assert written, "the generator wrote its first file before the interruption"
    if already_there:
        assert dataset_files(dataset_dir) == before
        assert sorted(p.name for p in dataset_dir.parent.iterdir()) == [grayscott.EMBEDDED]
    else:
        assert list(dataset_dir.parent.iterdir()) == []


def test_two_processes_generating_the_same_dataset_at_once_both_succeed(tmp_path, monkeypatch):
    """Two ranks (or two test workers) generating into one folder: the second to finish keeps the
    first one's dataset (the same: the generator is deterministic) and removes its own copy."""
    import threading

    barrier = threading.Barrier(2, timeout=60)
    write = grayscott.write_dataset

    def write_then_wait(*args):
        write(*args)
        barrier.wait()  # both copies complete before either is renamed into place

    monkeypatch.setattr(grayscott, "write_dataset", write_then_wait)
    spec = grayscott.SIZES["tiny"]
    from dataclasses import replace

    spec = replace(spec, n_steps=3, regimes=("maze",))
    errors = []

    def generate():
        try:
            grayscott.generate(tmp_path, spec, quiet=True)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=generate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(p.name for p in (tmp_path / "datasets").iterdir()) == [grayscott.EMBEDDED]
    assert grids_of(tmp_path / "datasets" / grayscott.EMBEDDED) == {(16, 16)}


def test_patterns_that_die_out_are_one_line(tmp_path):
    from tests.conftest import exit_of

    result = exit_of(grayscott, "--data-dir", tmp_path, "--size", "demo", "--n-train", "1")
    said = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(said) == 1, result
    assert said[0].startswith("error: patterns died out") and "--seed" in said[0]
    assert list((tmp_path / "datasets").iterdir()) == []


def test_a_dataset_of_mixed_grids_is_one_line_that_says_how_to_regenerate(tiny_data_copy):
    """What the old generator left: one regime's files of another size. the_well stops on it with
    an AssertionError; open_dataset says what happened and what to do."""
    from the_well.data import WellDataset

    from wellfno.cli import UserError
    from wellfno.data import open_dataset
    from wellfno.wellformat import write_well_file

    dataset_dir = tiny_data_copy / "datasets" / grayscott.EMBEDDED
    maze = next((dataset_dir / "data" / "train").glob("*maze*"))
    coords = np.arange(8) * 0.1
    write_well_file(maze, dataset_name=grayscott.EMBEDDED, time=np.arange(12.0),
                    coords={"x": coords, "y": coords},
                    t0_fields={"A": np.zeros((2, 12, 8, 8), np.float32),
                               "B": np.zeros((2, 12, 8, 8), np.float32)},
                    constant_scalars={"F": 0.029, "k": 0.057})
    with pytest.raises(AssertionError, match="Multiple resolutions"):  # the reference: the_well's
        WellDataset(path=str(dataset_dir), well_split_name="train", use_normalization=False)
    with pytest.raises(UserError) as refused:
        open_dataset(tiny_data_copy)
    message = str(refused.value)
    assert "\n" not in message and str(dataset_dir) in message and "8x8" in message
    assert "16x16" in message and "--force" in message and "wellfno.grayscott" in message
