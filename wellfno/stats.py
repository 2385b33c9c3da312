"""Exact dataset statistics of a Well dataset, streamed, in float64, mergeable across ranks.

`stats.yaml` holds, per field (per component for vector and tensor fields), the
population `mean`, `std` and `rms` over trajectories x time x space, and the
same for one-step differences x[t+1] - x[t] within each trajectory
(`mean_delta`, `std_delta`, `rms_delta`, time-varying fields only): the_well's
definitions, read by its ZScoreNormalization and RMSNormalization. We add
`loss_weight` (see `loss_weights`).

How it is computed, and why:
- The train split is cut into *work items* (file, trajectory, time chunk) whose
  size depends only on the data and `chunk_bytes`, never on the number of
  ranks. An item reads its frames plus the frame before (one frame of overlap),
  so the delta (t-1 -> t) is counted by the item that holds t: exactly once,
  also across chunk and rank boundaries. Memory stays bounded by one chunk.
- Each item reduces to float64 (count, mean, M2) per channel, never through
  E[x^2] - E[x]^2 of raw values: values are shifted by a number near their mean first
  (`ItemReader._accumulate`, `wellfno.moments.shifted_moments`).
- Items are merged along the fixed binary tree of `wellfno.moments` (Chan et al.'s pairwise
  formula), so the result is bitwise identical for any number of ranks and any split of the
  items into contiguous ranges, and equal to the serial result.

The moment arithmetic lives in `wellfno.moments` (no I/O); this module plans, reads and writes.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import h5py
import numpy as np
import yaml
from threadpoolctl import threadpool_limits

from wellfno.cli import UserError, atomic_write_text
from wellfno.moments import (PairwiseReducer, combine_blocks, empty_moments, merge_scalar,
                             shifted_moments)
from wellfno.wellformat import split_files

# Bytes of one field read at a time (per work item); bounds memory at a few times this.
CHUNK_BYTES = 8 * 2**20
# the_well's normalizers clip standard deviations at this value (their `min_denom`).
MIN_STD = 1e-4
# float64 elements converted at a time (1 MiB): the working set of a block stays in cache.
BLOCK_ELEMENTS = 2**17
STAT_KEYS = ("mean", "std", "rms")


@dataclass(frozen=True)
class FieldSpec:
    name: str
    order: int  # 0 scalar (t0_fields), 1 vector (t1_fields), 2 tensor (t2_fields)
    n_components: int  # n_spatial_dims ** order
    time_varying: bool
    sample_varying: bool

    @property
    def h5path(self) -> str:
        return f"t{self.order}_fields/{self.name}"


@dataclass(frozen=True)
class WorkItem:
    file_index: int
    trajectory: int
    t_start: int  # values of frames [t_start, t_stop); deltas (t-1 -> t) for t in [max(t_start, 1), t_stop)
    t_stop: int
    n_bytes: int  # bytes this item reads, to balance ranks
    with_constant_fields: bool  # time-constant fields are counted by the first item of each trajectory
    with_shared_fields: bool  # fields without a trajectory axis are counted by the first item of each file


@dataclass(frozen=True)
class Plan:
    files: tuple[Path, ...]
    fields: tuple[FieldSpec, ...]
    items: tuple[WorkItem, ...]
    value_slices: dict  # field name -> slice of its value channels in a moments array
    delta_slices: dict  # field name -> slice of its delta channels (time-varying fields only)
    n_channels: int
    n_spatial_dims: int


# --------------------------------------------------------------------------- planning
def find_split_files(dataset_dir: str | Path, split: str = "train") -> list[Path]:
    dataset_dir = Path(dataset_dir)
    if not dataset_dir.is_dir():
        what = "is a file, not a folder" if dataset_dir.exists() else "does not exist"
        raise UserError(f"dataset folder {dataset_dir} {what}; pass the folder that holds data/{split}/")
    split_dir = dataset_dir / "data" / split
    files = split_files(dataset_dir, split)
    if not files:
        hint = ""
        if list(dataset_dir.glob("*.hdf5")) or list(dataset_dir.glob("*.h5")):
            hint = f" ({dataset_dir} itself holds HDF5 files: pass the dataset folder, two levels up)"
        raise UserError(f"no {split} files (*.hdf5, *.h5) in {split_dir}{hint}; "
                        f"generate or download the dataset first")
    return files


def _names(attr) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in np.atleast_1d(attr)]


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise UserError(f"cannot read {path}: not a valid HDF5 file ({str(err).splitlines()[0]}); "
                        f"delete it and generate or download it again") from None


def _file_layout(path: Path) -> tuple[tuple[FieldSpec, ...], dict[str, tuple[tuple[int, ...], int]], int]:
    """(field specs, {field: (shape, itemsize)}, n_spatial_dims) of one file, with the checks the_well's reader relies on."""
    with _open(path) as f:
        try:
            n_dims = int(f.attrs["n_spatial_dims"])
            specs, shapes = [], {}
            for order in range(3):
                group = f.get(f"t{order}_fields")
                if group is None:
                    continue
                for name in _names(group.attrs.get("field_names", [])):
                    dset = group[name]
                    spec = FieldSpec(name, order, n_dims**order, bool(dset.attrs["time_varying"]),
                                     bool(dset.attrs.get("sample_varying", True)))
                    lead = int(spec.sample_varying) + int(spec.time_varying)
                    if dset.ndim < lead + order or (order and dset.shape[dset.ndim - order:] != (n_dims,) * order):
                        raise UserError(f"{path}: field {spec.h5path} has shape {dset.shape}, which does not fit "
                                        f"{'a time-varying' if spec.time_varying else 'a time-constant'} "
                                        f"order-{order} field in {n_dims} dimensions")
                    specs.append(spec)
                    shapes[name] = (dset.shape, dset.dtype.itemsize)
        except KeyError as err:
            raise UserError(f"{path} is not in The Well's format (missing {err}); "
                            f"delete it and generate or download it again") from None
    return tuple(specs), shapes, n_dims


