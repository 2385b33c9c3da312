"""wellfno.slabs: a rank's slab of every sample equals WellDataset's sample cut to those rows, and
only those rows are read (bytes counted through h5py's file-object driver)."""

from __future__ import annotations

import io

import h5py
import pytest
import torch

from wellfno.data import rollout_dataset, well_datasets
from wellfno.domain import slab_bounds
from wellfno.slabs import SlabRollouts, SlabWellDataset
from coursetools.standin import write_standin


def cut(sample: dict, rows: slice) -> dict:
    """WellDataset's sample, rows of the first spatial axis (after time for the fields)."""
    out = {}
    for key, value in sample.items():
        if key in ("input_fields", "output_fields"):
            out[key] = value[:, rows]
        elif key == "constant_fields":
            out[key] = value[rows]
        else:
            out[key] = value
    return out


def assert_equal_samples(expected: dict, got: dict, where):
    assert expected.keys() == got.keys(), where
    for key in expected:
        assert got[key].shape == expected[key].shape, (where, key)
        assert torch.equal(got[key], expected[key]), (where, key)


@pytest.mark.parametrize("parts", [2, 3])
def test_slabs_equal_welldataset_cut(tiny_dataset_dir, parts):
    well = well_datasets(tiny_dataset_dir, 2)["train"]
    n = well.metadata.spatial_resolution[0]
    for start, stop in slab_bounds(n, parts):
        slab = SlabWellDataset(tiny_dataset_dir, "train", 2, rows=slice(start, stop))
        assert (
            len(slab) == len(well)
            and slab.metadata.spatial_resolution == well.metadata.spatial_resolution
        )
        for index in (0, 5, len(well) - 1):
            assert_equal_samples(cut(well[index], slice(start, stop)), slab[index], (start, index))


def test_slabs_of_constant_fields_and_rollouts(tmp_path):
    """A stand-in with time-constant fields (acoustic_scattering_maze); whole trajectories too."""
    dataset_dir = write_standin(
        tmp_path, "acoustic_scattering_maze", steps=4, trajectories=2, scale=1 / 32
    )
    well = well_datasets(dataset_dir, 1)["valid"]
    rollouts = rollout_dataset(dataset_dir, 1, max_rollout_steps=2)
    n = well.metadata.spatial_resolution[0]
    for start, stop in slab_bounds(n, 3):
        rows = slice(start, stop)
        slab = SlabWellDataset(dataset_dir, "valid", 1, rows=rows)
        assert "constant_fields" in slab[0]
        for index in range(len(well)):
            assert_equal_samples(cut(well[index], rows), slab[index], (start, index))
        slab_rollouts = SlabRollouts(dataset_dir, 1, max_rollout_steps=2, rows=rows)
        assert len(slab_rollouts) == len(rollouts)
        for i in range(len(rollouts)):
            expected = {k: v for k, v in rollouts[i].items() if k in slab_rollouts[i]}
            assert_equal_samples(cut(expected, rows), slab_rollouts[i], ("rollout", start, i))


class CountingFile(io.FileIO):
    """A file that counts the bytes HDF5 reads from it."""

    read_bytes = 0

    def readinto(self, buffer):
        n = super().readinto(buffer)
        CountingFile.read_bytes += n or 0
        return n

    def read(self, size=-1):
        data = super().read(size)
        CountingFile.read_bytes += len(data)
        return data


def test_a_quarter_slab_reads_about_a_quarter_of_the_bytes(tiny_dataset_dir, monkeypatch):
    real_file = h5py.File

    def counted(path, mode="r", **kwargs):
        return real_file(CountingFile(str(path), "r"), mode, **kwargs)

    monkeypatch.setattr(h5py, "File", counted)
    read = {}
    for name, rows in (("whole", None), ("quarter", slice(4, 8))):
        CountingFile.read_bytes = 0
        slab = SlabWellDataset(tiny_dataset_dir, "train", 2, rows=rows)
        opened = CountingFile.read_bytes  # the layout and metadata read at construction
        slab.__getitems__(list(range(len(slab))))
        read[name] = CountingFile.read_bytes - opened
    assert read["whole"] > 0
    assert (
        read["quarter"] <= 0.35 * read["whole"]
    ), read  # 4 of 16 rows, plus HDF5's own metadata reads
