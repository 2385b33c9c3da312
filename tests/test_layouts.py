"""The course on every layout of The Well: all 23 datasets' stand-ins, tiny (16 cells a side in 2-D, 8 in 3-D).

Each test takes one dataset; the stand-ins are written once per session, on first use.
"""
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

from tests.conftest import REPO
from wellfno.wellmeta import dataset_names, layout

NAMES = dataset_names()
THREE_D = [n for n in NAMES if layout(n).n_spatial_dims == 3]


def tiny_scale(name: str) -> float:
    lay = layout(name)
    return (16 if lay.n_spatial_dims == 2 else 8) / max(lay.resolution)


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    """name -> dataset folder of a tiny stand-in (3 train trajectories over 2 files, 4 steps), made on first use."""
    from wellfno.standin import write_standin

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


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_stats_script_equals_float64_reference(name, standins, tmp_path):
    """The serial stats.py (exercise 04's baseline) on every layout: t0/t1/t2, constant fields, 2-D and 3-D."""
    dataset_dir = standins(name)
    out = tmp_path / "stats.yaml"
    result = subprocess.run([sys.executable, str(REPO / "stats.py"), str(dataset_dir), "--out", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert_stats_equal(yaml.safe_load(out.read_text()), reference_stats(dataset_dir))