def plan_dataset(dataset_dir: str | Path, split: str = "train", chunk_bytes: int = CHUNK_BYTES) -> Plan:
    """Check every file of the split and cut it into work items (independent of any rank count)."""
    if chunk_bytes < 1:
        raise UserError(f"the chunk size must be positive (got {chunk_bytes} bytes): use --chunk-mb 8, say")
    files = find_split_files(dataset_dir, split)
    fields, items = None, []
    for file_index, path in enumerate(files):
        specs, shapes, n_dims = _file_layout(path)
        if not specs:
            raise UserError(f"{path} holds no fields in t0_fields/, t1_fields/ or t2_fields/")
        if fields is None:
            fields = specs
        elif specs != fields:
            raise UserError(f"{path} has fields {[s.name for s in specs]} but {files[0]} has "
                            f"{[s.name for s in fields]}: all files of a split must have the same fields")
        varying = [s for s in specs if s.time_varying and s.sample_varying]
        n_traj = {shapes[s.name][0][0] for s in specs if s.sample_varying}
        n_time = {shapes[s.name][0][1] for s in varying}
        if len(n_traj) > 1 or len(n_time) > 1:
            raise UserError(f"{path}: fields disagree on the number of trajectories or time steps")
        n_traj = n_traj.pop() if n_traj else 1
        n_time = n_time.pop() if n_time else 1

        def frame_bytes(s: FieldSpec) -> int:
            shape, itemsize = shapes[s.name]
            return int(np.prod(shape[int(s.sample_varying) + int(s.time_varying):])) * itemsize

        per_frame = sum(frame_bytes(s) for s in varying)
        largest = max((frame_bytes(s) for s in varying), default=1)
        frames = max(1, chunk_bytes // max(largest, 1))
        constant_bytes = sum(frame_bytes(s) for s in specs if s.sample_varying and not s.time_varying)
        shared_bytes = sum(frame_bytes(s) for s in specs if not s.sample_varying)
        for traj in range(n_traj):
            for t_start in range(0, n_time, frames):
                t_stop = min(n_time, t_start + frames)
                first = t_start == 0
                n_bytes = (t_stop - t_start + (not first)) * per_frame
                n_bytes += constant_bytes * first + shared_bytes * (first and traj == 0)
                items.append(WorkItem(file_index, traj, t_start, t_stop, n_bytes, first, first and traj == 0))
    value_slices, delta_slices, c = {}, {}, 0
    for s in fields:
        value_slices[s.name] = slice(c, c + s.n_components)
        c += s.n_components
    for s in fields:
        if s.time_varying:
            delta_slices[s.name] = slice(c, c + s.n_components)
            c += s.n_components
    return Plan(tuple(files), fields, tuple(items), value_slices, delta_slices, c, n_dims)


def rank_ranges(plan: Plan, world_size: int) -> list[tuple[int, int]]:
    """Contiguous item ranges with near-equal bytes: item i goes to the rank its byte midpoint falls in.

    Every item belongs to exactly one rank, whatever the world size; no padding, ranks may be empty.
    """
    sizes = np.array([it.n_bytes for it in plan.items], dtype=np.float64)
    total = sizes.sum()
    if total == 0:
        owner = np.zeros(len(sizes), dtype=np.int64)
    else:
        midpoints = np.cumsum(sizes) - sizes / 2
        owner = np.minimum((midpoints * world_size / total).astype(np.int64), world_size - 1)
    bounds = np.searchsorted(owner, np.arange(world_size + 1), side="left")
    return [(int(bounds[r]), int(bounds[r + 1])) for r in range(world_size)]


def plan_fingerprint(plan: Plan) -> list[int]:
    """Three integers that differ when two processes see different files, items or fields.

    Every rank plans on its own; node-local copies of a dataset can differ. Ranks compare
    these (`wellfno.watchdog.check_same_on_every_rank`) before merging.
    """
    text = repr([p.name for p in plan.files]) + repr(plan.items) + repr(plan.fields)
    return [len(plan.items), plan.n_channels, zlib.crc32(text.encode())]


# --------------------------------------------------------------------------- reading
class ItemReader:
    """Computes one work item's moments; keeps one HDF5 file open at a time (items come in file order)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._file_index, self._file = None, None
        self._current = 0  # file index of the item being read (for error messages)
        self._scratch = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file_index, self._file = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h5(self, file_index: int) -> h5py.File:
        if self._file_index != file_index:
            self.close()
            self._file = _open(self.plan.files[file_index])
            self._file_index = file_index
        return self._file

    def _read(self, spec: FieldSpec, index: tuple) -> np.ndarray:
        dset = self._h5(self._current)[spec.h5path]
        try:
            return dset[index]
        except (OSError, ValueError) as err:
            raise UserError(f"cannot read {spec.h5path} from {self.plan.files[self._current]} "
                            f"({str(err).splitlines()[0]}); the file is damaged: generate or download it again") from None

    def moments(self, item: WorkItem) -> np.ndarray:
        self._current = item.file_index
        out = empty_moments(self.plan.n_channels)
        for spec in self.plan.fields:
            index = (item.trajectory,) if spec.sample_varying else ()
            if spec.time_varying and spec.sample_varying:
                first = max(item.t_start - 1, 0)  # one frame of overlap for the delta into t_start
                x = self._read(spec, index + (slice(first, item.t_stop),))
                skip = item.t_start - first  # the overlap frame's values belong to the previous item
            elif not spec.sample_varying and not item.with_shared_fields:
                continue
            elif spec.sample_varying and not item.with_constant_fields:
                continue
            else:
                x = self._read(spec, index)
                if spec.time_varying:  # shared across trajectories but time-varying: rare; whole series at once
                    skip = 0
                else:
                    x, skip = x[np.newaxis], 0  # one "frame"; no deltas
            self._accumulate(spec, x, skip, out)
        return out

    def _buffers(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._scratch is None or self._scratch[0].size < n:
            self._scratch = (np.empty(n), np.empty(n), np.empty(n))
        return self._scratch

    def _accumulate(self, spec: FieldSpec, x: np.ndarray, skip: int, out: np.ndarray) -> None:
        """Moments of x[skip:] and of x[1:] - x[:-1], per component, into `out`.

        A block of frames at a time is converted to float64 *and shifted* by a float32
        number near the data (the first frame's mean, rounded to float32) in one pass,
        into buffers that stay in cache and are reused. Shifting by a float32 number keeps
        float32 data exact, so differences of shifted values are the exact deltas. The
        previous block's last frame is carried for the first delta of the next block.
        """
        n_frames, k = x.shape[0], spec.n_components
        frames = x.reshape(n_frames, -1, k)
        points = frames.shape[1]
        per_block = max(1, BLOCK_ELEMENTS // points)
        values, deltas, scratch = self._buffers((per_block + 1) * points)
        vs, ds = self.plan.value_slices[spec.name], self.plan.delta_slices.get(spec.name)
        for c in range(k):
            shift = np.float64(np.float32(frames[skip if skip < n_frames else 0, :, c].mean(dtype=np.float64)))
            if not np.isfinite(shift):
                shift = np.float64(0.0)
            value_m = delta_m = (0.0, 0.0, 0.0)
            for f0 in range(0, n_frames, per_block):
                f1 = min(n_frames, f0 + per_block)
                block = values[points:(f1 - f0 + 1) * points]  # values[:points] holds frame f0 - 1
                np.subtract(frames[f0:f1, :, c], shift, out=block.reshape(f1 - f0, points))
                counted = block[max(skip - f0, 0) * points:]
                n, mean, m2 = shifted_moments(counted, scratch)
                value_m = merge_scalar(value_m, (n, mean + float(shift), m2))
                if ds is not None:
                    if f0 == 0:
                        d = np.subtract(block[points:], block[:-points], out=deltas[:block.size - points])
                    else:
                        d = np.subtract(block, values[:block.size], out=deltas[:block.size])
                    delta_m = merge_scalar(delta_m, shifted_moments(d, scratch))
                values[:points] = block[-points:]
            out[:, vs.start + c] = value_m
            if ds is not None:
                out[:, ds.start + c] = delta_m


def reduce_range(plan: Plan, start: int, stop: int, before_item: Callable[[], object] | None = None) -> PairwiseReducer:
    """Moments of items [start, stop), reduced to aligned blocks of the fixed merge tree.

    `before_item()` is called before each item: a distributed caller passes its watchdog's
    `step`, which counts progress and raises when another rank failed.
    """
    reducer = PairwiseReducer()
    # One BLAS thread: a multithreaded BLAS spin-waits on a busy node and runs 50x slower,
    # and under torchrun/srun every core already has its rank.
    with threadpool_limits(1, user_api="blas"), ItemReader(plan) as reader:
        for i in range(start, stop):
            if before_item is not None:
                before_item()
            reducer.push(i, reader.moments(plan.items[i]))
    return reducer


# --------------------------------------------------------------------------- results
def _shape_like(spec: FieldSpec, values: np.ndarray, n_dims: int):
    values = [float(v) for v in values]
    if spec.order == 0:
        return values[0]
    if spec.order == 1:
        return values
    return [values[i * n_dims:(i + 1) * n_dims] for i in range(n_dims)]


def loss_weights(std_delta: np.ndarray) -> np.ndarray:
    """Per-channel loss weights: proportional to 1 / std_delta**2, mean 1 over all time-varying channels.

    A squared error in physical units divided by the channel's typical one-step change
    squared makes every channel's error equally important, whatever its units.
    std_delta is clipped at MIN_STD like the_well's normalizers do, so a channel that never
    changes gets a large but finite weight.
    """
    inv = 1.0 / np.maximum(std_delta, MIN_STD) ** 2
    return inv / inv.mean()


def stats_from_moments(plan: Plan, total: np.ndarray) -> dict:
    """(count, mean, M2) per channel -> the_well's stats.yaml dictionary (+ loss_weight)."""
    n, mean, m2 = total
    if np.any(n == 0):
        empty = [s.name for s in plan.fields
                 if np.any(n[plan.value_slices[s.name]] == 0)
                 or (s.name in plan.delta_slices and np.any(n[plan.delta_slices[s.name]] == 0))]
        raise UserError(f"fields {empty} have no values (or no time differences: a single time step); "
                        f"cannot compute their statistics")
    var = m2 / n
    per_channel = {"mean": mean, "std": np.sqrt(var), "rms": np.sqrt(var + mean * mean)}
    n_dims = plan.n_spatial_dims
    varying = [s for s in plan.fields if s.name in plan.delta_slices]
    out = {}
    for key, values in per_channel.items():
        out[key] = {s.name: _shape_like(s, values[plan.value_slices[s.name]], n_dims) for s in plan.fields}
    for key, values in per_channel.items():
        out[f"{key}_delta"] = {s.name: _shape_like(s, values[plan.delta_slices[s.name]], n_dims) for s in varying}
    if varying:
        std_delta = np.concatenate([per_channel["std"][plan.delta_slices[s.name]] for s in varying])
        weights, c = loss_weights(std_delta), 0
        out["loss_weight"] = {}
        for s in varying:
            out["loss_weight"][s.name] = _shape_like(s, weights[c:c + s.n_components], n_dims)
            c += s.n_components
    return out


def compute_dataset_stats(dataset_dir: str | Path, split: str = "train", chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Statistics of one split of a Well dataset (the folder that holds data/<split>/), serially."""
    plan = plan_dataset(dataset_dir, split, chunk_bytes)
    reducer = reduce_range(plan, 0, len(plan.items))
    total = combine_blocks(reducer.as_dict(), len(plan.items), plan.n_channels)
    return stats_from_moments(plan, total)


class _StatsDumper(yaml.SafeDumper):
    """Block style for the key -> field maps (as the_well's files), one line per component list."""


_StatsDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


def format_stats_yaml(stats: dict) -> str:
    # PyYAML writes floats with repr(): the shortest string that reads back to the same float64.
    return yaml.dump(stats, Dumper=_StatsDumper, sort_keys=False, default_flow_style=False, width=1000)


def stats_output(out: str | Path | None, dataset_dir: str | Path) -> Path:
    """Where stats.yaml goes (default: in the dataset folder), checked before hours of reading."""
    if out is None:  # the dataset folder: plan_dataset says what is wrong with it
        return Path(dataset_dir) / "stats.yaml"
    path = Path(out)
    if path.is_dir():
        raise UserError(f"--out {path} is a folder: give a file name, e.g. {path / 'stats.yaml'}")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"--out {path}: {parent} is a file, not a folder")
    return path


def write_stats_yaml(stats: dict, path: str | Path) -> Path:
    """Write stats.yaml at full precision, atomically (nothing partial if interrupted)."""
    return atomic_write_text(stats_output(path, "."), format_stats_yaml(stats))


def flatten_stats(stats: dict) -> Iterator[tuple[str, str, float]]:
    """(key, field[component], value) for every number in a stats dict: for comparisons in tests."""
    for key, fields in stats.items():
        for name, value in fields.items():
            for idx, v in np.ndenumerate(np.asarray(value, dtype=np.float64)):
                yield key, f"{name}{list(idx) if idx else ''}", float(v)


def max_relative_difference(a: dict, b: dict) -> float:
    """Largest |a - b| / max(|b|, tiny) over matching numbers; the key sets must be equal."""
    fa = {(k, f): v for k, f, v in flatten_stats(a)}
    fb = {(k, f): v for k, f, v in flatten_stats(b)}
    if fa.keys() != fb.keys():
        raise ValueError(f"the two statistics differ in keys or fields: {sorted(fa.keys() ^ fb.keys())}")
    return max((abs(fa[key] - fb[key]) / max(abs(fb[key]), 1e-300) for key in fa), default=0.0)


# --------------------------------------------------------------------------- benchmark results
def benchmark_markdown(data: dict) -> str:
    """Exercise 04's benchmark table (solutions/04_distributed_stats/benchmark.py's results) as Markdown."""
    lines = [f"Train split {data['dataset']['gigabytes']:.2f} GB ({data['dataset']['items']} items, "
             f"{data['dataset']['files']} files); load average {data['load_average_at_start']:.1f} at the start, "
             f"{data['load_average_at_end']:.1f} at the end.", "",
             "| what | script s | wall s | GB/s | vs raw read | scaling eff. |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        eff = f"{r['scaling_efficiency']:.2f}" if "scaling_efficiency" in r else ""
        lines.append(f"| {r['name']} | {r['seconds']:.2f} | {r['wall_seconds']:.2f} | {r['gb_per_s']:.2f} "
                     f"| {r['vs_raw_read']:.2f} | {eff} |")
    lines += ["", "Max relative difference vs serial: "
              + ", ".join(f"{k} {v:.1e}" for k, v in data["max_rel_diff_vs_serial"].items())
              + "; bitwise identical to serial: "
              + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in data["bitwise_identical_to_serial"].items()) + "."]
    return "\n".join(lines)


__all__ = [
    "compute_dataset_stats", "write_stats_yaml", "format_stats_yaml", "plan_dataset", "rank_ranges",
    "plan_fingerprint", "reduce_range", "stats_from_moments", "stats_output", "ItemReader", "max_relative_difference",
    "loss_weights", "find_split_files", "CHUNK_BYTES",
]


def compare_main(argv: list[str] | None = None) -> int:
    """`python -m wellfno.stats compare A.yaml B.yaml [--allowed R]`: exit 1 when they differ by more.

    Exercise 04's comparison of a distributed stats.yaml with the serial one: the largest
    relative difference of any statistic, and whether the files are bitwise identical.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m wellfno.stats compare",
                                     description=compare_main.__doc__)
    parser.add_argument("command", choices=["compare"])
    parser.add_argument("reference", type=Path, help="e.g. the serial stats.yaml")
    parser.add_argument("other", type=Path, help="e.g. the distributed stats.yaml")
    parser.add_argument("--allowed", type=float, default=1e-10,
                        help="largest relative difference that counts as equal (default: 1e-10)")
    args = parser.parse_args(argv)
    loaded = []
    for path in (args.reference, args.other):
        if not path.is_file():
            raise UserError(f"{path} does not exist: run the command that writes it first")
        loaded.append(yaml.safe_load(path.read_text()))
    try:
        difference = max_relative_difference(*loaded)
    except (ValueError, TypeError, AttributeError) as err:  # not two stats.yaml of one dataset
        raise UserError(f"{args.other} and {args.reference} are not statistics of the same fields: "
                        f"{str(err)[:200]}") from None
    bitwise = args.reference.read_bytes() == args.other.read_bytes()
    verdict = "equal" if difference <= args.allowed else "NOT equal"
    print(f"{args.other} vs {args.reference}: max relative difference {difference:.1e} "
          f"(allowed {args.allowed:.0e}): {verdict}; "
          f"bitwise identical: {'yes' if bitwise else 'no'}")
    return 0 if difference <= args.allowed else 1


if __name__ == "__main__":
    from wellfno.cli import run_main

    run_main(compare_main)
