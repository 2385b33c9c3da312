"""wellfno.fastwell yields exactly the samples of the_well's WellDataset, faster."""
import pickle

import h5py
import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from wellfno.cli import UserError
from wellfno.data import well_datasets
from wellfno.fastwell import FastWellDataset, fast_datasets
from wellfno.wellformat import write_well_file


def assert_same_sample(expected: dict, got: dict, where=""):
    assert expected.keys() == got.keys(), where
    for key in expected:
        assert got[key].dtype == expected[key].dtype, (where, key)
        assert got[key].shape == expected[key].shape, (where, key)
        # Bitwise: the same float32 (x - mean) / std, applied to all channels at once.
        assert torch.equal(got[key], expected[key]), (where, key, (got[key] - expected[key]).abs().max())


@pytest.mark.parametrize("n_steps_input", [1, 3])
def test_same_samples_as_welldataset_across_file_boundaries(tiny_dataset_dir, n_steps_input):
    well = well_datasets(tiny_dataset_dir, n_steps_input)["train"]
    fast = FastWellDataset(tiny_dataset_dir, "train", n_steps_input)
    assert len(fast) == len(well)
    assert fast.field_names == well.field_names and fast.core_field_names == well.core_field_names
    starts = [int(s) for s in well.file_index_offsets[1:-1]]  # the first sample of every file after the first
    windows = well.n_windows_per_trajectory[0]
    assert starts, "the tiny dataset has several files"
    indices = sorted({0, 1, windows - 1, windows, len(well) - 1} | {s - 1 for s in starts} | set(starts))
    for index in indices:
        assert_same_sample(well[index], fast[index], f"index {index}")
    for index, got in zip(indices, fast.__getitems__(indices)):  # the batched path DataLoader takes
        assert_same_sample(well[index], got, f"batched index {index}")


