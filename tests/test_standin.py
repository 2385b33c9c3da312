"""Stand-ins of The Well's 23 datasets: format, the_well's own reader, this repo's checks.

References are the published metadata files themselves (field name lists, boundary
types, resolution), read here with yaml, not through coursetools.wellmeta's derivations.
"""
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from tests.conftest import run_script
from wellfno.cli import UserError
from coursetools.standin import component_series, scalar_from_file_name, scaled_resolution, write_standin
from coursetools.wellmeta import METADATA, check_files, dataset_names, layout

NAMES = dataset_names()


def raw_metadata(name):
    return yaml.safe_load((METADATA / f"{name}.yaml").read_text())


def tiny_scale(name):
    """16 cells on the longest axis in 2-D, 8 in 3-D."""
    meta = raw_metadata(name)
    return (16 if meta["n_spatial_dims"] == 2 else 8) / max(meta["spatial_resolution"])


def test_the_23_datasets_of_the_well():
    from the_well.data.utils import WELL_DATASETS

    assert sorted(NAMES) == sorted(WELL_DATASETS)
    assert len(NAMES) == 23


@pytest.mark.parametrize("name", NAMES)
def test_layout_rebuilds_the_published_names(name):
    """Core names + axis names give back exactly the expanded lists the metadata publishes."""
    meta, lay = raw_metadata(name), layout(name)
    for order in range(3):
        assert lay.expanded(order, lay.fields[order]) == (meta["field_names"].get(order) or [])
        assert lay.expanded(order, lay.constant_fields[order]) == (meta["constant_field_names"].get(order) or [])
    assert {t for ends in lay.boundaries.values() for t in ends} == set(meta["boundary_condition_types"])
    assert list(lay.boundaries) == list(lay.spatial_dims)


def check_standin(data_dir: Path, name: str):
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    from wellfno.data import check_dataset

    meta = raw_metadata(name)
    scale = tiny_scale(name)
    dataset_dir = write_standin(data_dir, name, steps=3, trajectories=2, scale=scale)
    assert dataset_dir == data_dir / "datasets" / name
    res = scaled_resolution(tuple(meta["spatial_resolution"]), scale)

    # the-well-download's layout: stats.yaml (the published one, byte for byte) and the real file names
    assert (dataset_dir / "stats.yaml").read_text() == (METADATA / f"{name}.stats.yaml").read_text()
    for split in ("train", "valid", "test"):
        (path,) = (dataset_dir / "data" / split).glob("*.hdf5")
        assert path.name.startswith(name.split("_")[0])
        with h5py.File(path, "r") as f:
            assert "spatial_resolution" in f.attrs["standin_cut"]
            assert list(f.attrs["standin_original_spatial_resolution"]) == meta["spatial_resolution"]

    assert check_files(dataset_dir) == []
    check_dataset(dataset_dir, splits=("train", "valid", "test"))

    ds = WellDataset(path=str(dataset_dir), well_split_name="train", n_steps_input=1, n_steps_output=1,
                     use_normalization=True, normalization_type=ZScoreNormalization)
    assert ds.metadata.dataset_name == name
    assert ds.metadata.n_spatial_dims == meta["n_spatial_dims"]
    assert ds.metadata.grid_type == meta["grid_type"]
    assert ds.metadata.spatial_resolution == res
    assert ds.metadata.field_names == {o: meta["field_names"].get(o) or [] for o in range(3)}
    assert ds.metadata.constant_field_names == {o: meta["constant_field_names"].get(o) or [] for o in range(3)}
    assert ds.metadata.constant_scalar_names == meta["constant_scalar_names"]
    assert sorted(ds.metadata.boundary_condition_types) == sorted(meta["boundary_condition_types"])
    assert len(ds) == 2 * (3 - 1)  # trajectories x windows
    sample = ds[len(ds) - 1]
    n_fields = sum(len(v or []) for v in meta["field_names"].values())
    n_constant = sum(len(v or []) for v in meta["constant_field_names"].values())
    assert sample["input_fields"].shape == (1, *res, n_fields)
    assert sample["output_fields"].shape == (1, *res, n_fields)
    assert torch_finite(sample["input_fields"])
    if n_constant:
        assert sample["constant_fields"].shape == (*res, n_constant)
    else:
        assert "constant_fields" not in sample
    assert sample["boundary_conditions"].shape == (meta["n_spatial_dims"], 2)


def torch_finite(t):
    return bool(t.isfinite().all())


