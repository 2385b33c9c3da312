"""Serial dataset statistics (wellfno.stats, stats.py) against an independent float64 numpy reference."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import wellfno.stats as S
from wellfno.cli import UserError
from wellfno.wellformat import write_well_file

ROOT = Path(__file__).resolve().parents[1]
# Small enough that items are a few frames: several items per trajectory, deltas across item borders.
# (3 frames of the largest field, the 2x2 tensor: 6 x 5 x 4 values x 4 bytes)
TINY_CHUNK_MB = 3 * 480 / 2**20
# Trajectories x time steps per file: unequal, so the items (9 + 4 + 4 = 17 chunks of at most
# 3 frames) divide evenly by no world size up to 4, and their byte sizes differ (short last
# chunks, overlap frames, constant fields on first chunks).
FILES = [(3, 7), (1, 10), (2, 5)]
H, W = 6, 5  # not square, to catch swapped axes


def make_dataset(root: Path, files=FILES, seed: int = 0) -> Path:
    """A Well-format dataset: scalar, 1e4 +- 1e-2, steadily growing (float64), time-constant, vector, tensor fields."""
    rng = np.random.default_rng(seed)
    for i, (n_traj, n_time) in enumerate(files):
        drift = np.linspace(0, 3, n_time, dtype=np.float32)[None, :, None, None]  # nonzero mean_delta
        write_well_file(
            root / "data" / "train" / f"part_{i}.hdf5", dataset_name="stats_test",
            time=np.arange(n_time, dtype=np.float32), coords={"x": np.arange(H), "y": np.arange(W)},
            t0_fields={
                "u": (rng.normal(2.0, 1.5, (n_traj, n_time, H, W)) + drift).astype(np.float32),
                "pressure": (1e4 + 1e-2 * rng.standard_normal((n_traj, n_time, H, W))).astype(np.float32),
                # steady growth: mean_delta 1e3 >> std_delta ~1e-3, where a one-pass sum of squares fails
                "ramp": 1e3 * np.arange(n_time)[None, :, None, None] + 1e-3 * rng.standard_normal((n_traj, n_time, H, W)),
                "mask": rng.uniform(0, 1, (n_traj, H, W)).astype(np.float32),
            },
            t1_fields={"velocity": rng.normal([0.5, -3.0], [0.1, 2.0], (n_traj, n_time, H, W, 2)).astype(np.float32)},
            t2_fields={"stress": rng.normal(1.0, 0.3, (n_traj, n_time, H, W, 2, 2)).astype(np.float32)},
            time_varying={"mask": False}, constant_scalars={"F": 0.03},
        )
    # a split that must be ignored
    write_well_file(root / "data" / "valid" / "v.hdf5", dataset_name="stats_test", time=np.arange(3),
                    coords={"x": np.arange(H), "y": np.arange(W)},
                    t0_fields={"u": np.full((1, 3, H, W), 1e6, np.float32)})
    return root


def reference_stats(dataset_dir: Path) -> dict:
    """Two-pass float64 numpy over whole arrays (fine for tiny data): the definition, written plainly."""
    arrays: dict[str, list[np.ndarray]] = {}
    varying, order = {}, {}
    for path in sorted((dataset_dir / "data" / "train").glob("*.hdf5")):
        with h5py.File(path) as f:
            for o in range(3):
                for name, dset in f[f"t{o}_fields"].items():
                    arrays.setdefault(name, []).append(dset[()].astype(np.float64))
                    varying[name], order[name] = bool(dset.attrs["time_varying"]), o

    def shaped(values, name):
        return values.reshape((2,) * order[name]).tolist() if order[name] else float(values[0])

    out = {k: {} for k in ("mean", "std", "rms", "mean_delta", "std_delta", "rms_delta")}
    for name, parts in arrays.items():
        k = 2 ** order[name]
        flat = np.concatenate([p.reshape(-1, k) for p in parts])
        mean = flat.mean(axis=0)
        out["mean"][name] = shaped(mean, name)
        out["std"][name] = shaped(np.sqrt(((flat - mean) ** 2).mean(axis=0)), name)
        out["rms"][name] = shaped(np.sqrt((flat**2).mean(axis=0)), name)
        if varying[name]:
            d = np.concatenate([np.diff(p, axis=1).reshape(-1, k) for p in parts])
            dm = d.mean(axis=0)
            out["mean_delta"][name] = shaped(dm, name)
            out["std_delta"][name] = shaped(np.sqrt(((d - dm) ** 2).mean(axis=0)), name)
            out["rms_delta"][name] = shaped(np.sqrt((d**2).mean(axis=0)), name)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("stats_ds"))


def without_loss_weight(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k != "loss_weight"}


@pytest.mark.parametrize("chunk_mb, block_elements", [(S.CHUNK_BYTES / 2**20, S.BLOCK_ELEMENTS),
                                                      (TINY_CHUNK_MB, S.BLOCK_ELEMENTS),
                                                      (TINY_CHUNK_MB, 2 * H * W)])
def test_serial_matches_float64_reference(dataset, monkeypatch, chunk_mb, block_elements):
    monkeypatch.setattr(S, "BLOCK_ELEMENTS", block_elements)  # 2 frames: carry across blocks too
    plan = S.plan_dataset(dataset, chunk_bytes=int(chunk_mb * 2**20))
    if chunk_mb == TINY_CHUNK_MB:
        assert len(plan.items) == 17, "the test needs several items per trajectory"
    got = S.compute_dataset_stats(dataset, chunk_bytes=int(chunk_mb * 2**20))
    ref = reference_stats(dataset)
    assert set(got) == set(ref) | {"loss_weight"}
    assert S.max_relative_difference(without_loss_weight(got), ref) <= 1e-10
    # the 1e4 +- 1e-2 field keeps its small spread (float32 E[x^2]-E[x]^2 gives garbage here)
    assert 0.008 < got["std"]["pressure"] < 0.012
    assert 1e-3 < got["std_delta"]["ramp"] < 2e-3  # sqrt(2) * 1e-3, not cancellation noise
    assert "mask" not in got["mean_delta"] and "mask" in got["mean"]


def test_layout_is_the_wells(dataset):
    got = S.compute_dataset_stats(dataset)
    assert isinstance(got["mean"]["u"], float)
    assert len(got["std"]["velocity"]) == 2 and all(isinstance(v, float) for v in got["std"]["velocity"])
    assert np.asarray(got["rms_delta"]["stress"]).shape == (2, 2)
    # velocity y has std 2 by construction, x 0.1: components are not mixed up
    assert got["std"]["velocity"][0] == pytest.approx(0.1, rel=0.1)
    assert got["std"]["velocity"][1] == pytest.approx(2.0, rel=0.1)


def test_loss_weight_inverse_std_delta_squared_mean_one(dataset):
    got = S.compute_dataset_stats(dataset)
    names = ("u", "pressure", "ramp", "velocity", "stress")
    weights = np.concatenate([np.ravel(got["loss_weight"][n]) for n in names])
    std_delta = np.concatenate([np.ravel(got["std_delta"][n]) for n in names])
    assert weights.mean() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(weights * std_delta**2, (weights * std_delta**2)[0], rtol=1e-12)
    assert set(got["loss_weight"]) == set(got["std_delta"])  # time-constant fields are not predicted


def test_yaml_round_trips_every_bit(dataset, tmp_path):
    got = S.compute_dataset_stats(dataset)
    path = S.write_stats_yaml(got, tmp_path / "stats.yaml")
    back = yaml.safe_load(path.read_text())
    assert back == got  # float equality: repr() keeps all 17 significant digits
    assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temporary file"


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 40])
def test_rank_ranges_cover_every_item_once(dataset, world):
    plan = S.plan_dataset(dataset, chunk_bytes=int(TINY_CHUNK_MB * 2**20))
    ranges = S.rank_ranges(plan, world)
    assert len(ranges) == world
    assert ranges[0][0] == 0 and ranges[-1][1] == len(plan.items)
    assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:])) and all(a <= b for a, b in ranges)
    loads = [sum(it.n_bytes for it in plan.items[a:b]) for a, b in ranges]
    biggest = max(it.n_bytes for it in plan.items)
    if world <= len(plan.items):
        assert max(loads) - min(loads) <= 2 * biggest  # near-equal bytes
    else:
        assert loads.count(0) >= world - len(plan.items)  # ranks with nothing to do


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "stats.py", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_cli_writes_default_path(dataset):
    out = dataset / "stats.yaml"
    out.unlink(missing_ok=True)
    r = run_cli(dataset)
    assert r.returncode == 0, r.stderr
    assert S.max_relative_difference(without_loss_weight(yaml.safe_load(out.read_text())),
                                     reference_stats(dataset)) <= 1e-10


@pytest.mark.parametrize("problem", ["missing_dir", "no_train_files", "garbage_file", "truncated_file"])
def test_cli_bad_input_one_line_no_output(tmp_path, problem):
    ds = tmp_path / "ds"
    if problem == "no_train_files":
        (ds / "data" / "train").mkdir(parents=True)
    elif problem != "missing_dir":
        make_dataset(ds, files=[(1, 4), (1, 4)])
        bad = ds / "data" / "train" / "part_1.hdf5"
        if problem == "garbage_file":
            bad.write_bytes(b"this is not HDF5" * 100)
        else:
            bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    out = tmp_path / "out" / "stats.yaml"
    r = run_cli(ds, "--out", out)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    if problem in ("garbage_file", "truncated_file"):
        assert "part_1.hdf5" in lines[0]
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


@pytest.mark.parametrize("norm", ["ZScoreNormalization", "RMSNormalization"])
def test_output_loads_in_the_wells_normalizations(dataset, tmp_path, norm):
    import torch
    from the_well.data import normalization
    from the_well.data.datasets import WellDataset

    S.write_stats_yaml(S.compute_dataset_stats(dataset), dataset / "stats.yaml")
    ds = WellDataset(path=str(dataset), well_split_name="train", use_normalization=True,
                     normalization_type=getattr(normalization, norm), n_steps_input=1, n_steps_output=1)
    raw = WellDataset(path=str(dataset), well_split_name="train", n_steps_input=1, n_steps_output=1)
    sample, raw_sample = ds[0], raw[0]
    stats = yaml.safe_load((dataset / "stats.yaml").read_text())
    # input_fields channels: u, pressure, ramp, velocity_x, velocity_y, stress_xx, stress_xy, stress_yx, stress_yy
    def channels(key):
        return [stats[key]["u"], stats[key]["pressure"], stats[key]["ramp"], *stats[key]["velocity"],
                *np.ravel(stats[key]["stress"])]

    shift, scale = (channels("mean"), channels("std")) if norm == "ZScoreNormalization" else ([0.0] * 9, channels("rms"))
    expected = (raw_sample["input_fields"].double() - torch.tensor(shift)) / torch.tensor(scale)
    # the_well normalizes in float32: near 1e4 one float32 step (~1e-3) is 0.1 of pressure's std
    float32_step = torch.tensor([np.spacing(np.float32(abs(m) + abs(v))) for m, v in zip(shift, scale)])
    atol = 4 * float32_step.double() / torch.tensor(scale) + 1e-5
    assert torch.all((sample["input_fields"].double() - expected).abs() <= atol)
    assert sample["input_fields"].shape[-1] == 9
    assert math.isfinite(float(sample["output_fields"].abs().max()))


def test_dask_version_matches_reference(dataset, tmp_path):
    out = tmp_path / "stats.yaml"
    r = subprocess.run([sys.executable, "solutions/04_distributed_stats/dask_stats.py", str(dataset), "--out", str(out),
                        "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = without_loss_weight(yaml.safe_load(out.read_text()))
    assert S.max_relative_difference(got, reference_stats(dataset)) <= 1e-10



def test_pitfalls_output_is_what_the_readme_shows():
    """exercises/04_distributed_stats/pitfalls.py prints the wrong-vs-right numbers background.md quotes."""
    r = subprocess.run([sys.executable, "exercises/04_distributed_stats/pitfalls.py"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    readme = (ROOT / "exercises" / "04_distributed_stats" / "background.md").read_text()
    shown = readme[readme.index("`.venv/bin/python exercises/04_distributed_stats/pitfalls.py`:"):].split("```\n", 2)[1]
    # float64 E[x^2] - E[x]^2 keeps ~5 digits; which ones depends on torch's summation order on this CPU
    import re

    def stable(text):
        text = re.sub(r"(float64 E\[x\^2\]-E\[x\]\^2: std 0\.0100)\d+", r"\1", text)
        return re.sub(r"(one-pass: )[0-9.e+-]+\)", r"\1...)", text).strip()

    assert stable(r.stdout) == stable(shown)


@pytest.mark.parametrize("script", ["stats.py", pytest.param("solutions/04_distributed_stats/stats.py",
                                                               marks=pytest.mark.slow)])  # torch import x3
def test_bad_paths_are_one_line_before_any_reading(dataset, tmp_path, script):
    """--out naming a folder, or a file given as the dataset folder: one line, exit 2, nothing written."""
    for args, words in [([dataset, "--out", tmp_path], "is a folder"),
                        ([ROOT / "README.md"], "dataset folder " + str(ROOT / "README.md") + " is a file, not a folder"),
                        ([dataset, "--out", ROOT / "README.md" / "stats.yaml"], "is a file, not a folder")]:
        r = subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_compare_says_equal_bitwise_or_not(tmp_path, capsys):
    """`python -m wellfno.stats compare` (exercise 04, task 5): the verdict and the exit status."""
    a, b, c = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    a.write_text("u:\n  mean: 1.0\n  std: 2.0\n")
    b.write_text("u:\n  mean: 1.0000000000001\n  std: 2.0\n")   # 1e-13 relative: equal, not bitwise
    c.write_text("u:\n  mean: 1.001\n  std: 2.0\n")
    assert S.compare_main(["compare", str(a), str(a)]) == 0
    assert "equal; bitwise identical: yes" in capsys.readouterr().out
    assert S.compare_main(["compare", str(a), str(b)]) == 0
    assert "equal; bitwise identical: no" in capsys.readouterr().out
    assert S.compare_main(["compare", str(a), str(c)]) == 1
    assert "NOT equal" in capsys.readouterr().out
    with pytest.raises(UserError, match="does not exist"):
        S.compare_main(["compare", str(a), str(tmp_path / "missing.yaml")])
