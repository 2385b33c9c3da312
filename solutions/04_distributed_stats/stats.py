"""Dataset statistics with torch.distributed: the same stats.yaml as the serial stats.py, N times faster.

    torchrun --nproc_per_node=N solutions/04_distributed_stats/stats.py DATASET_DIR [--out FILE]
    srun --ntasks=N python solutions/04_distributed_stats/stats.py DATASET_DIR [--out FILE]
    python solutions/04_distributed_stats/stats.py DATASET_DIR          # one process

What changes from the serial script, and why:
- Work split: every rank plans the same list of work items (file, trajectory,
  time chunk; `wellfno.stats.plan_dataset`) and takes a contiguous range with
  near-equal bytes. Each item belongs to exactly one rank for any world size:
  no padding, no duplicates, no dropped samples; a rank may get nothing.
- Reduction: a rank reduces its items to aligned blocks of a fixed merge tree,
  at most 128 rows of float64 (count, mean, M2) per channel - a fixed-size
  tensor, however much data it read. One all_gather, then every block goes
  back into the same tree the serial script builds: the result is bitwise
  identical to the serial one, for any number of ranks.
- Failures: a rank that fails posts its error in the process group's key-value
  store; the others poll it between items and stop. A rank that dies without a
  word stops the shared progress counter: when it has not moved for --timeout
  seconds, every rank gives up. Collectives use the same timeout. Rank 0 writes
  stats.yaml atomically, only when every rank succeeded.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path


import torch
import torch.distributed as dist

from wellfno.cli import UserError, run_main
from wellfno.stats import (CHUNK_BYTES, combine_blocks, pack_blocks, plan_dataset, rank_ranges,
                           reduce_range, stats_from_moments, unpack_blocks, write_stats_yaml)

FAILED_KEY = "wellfno_stats/failed"
DONE_KEY = "wellfno_stats/done"
PROGRESS_KEY = "wellfno_stats/progress"


# --------------------------------------------------------------------------- launch environment
def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[07-09,12],cpu1' -> 'gpu07'; 'r[1-2]-n[04-05]' -> 'r1-n04'."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first entry ends at the first comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    # in every bracket group keep the first range's start
    return re.sub(r"\[([^\]\-,]+)[^\]]*\]", r"\1", nodelist[:end])


def master_address_from_slurm() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise UserError("SLURM_PROCID is set but SLURM_JOB_NODELIST is not: launch with srun inside a job")
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.split()
            if out:
                return out[0]
        except (subprocess.SubprocessError, OSError):
            pass  # fall back to parsing the list ourselves
    return first_host(nodelist)


def launch_environment() -> tuple[int, int, int, str]:
    """(rank, world size, local rank, launcher) from torchrun's or srun's variables; exports env:// ones."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun (also under srun: torchrun's variables win)
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "torchrun"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank = int(env.get("SLURM_LOCALID", 0))
        if world > 1:
            env.setdefault("MASTER_ADDR", master_address_from_slurm())
            # one port per job, so two jobs sharing a node do not meet
            env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", 0)) % 20000))
            env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = str(rank), str(world), str(local_rank)
        return rank, world, local_rank, "srun"
    return 0, 1, 0, "single process"


def pick_backend(requested: str, local_rank: int) -> tuple[str, torch.device]:
    if requested == "auto":
        requested = "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "gloo":
        return "gloo", torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("--backend nccl needs a GPU, and torch sees none; use --backend gloo")
    n_gpus = torch.cuda.device_count()
    # device = LOCAL rank: rank r on cuda:r breaks on the second node. With one GPU bound
    # per task (srun --gpus-per-task=1) each task sees a single device, cuda:0.
    index = 0 if n_gpus == 1 else local_rank
    if index >= n_gpus:
        raise UserError(f"local rank {local_rank} but only {n_gpus} GPUs on this node: "
                        f"start at most one rank per GPU, or use --backend gloo")
    torch.cuda.set_device(index)
    return "nccl", torch.device("cuda", index)  # nccl/rccl: ROCm torch reports as cuda


# --------------------------------------------------------------------------- failure protocol
class PeerFailed(Exception):
    pass


class Watchdog:
    """Failure and liveness signals through the process group's store (no collectives, so no hang)."""

    def __init__(self, world: int, timeout: float, poll_s: float = 0.2):
        self.store = dist.distributed_c10d._get_default_store() if world > 1 else None
        self.world, self.timeout, self.poll_s = world, timeout, poll_s

    def fail(self, rank: int, message: str) -> None:
        if self.store is not None:
            try:
                self.store.set(FAILED_KEY, f"rank {rank}: {message}")
            except Exception:  # noqa: BLE001 - the store host may be gone; the others time out
                pass

    def peer_failure(self) -> str | None:
        if self.store is not None and self.store.check([FAILED_KEY]):
            return self.store.get(FAILED_KEY).decode()
        return None

    def item_done(self) -> bool:
        """Called between items: count progress; True tells the rank to stop."""
        if self.store is None:
            return False
        self.store.add(PROGRESS_KEY, 1)
        return self.store.check([FAILED_KEY])

    def wait_for_all(self) -> None:
        """Return when every rank finished its share; raise when one failed or progress stalls."""
        if self.store is None:
            return
        self.store.add(DONE_KEY, 1)
        last, since = None, time.monotonic()
        while True:
            failure = self.peer_failure()
            if failure:
                raise PeerFailed(failure)
            if self.store.add(DONE_KEY, 0) >= self.world:
                return
            progress = self.store.add(PROGRESS_KEY, 0)
            if progress != last:
                last, since = progress, time.monotonic()
            elif time.monotonic() - since > self.timeout:
                raise PeerFailed(f"no rank made progress for {self.timeout:.0f} s: a rank died or hangs")
            time.sleep(self.poll_s)