def test_shuffled_batches_from_workers_equal_welldataset_batches(tiny_dataset_dir):
    well = well_datasets(tiny_dataset_dir, 2)["train"]
    fast = FastWellDataset(tiny_dataset_dir, "train", 2)
    fast[0]  # open the files in this process first: workers must open their own handles after the fork

    def batches(dataset, **kwargs):
        return list(DataLoader(dataset, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3),
                               **kwargs))

    expected, got = batches(well), batches(fast, num_workers=2)
    assert len(got) == len(expected) == -(-len(well) // 5)
    for b, (e, g) in enumerate(zip(expected, got)):
        assert_same_sample(e, g, f"batch {b}")


def test_pickles_without_open_handles(tiny_dataset_dir):
    fast = FastWellDataset(tiny_dataset_dir, "valid", 1)
    first = fast[0]
    copy = pickle.loads(pickle.dumps(fast))  # what a spawned DataLoader worker receives
    assert copy._datasets is None
    assert_same_sample(first, copy[0])


def test_out_of_range_index(tiny_dataset_dir):
    fast = FastWellDataset(tiny_dataset_dir, "valid", 1)
    with pytest.raises(IndexError):
        fast[len(fast)]


def test_too_many_input_steps_is_a_user_error(tiny_dataset_dir):
    with pytest.raises(UserError, match="at most 11 input steps"):
        fast_datasets(tiny_dataset_dir, 12)


def write_dataset(folder, t1_time_varying=True, seed=0):
    """Two files with a scalar field A and a vector field u (t1: components u_x, u_y), and stats.yaml."""
    rng = np.random.default_rng(seed)
    coords = {"x": np.arange(6, dtype=np.float32), "y": np.arange(5, dtype=np.float32)}
    for name, n_traj in (("a", 2), ("b", 1)):
        u_shape = (n_traj, 7, 6, 5, 2) if t1_time_varying else (n_traj, 6, 5, 2)
        write_well_file(folder / "data" / "train" / f"{name}.hdf5", dataset_name="vec", time=np.arange(7.0),
                        coords=coords, t0_fields={"A": rng.random((n_traj, 7, 6, 5), dtype=np.float32)},
                        t1_fields={"u": rng.standard_normal(u_shape, dtype=np.float32)},
                        time_varying={"u": t1_time_varying}, constant_scalars={"F": 0.1 + n_traj, "k": 0.05})
    stats = {"mean": {"A": 0.5, "u": [0.1, -0.2]}, "std": {"A": 0.3, "u": [1.1, 0.00001]},
             "mean_delta": {"A": 0.0, "u": [0.0, 0.0]}, "std_delta": {"A": 0.1, "u": [0.2, 0.3]}}
    (folder / "stats.yaml").write_text(yaml.safe_dump(stats))
    return folder


def test_vector_fields_give_component_channels_in_welldataset_order(tmp_path):
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    folder = write_dataset(tmp_path / "vec")
    well = WellDataset(path=str(folder), well_split_name="train", n_steps_input=2, n_steps_output=1,
                       use_normalization=True, normalization_type=ZScoreNormalization, return_grid=False,
                       boundary_return_type=None)
    fast = FastWellDataset(folder, "train", 2)
    assert fast.field_names == {0: ["A"], 1: ["u_x", "u_y"], 2: []} == well.field_names
    assert fast[0]["input_fields"].shape == (2, 6, 5, 3)
    for index in range(len(well)):  # 3 trajectories x 5 windows; std 1e-5 is clipped to 1e-4 in both
        assert_same_sample(well[index], fast[index], f"index {index}")


def test_fields_constant_in_time_are_constant_fields_like_welldataset(tmp_path):
    """A time-constant vector field (one per trajectory) comes back as constant_fields, bitwise."""
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    folder = write_dataset(tmp_path / "const", t1_time_varying=False)
    well = WellDataset(path=str(folder), well_split_name="train", n_steps_input=1, n_steps_output=1,
                       use_normalization=True, normalization_type=ZScoreNormalization, return_grid=False,
                       boundary_return_type=None)
    fast = FastWellDataset(folder, "train", 1)
    assert fast.metadata.constant_field_names == well.metadata.constant_field_names == {0: [], 1: ["u_x", "u_y"], 2: []}
    assert fast[0]["constant_fields"].shape == (6, 5, 2)
    for index, got in enumerate(fast.__getitems__(list(range(len(well))))):
        assert_same_sample(well[index], got, f"index {index}")


def test_fields_the_same_in_every_trajectory_but_changing_in_time_are_refused(tmp_path):
    folder = write_dataset(tmp_path / "shared")
    for path in (folder / "data" / "train").glob("*.hdf5"):
        with h5py.File(path, "r+") as f:
            f["t1_fields/u"].attrs["sample_varying"] = False
    with pytest.raises(UserError, match="u changes in time but is the same in every trajectory.*drop --fast-reader"):
        FastWellDataset(folder, "train", 1)


def test_a_drop_in_for_welldataset_with_the_same_arguments(tiny_dataset_dir):
    """Exercise 02's diff is WellDataset(...) -> FastWellDataset(...): the same keyword arguments, the same samples."""
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    arguments = dict(path=str(tiny_dataset_dir), well_split_name="valid", n_steps_input=2, n_steps_output=1,
                     use_normalization=True, normalization_type=ZScoreNormalization, return_grid=False,
                     boundary_return_type=None)
    well, fast = WellDataset(**arguments), FastWellDataset(**arguments)
    assert len(fast) == len(well)
    for index in (0, len(well) - 1):
        assert_same_sample(well[index], fast[index], f"index {index}")


@pytest.mark.parametrize("unsupported", [dict(return_grid=True), dict(boundary_return_type="padding"),
                                         dict(normalization_type=object)])
def test_what_the_fast_reader_cannot_do_is_a_user_error(tiny_dataset_dir, unsupported):
    with pytest.raises(UserError, match="drop --fast-reader"):
        FastWellDataset(tiny_dataset_dir, "valid", 1, **unsupported)