@pytest.mark.parametrize("name", ["MHD_64", "helmholtz_staircase", "active_matter"])
def test_standin_loads_fast_subset(name, tmp_path):
    """3-D; 2-D with a constant field and mixed boundaries; 2-D with tensor fields."""
    check_standin(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_standin_every_dataset(name, tmp_path):
    check_standin(tmp_path, name)


def test_boundaries_reach_well_dataset(tmp_path):
    """helmholtz_staircase: open sides; a wall below and open above (the_well's codes: WALL 0, OPEN 1)."""
    from the_well.data import WellDataset

    dataset_dir = write_standin(tmp_path, "helmholtz_staircase", steps=2, trajectories=1, scale=1 / 64)
    sample = WellDataset(path=str(dataset_dir), well_split_name="valid")[0]
    assert sample["boundary_conditions"].tolist() == [[1, 1], [0, 1]]


def test_format_check_finds_what_is_wrong(tmp_path):
    dataset_dir = write_standin(tmp_path, "acoustic_scattering_maze", steps=2, trajectories=1, scale=1 / 32)
    (path,) = (dataset_dir / "data" / "train").glob("*.hdf5")
    with h5py.File(path, "r+") as f:
        del f["t0_fields/speed_of_sound"]  # a constant field gone (still listed)
        data = f["t0_fields/pressure"][...]
        del f["t0_fields/pressure"]
        f["t0_fields"].create_dataset("pressure", data=data.astype(np.float64))
        for key in ("dim_varying", "sample_varying", "time_varying"):
            f["t0_fields/pressure"].attrs[key] = [True, True] if key == "dim_varying" else True
    stats = yaml.safe_load((dataset_dir / "stats.yaml").read_text())
    del stats["std"]["velocity"]
    stats["mean"]["pressure"] = [1.0, 2.0]
    (dataset_dir / "stats.yaml").write_text(yaml.safe_dump(stats))
    problems = "\n".join(check_files(dataset_dir))
    assert "t0_fields/speed_of_sound is listed but missing" in problems
    assert "t0_fields/pressure is float64, expected float32" in problems
    assert "no 'std' for field 'velocity'" in problems
    assert "'mean' of 'pressure' has shape (2,), expected ()" in problems
    assert check_files(write_standin(tmp_path / "ok", "acoustic_scattering_maze", steps=2, trajectories=1,
                                     scale=1 / 32)) == []


def test_values_have_the_published_statistics():
    """mean, std and the std of one-step differences come out as asked (smooth fields, many samples)."""
    rng = np.random.default_rng(1)
    x = component_series(rng, 8, 40, (32, 32), mean=5.0, std=2.0, mean_delta=0.0, std_delta=0.5).astype(np.float64)
    assert abs(x.mean() - 5.0) < 0.2 * 2.0
    assert x.std() == pytest.approx(2.0, rel=0.15)
    assert np.diff(x, axis=1).std() == pytest.approx(0.5, rel=0.15)


def test_constant_scalars_from_real_file_names():
    assert scalar_from_file_name("Ma", "MHD_Ma_0.7_Ms_0.5.hdf5") == 0.7
    assert scalar_from_file_name("Ms", "MHD_Ma_0.7_Ms_0.5.hdf5") == 0.5
    assert scalar_from_file_name("alpha", "active_matter_L_10.0_zeta_11.0_alpha_-2.0.hdf5") == -2.0
    assert scalar_from_file_name("Rayleigh", "rayleigh_benard_Rayleigh_1e9_Prandtl_5.hdf5") == 1e9
    assert scalar_from_file_name("tcool", "turbulent_radiative_layer_tcool_0.32.hdf5") == 0.32
    assert scalar_from_file_name("omega", "acoustic_scattering_maze_chunk_6.hdf5") is None


def test_unknown_name_lists_close_matches(tmp_path):
    with pytest.raises(UserError, match="did you mean MHD_64"):
        write_standin(tmp_path, "mhd64")
    result = run_script("-m", "coursetools.standin", "--dataset", "turbulent_radiative_layer", "--data-dir", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "turbulent_radiative_layer_2D" in result.stderr and "Traceback" not in result.stderr


def test_cli_writes_a_standin(tmp_path):
    result = run_script("-m", "coursetools.standin", "--dataset", "supernova_explosion_64", "--data-dir", tmp_path,
                        "--steps", "2", "--trajectories", "1", "--scale", "0.0625")
    assert result.returncode == 0, result.stderr
    assert check_files(tmp_path / "datasets" / "supernova_explosion_64") == []
    result = run_script("-m", "coursetools.standin", "--dataset", "MHD_64", "--data-dir", tmp_path, "--scale", "2")
    assert result.returncode == 2 and result.stderr.startswith("error: --scale 2.0 must be in (0, 1]")
    with pytest.raises(UserError, match="--steps must be at least 2"):
        write_standin(tmp_path, "MHD_64", steps=1)


def test_readme_dataset_table_is_the_generated_one():
    from tests.conftest import REPO
    from coursetools.standin import dataset_table, readme_table

    assert readme_table((REPO / "README.md").read_text()) == dataset_table(), \
        "the README's dataset table is stale: run `python -m coursetools.standin --table README.md`"


def test_check_cli_on_a_standin_and_on_a_damaged_one(tmp_path):
    dataset_dir = write_standin(tmp_path, "planetswe", steps=2, trajectories=1, scale=1 / 32)
    result = run_script("-m", "coursetools.standin", "--check", dataset_dir)
    assert result.returncode == 0 and "matches The Well's metadata of planetswe" in result.stdout
    stats = yaml.safe_load((dataset_dir / "stats.yaml").read_text())
    del stats["mean"]["height"]
    (dataset_dir / "stats.yaml").write_text(yaml.safe_dump(stats))
    result = run_script("-m", "coursetools.standin", "--check", dataset_dir)
    assert result.returncode == 2 and "no 'mean' for field 'height'" in result.stderr


def test_a_standin_too_big_for_the_ram_is_one_sentence(tmp_path, monkeypatch):
    import coursetools.standin as standin

    monkeypatch.setattr(standin, "available_ram", lambda: 16 * 10**9)  # a laptop
    # MHD_256 at full resolution: 7 channels x 12 steps x 2 trajectories x 256^3 cells x 4 bytes = 11.3 GB per file
    with pytest.raises(UserError, match=r"one stand-in file is 11\.3 GB.*use --scale"):
        write_standin(tmp_path, "MHD_256")
    assert not (tmp_path / "datasets").exists()
