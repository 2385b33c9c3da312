"""The course on every layout of The Well: all 23 datasets' stand-ins, tiny (16 cells a side in 2-D, 8 in 3-D).

Each test takes one dataset; the stand-ins are written once per session, on first use.
"""
import json
import sys

import h5py
import numpy as np
import pytest
import torch
import yaml

from tests.conftest import REPO
from wellfno.cli import UserError
from coursetools.wellmeta import dataset_names, layout

NAMES = dataset_names()
THREE_D = [n for n in NAMES if layout(n).n_spatial_dims == 3]


def tiny_scale(name: str) -> float:
    lay = layout(name)
    return (16 if lay.n_spatial_dims == 2 else 8) / max(lay.resolution)


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    """name -> dataset folder of a tiny stand-in (3 train trajectories over 2 files, 4 steps), made on first use."""
    from coursetools.standin import write_standin

    root = tmp_path_factory.mktemp("standins")
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = write_standin(root, name, steps=4, trajectories=2, files=2, scale=tiny_scale(name))
        return made[name]

    return get


# --------------------------------------------------------------------------------------------- statistics (04)

def reference_stats(dataset_dir, split="train") -> dict:
    """float64 numpy: per field and component, over trajectories x time x space; deltas within trajectories."""
    values, deltas, orders = {}, {}, {}
    for path in sorted((dataset_dir / "data" / split).glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            n_dims = int(f.attrs["n_spatial_dims"])
            for order in range(3):
                group = f[f"t{order}_fields"]
                for name in group.attrs["field_names"]:
                    dset = group[name]
                    x = dset[...].astype(np.float64)
                    components = n_dims**order
                    orders[name] = (order, n_dims)
                    if dset.attrs["time_varying"]:
                        x = x.reshape(x.shape[0], x.shape[1], -1, components)  # traj, time, cells, comp
                        deltas.setdefault(name, []).append(np.diff(x, axis=1).reshape(-1, components))
                    values.setdefault(name, []).append(x.reshape(-1, components))
    out = {}
    for suffix, table in (("", values), ("_delta", deltas)):
        for name, parts in table.items():
            x = np.concatenate(parts)
            mean, std = x.mean(axis=0), x.std(axis=0)
            rms = np.sqrt((x * x).mean(axis=0))
            order, n_dims = orders[name]
            for key, v in (("mean", mean), ("std", std), ("rms", rms)):
                out.setdefault(key + suffix, {})[name] = v.reshape((n_dims,) * order)
    return out


def assert_stats_equal(got: dict, want: dict):
    for key, fields in want.items():
        assert set(got[key]) == set(fields), key
        for name, value in fields.items():
            scale = np.abs(np.asarray(want["std" if "delta" not in key else "std_delta"][name])).max() + 1e-300
            np.testing.assert_allclose(np.asarray(got[key][name], dtype=np.float64), value, rtol=1e-10,
                                       atol=1e-12 * scale, err_msg=f"{key}[{name}]")


@pytest.fixture(scope="module")
def stats_script():
    return load_script(REPO / "stats.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_stats_script_equals_float64_reference(name, standins, stats_script, tmp_path, monkeypatch):
    """The serial stats.py (exercise 04's baseline) on every layout: t0/t1/t2, constant fields, 2-D and 3-D.

    In this process (stats.py's main reads sys.argv): 23 layouts, 23 Python starts saved; the
    script as a process is tests/test_stats.py's."""
    dataset_dir = standins(name)
    out = tmp_path / "stats.yaml"
    monkeypatch.setattr(sys, "argv", ["stats.py", str(dataset_dir), "--out", str(out)])
    assert stats_script.main() == 0
    assert_stats_equal(yaml.safe_load(out.read_text()), reference_stats(dataset_dir))


# --------------------------------------------------------------------------------------- fno.py on every layout

def load_script(path):
    """The script as `python path` imports it, with the modules beside it (solution 03's
    binding.py): conftest.import_script, so no test depends on another having put them on sys.path."""
    from tests.conftest import import_script

    return import_script(path)


@pytest.fixture(scope="module")
def fno_script():
    return load_script(REPO / "fno.py")


SMALL = ["--epochs", "1", "--max-steps", "1", "--batch-size", "2", "--width", "8", "--modes", "4"]


def run_fno(fno_script, name, standins, out):
    dataset_dir = standins(name)
    fno_script.main(["--dataset", name, "--data-dir", str(dataset_dir.parent.parent), "--out", str(out), *SMALL])
    metrics = json.loads((out / "metrics.json").read_text())
    lay = layout(name)
    assert len(metrics["rollout_vrmse"]) == 4 - 1  # 4 frames: 1 in, 3 predicted
    assert all(np.isfinite(metrics["rollout_vrmse"])) and np.isfinite(metrics["train_loss"])
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    spectral = [v for k, v in state["model"].items() if "weight" in k and v.ndim == 2 + lay.n_spatial_dims]
    assert spectral, "the FNO has one mode axis per spatial axis"
    return metrics


@pytest.mark.parametrize("name", ["MHD_64", "acoustic_scattering_maze"])
def test_fno_trains_rolls_out_and_plots_fast_subset(name, fno_script, standins, tmp_path):
    """A 3-D dataset; a 2-D one with constant fields."""
    run_fno(fno_script, name, standins, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fno_trains_rolls_out_and_plots(name, fno_script, standins, tmp_path):
    run_fno(fno_script, name, standins, tmp_path)


# ------------------------------------------------------------------------------- the fast reader (02), bitwise

def assert_same_samples(well, fast):
    assert len(fast) == len(well)
    indices = list(range(len(well)))
    for index, got in zip(indices, fast.__getitems__(indices)):
        expected = well[index]
        assert expected.keys() == got.keys(), index
        for key in expected:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), (index, key)


def check_fast_reader(name, standins):
    from wellfno.data import well_datasets
    from wellfno.fastwell import FastWellDataset, layout_support

    dataset_dir = standins(name)
    support = layout_support(layout(name))
    if support != "yes":
        with pytest.raises(UserError):
            FastWellDataset(dataset_dir, "train", 1)
        return
    for n_steps_input in (1, 2):
        well = well_datasets(dataset_dir, n_steps_input)["train"]
        assert_same_samples(well, FastWellDataset(dataset_dir, "train", n_steps_input))


@pytest.mark.parametrize("name", ["helmholtz_staircase", "turbulence_gravity_cooling"])
def test_fast_reader_bitwise_fast_subset(name, standins):
    check_fast_reader(name, standins)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fast_reader_bitwise_where_it_claims_the_layout(name, standins):
    check_fast_reader(name, standins)


# ------------------------------------------------------------------- the solutions and tools on 2-D and 3-D data

_loaded = {}


def run_ok(path, *args):
    """`python PATH ARGS` in this process (its main(argv)): these checks are about the data layouts,
    not the process, and each Python start would import torch again (seconds each)."""
    from tests.conftest import call_main

    if path not in _loaded:
        _loaded[path] = load_script(REPO / path)
    call_main(_loaded[path], *args)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MHD_64", "acoustic_scattering_maze"])
def test_solutions_train_and_roll_out(name, standins, tmp_path):
    """Every step of the course on a 3-D dataset and on a 2-D one with constant fields."""
    data_dir = standins(name).parent.parent
    common = ["--dataset", name, "--data-dir", data_dir, *SMALL]
    run_ok("solutions/01_profiling/fno.py", *common, "--out", tmp_path / "01")
    run_ok("solutions/02_data_pipeline/fno.py", *common, "--out", tmp_path / "02", "--fast-reader",
           "--num-workers", "1")
    run_ok("solutions/03_affinity/fno.py", *common, "--out", tmp_path / "03", "--bind", "none")
    for step in ("01", "02", "03"):
        assert (tmp_path / step / "rollout.png").is_file() and (tmp_path / step / "metrics.json").is_file()
    # the profiling solution's trace of a 3-D or constant-field run
    run_ok("solutions/01_profiling/fno.py", "--dataset", name, "--data-dir", data_dir, "--out", tmp_path / "prof",
           "--profile", "--max-steps", "4", "--profile-warmup", "1", "--profile-active", "2", "--batch-size", "1",
           "--width", "8", "--modes", "4")
    assert list((tmp_path / "prof").glob("trace_rank0_*.json*"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MHD_64", "acoustic_scattering_maze"])
def test_throughput_tool(name, standins, tmp_path):
    data_dir = standins(name).parent.parent
    run_ok("profiling/throughput.py", "--data-dir", data_dir, "--dataset", name, "--out", tmp_path, "--workers", "0",
           "--seconds", "0.1", "--repeats", "1", "--warmup", "1", "--batch-size", "2", "--threads", "1")
    rows = json.loads((tmp_path / "throughput.json").read_text())["rows"]
    assert {r["reader"] for r in rows} == {"well", "fast"} and all(r["full"] > 0 for r in rows)


# ------------------------------------------------------------------------------------------------- bad input

def test_a_field_without_statistics_is_one_line(standins, tmp_path):
    import shutil

    from wellfno.data import check_dataset

    copy = tmp_path / "acoustic_scattering_maze"
    shutil.copytree(standins("acoustic_scattering_maze"), copy)
    stats = yaml.safe_load((copy / "stats.yaml").read_text())
    del stats["std"]["speed_of_sound"]  # a constant field
    (copy / "stats.yaml").write_text(yaml.safe_dump(stats))
    with pytest.raises(UserError, match=r"no 'std' for field 'speed_of_sound'.*python stats.py") as err:
        check_dataset(copy)
    assert "\n" not in str(err.value)


def test_unequal_grid_spacing_is_refused_with_what_to_use(standins, tmp_path):
    import shutil

    from wellfno.data import check_dataset

    copy = tmp_path / "rayleigh_benard"
    shutil.copytree(standins("rayleigh_benard"), copy)
    for path in copy.glob("data/*/*.hdf5"):
        with h5py.File(path, "r+") as f:
            y = f["dimensions/y"]
            n = y.shape[0]
            y[...] = (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)  # Chebyshev points
    with pytest.raises(UserError, match="not equally spaced.*uniform grid") as err:
        check_dataset(copy)
    assert "\n" not in str(err.value)


def test_unknown_dataset_in_fno_lists_close_matches(fno_script, tmp_path):
    with pytest.raises(UserError, match="unknown dataset 'MHD_65': did you mean MHD_64") as err:
        fno_script.main(["--dataset", "MHD_65", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- batch layout and rollout in N-D

def test_to_channels_and_model_inputs_match_numpy():
    from wellfno.data import model_inputs, to_channels

    rng = np.random.default_rng(0)
    frames = rng.standard_normal((2, 3, 4, 5, 6, 7)).astype(np.float32)  # B, T, X, Y, Z, C
    constants = rng.standard_normal((2, 4, 5, 6, 2)).astype(np.float32)  # B, X, Y, Z, K
    # channel t*C + c holds frame t, field c; then the K constant fields
    expected = np.concatenate([frames.transpose(0, 1, 5, 2, 3, 4).reshape(2, 21, 4, 5, 6),
                               constants.transpose(0, 4, 1, 2, 3)], axis=1)
    assert np.array_equal(to_channels(torch.from_numpy(frames)).numpy(), expected[:, :21])
    got = model_inputs(torch.from_numpy(frames), torch.from_numpy(constants))
    assert np.array_equal(got.numpy(), expected)
    frames[0, 0, 0, 0, 0, 0] = np.nan  # NaN -> 0, as the_well's formatter does
    assert model_inputs(torch.from_numpy(frames))[0, 0, 0, 0, 0] == 0


def test_vrmse_3d_matches_numpy():
    from wellfno.rollout import vrmse

    rng = np.random.default_rng(1)
    true, pred = rng.normal(size=(2, 3, 4, 5, 6, 2)), rng.normal(size=(2, 3, 4, 5, 6, 2))
    mse = ((pred - true) ** 2).mean(axis=(2, 3, 4))
    expected = np.sqrt(mse / (true.var(axis=(2, 3, 4)) + 1e-7))
    np.testing.assert_allclose(vrmse(torch.tensor(pred), torch.tensor(true), 3).numpy(), expected, rtol=1e-12)


class Oracle(torch.nn.Module):
    """The true next frame, found by matching the input window (and the constant fields) in the trajectory."""

    def __init__(self, trajectory, constants, n_steps_input):
        super().__init__()
        self.trajectory, self.constants, self.n = trajectory, constants, n_steps_input  # (T, *S, C), (*S, K)

    def forward(self, x):
        from wellfno.data import model_inputs

        for t in range(self.n, self.trajectory.shape[0]):
            window = self.trajectory[t - self.n:t].unsqueeze(0)
            constants = None if self.constants is None else self.constants.unsqueeze(0)
            if torch.equal(model_inputs(window, constants), x):
                return self.trajectory[t].movedim(-1, 0).unsqueeze(0)
        raise AssertionError("the rollout fed a window that is not a stretch of the trajectory")


@pytest.mark.parametrize("name", ["MHD_64", "helmholtz_staircase"])
def test_rollout_with_an_oracle_is_exact_in_3d_and_with_constant_fields(name, standins):
    from wellfno.data import rollout_dataset
    from wellfno.rollout import evaluate_rollouts

    dataset = rollout_dataset(standins(name), 2)
    sample = dataset[0]
    trajectory = torch.cat([sample["input_fields"], sample["output_fields"]])
    oracle = Oracle(trajectory, sample.get("constant_fields"), 2)
    model_vrmse, persistence_vrmse, (true, pred) = evaluate_rollouts(oracle, dataset, "cpu", max_trajectories=1)
    assert torch.equal(true, pred) and max(model_vrmse) == 0 and min(persistence_vrmse) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MHD_64", "acoustic_scattering_maze"])
def test_ddp_and_efficiency_solutions_train_and_roll_out(name, standins, tmp_path):
    """Steps 05 and 11 (one rank) on a 3-D dataset and on a 2-D one with constant fields."""
    data_dir = standins(name).parent.parent
    common = ["--dataset", name, "--data-dir", data_dir, *SMALL]
    run_ok("solutions/05_ddp/fno.py", *common, "--out", tmp_path / "05", "--bind", "none")
    run_ok("solutions/11_compile/fno.py", *common, "--out", tmp_path / "09", "--bind", "none")
    for step in ("05", "09"):
        assert (tmp_path / step / "rollout.png").is_file() and (tmp_path / step / "metrics.json").is_file()