# --------------------------------------------------------------------------- main
def plan_fingerprint(plan) -> list[int]:
    """Every rank must see the same files and items (node-local copies can differ)."""
    text = repr([p.name for p in plan.files]) + repr(plan.items) + repr(plan.fields)
    return [len(plan.items), plan.n_channels, zlib.crc32(text.encode())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset_dir", type=Path, help="folder that holds data/train/")
    parser.add_argument("--out", type=Path, help="output file (default: DATASET_DIR/stats.yaml)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--chunk-mb", type=float, default=CHUNK_BYTES / 2**20,
                        help="MiB of one field read at a time (default: %(default)s); same as stats.py's")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: nccl when torch sees a GPU, else gloo")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds without progress (or in one collective) before every rank gives up")
    args = parser.parse_args()

    rank, world, local_rank, launcher = launch_environment()
    backend, device = pick_backend(args.backend, local_rank) if world > 1 else ("none", torch.device("cpu"))
    if world > 1:
        try:
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=args.timeout))
        except Exception as err:  # noqa: BLE001 - e.g. a peer never arrived
            raise UserError(f"rank {rank}: cannot join the process group ({err.__class__.__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})") from None
    watchdog = Watchdog(world, args.timeout)
    try:
        return run(args, rank, world, device, watchdog, launcher)
    except PeerFailed as err:
        if rank == 0:
            print(f"error: stopped, nothing written: {err}", file=sys.stderr)
        return 1
    except UserError as err:
        watchdog.fail(rank, str(err))
        raise
    except BaseException as err:
        watchdog.fail(rank, f"{err.__class__.__name__}: {err}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(args, rank: int, world: int, device: torch.device, watchdog: Watchdog, launcher: str) -> int:
    started = time.perf_counter()
    plan = plan_dataset(args.dataset_dir, args.split, int(args.chunk_mb * 2**20))
    start, stop = rank_ranges(plan, world)[rank]
    reducer = reduce_range(plan, start, stop, should_stop=watchdog.item_done)
    failure = watchdog.peer_failure()
    if failure:
        raise PeerFailed(failure)
    watchdog.wait_for_all()
    computed = time.perf_counter()

    # from here every rank is alive and done: the collectives below are short
    packed = torch.from_numpy(pack_blocks(reducer.as_dict(), plan.n_channels)).to(device)
    fingerprint = torch.tensor(plan_fingerprint(plan), dtype=torch.int64, device=device)
    if world > 1:
        prints = [torch.empty_like(fingerprint) for _ in range(world)]
        dist.all_gather(prints, fingerprint)
        if any(not torch.equal(p, prints[0]) for p in prints):
            raise UserError("ranks see different files or items (node-local copies of the dataset differ?); "
                            "point every rank at the same dataset")
        gathered = [torch.empty_like(packed) for _ in range(world)]
        dist.all_gather(gathered, packed)
    else:
        gathered = [packed]

    ok = torch.ones(1, dtype=torch.int64, device=device)
    out = args.out or args.dataset_dir / "stats.yaml"
    if rank == 0:
        try:
            blocks = {}
            for rank_packed in gathered:  # rank order; blocks are disjoint, so the order does not matter
                for key, moments in unpack_blocks(rank_packed.cpu().numpy(), plan.n_channels).items():
                    if key in blocks:
                        raise RuntimeError(f"block {key} came from two ranks: an item was counted twice")
                    blocks[key] = moments
            stats = stats_from_moments(plan, combine_blocks(blocks, len(plan.items), plan.n_channels))
            write_stats_yaml(stats, out)
        except BaseException:
            ok.zero_()
            if world > 1:
                dist.broadcast(ok, src=0)  # let the others exit non-zero too
            raise
    if world > 1:
        dist.broadcast(ok, src=0)
    if not ok.item():
        raise PeerFailed("rank 0 could not write the statistics")
    if rank == 0:
        n_bytes = sum(item.n_bytes for item in plan.items)
        elapsed = time.perf_counter() - started
        print(f"wrote {out}: {len(plan.items)} items, {n_bytes / 1e9:.3f} GB, {world} rank(s) ({launcher}, "
              f"{device.type}), {elapsed:.2f} s ({computed - started:.2f} s reading), "
              f"{n_bytes / 1e9 / max(elapsed, 1e-9):.2f} GB/s")
    return 0


if __name__ == "__main__":
    run_main(main)
