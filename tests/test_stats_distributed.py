"""Exercise 04: the distributed statistics equal the serial ones for any world size and launcher.

Check your own script (it must take DATASET_DIR --out FILE and run under torchrun and srun):

    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script YOUR_FILE
    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script YOUR_FILE -k split   # task 3
    .venv/bin/python -m pytest -q tests/test_stats_distributed.py --script YOUR_FILE -k merge   # task 4

(`STATS_SCRIPT=path` in the environment does the same.) The first checks import your file and
call its `split_items` and `chan_merge` (the reference solution: the wellfno helpers it uses);
the others launch real process groups (gloo on loopback): torchrun and srun-style SLURM_*
variables with 1-4 ranks, two torchrun agents as two "nodes", and ranks that fail. Every
multi-rank run also logs how much each rank read, to check that the work was split, not repeated.
Every failure is one sentence naming the task of exercises/04_distributed_stats/README.md.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import wellfno.stats as S
from tests.checks import last_error_line, require, require_run, task
from tests.conftest import import_script, pythonpath_with
from tests.test_stats import TINY_CHUNK_MB, make_dataset, reference_stats, without_loss_weight

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "04_distributed_stats" / "stats.py"
SCRIPT = Path(os.environ.get("STATS_SCRIPT", SOLUTION)).resolve()
IS_SOLUTION = SCRIPT == SOLUTION.resolve()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# The reference solution accepts --chunk-mb (several items per trajectory here); a participant's may not.
CHUNK_ARGS = ["--chunk-mb", str(TINY_CHUNK_MB)] if IS_SOLUTION else []
TIMEOUT = 120
# Every test that starts real processes is slow (one torch import each: 10-40 s on 2 busy cores).

STARTER = ROOT / "exercises" / "04_distributed_stats" / "stats_parallel.py"

# Watch the script under test without touching it: Python imports sitecustomize from
# PYTHONPATH at startup, in every rank. It can make one rank's field reads fail or kill the
# rank (STATS_FAIL_MODE=raise|die, STATS_FAIL_RANK), log how many values each rank read
# (STATS_READ_LOG=dir), and make torch claim GPUs (STATS_FAKE_GPUS=n: `--backend auto` must
# still choose gloo, since the statistics are CPU work).
SITECUSTOMIZE = '''
import os
try:  # the suite's garbage collector thresholds (tests/startup): this file stands in for that one
    import suite_gc

    suite_gc.apply()
except ImportError:
    pass
_rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
_mode = os.environ.get("STATS_FAIL_MODE")
_log = os.environ.get("STATS_READ_LOG")
if os.environ.get("STATS_FAKE_GPUS"):
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: int(os.environ["STATS_FAKE_GPUS"])
if _log or (_mode and _rank == os.environ.get("STATS_FAIL_RANK")):
    import atexit, h5py
    _read = h5py.Dataset.__getitem__
    _values = [0]
    def _watched(self, index):
        if "_fields/" in self.name and _mode and _rank == os.environ.get("STATS_FAIL_RANK"):
            if _mode == "die":
                os._exit(9)  # like a node lost or the OOM killer: no message, no cleanup
            raise OSError("injected read error")
        out = _read(self, index)
        if "_fields/" in self.name:
            _values[0] += getattr(out, "size", 1)
        return out
    h5py.Dataset.__getitem__ = _watched
    if _log:
        def _write_log():
            with open(os.path.join(_log, f"rank{_rank}.txt"), "w") as f:
                f.write(str(_values[0]))
        atexit.register(_write_log)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC",
                                "STATS_FAIL", "STATS_READ", "STATS_FAKE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR", **extra)
    return env


@pytest.fixture(scope="module")
def inject_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inject")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def count_values(dataset: Path) -> int:
    """Numbers in the train split's fields (what one pass over the data reads)."""
    sizes = []
    for path in (dataset / "data" / "train").glob("*.hdf5"):
        with h5py.File(path) as f:
            f.visititems(lambda name, obj: sizes.append(obj.size)
                         if isinstance(obj, h5py.Dataset) and "_fields/" in name else None)
    return sum(sizes)


def read_per_rank(log_dir: Path, world: int) -> list[int]:
    files = [log_dir / f"rank{r}.txt" for r in range(world)]
    require(all(f.is_file() for f in files), f"some of the {world} ranks wrote no read log: did every "
            f"rank finish normally? {task('04', 5)}")
    return [int(f.read_text()) for f in files]


def check_split(log_dir: Path, world: int, dataset: Path) -> None:
    """The work was split: together the ranks read the split about once, not world times."""
    reads, total = read_per_rank(log_dir, world), count_values(dataset)
    # one frame of overlap per work item is re-read (the delta into the item's first frame)
    require(sum(reads) <= 1.5 * total,
            f"the {world} ranks together read {sum(reads) / total:.1f} times the split's values (allowed "
            f"1.5): every rank reads everything; give each rank only its share in split_items "
            f"{task('04', 3)}")
    require(max(reads) <= 0.75 * total,
            f"one of {world} ranks read {max(reads) / total:.0%} of the split's values (allowed 75 %): "
            f"the work is not split; balance the ranges of split_items {task('04', 3)}")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("dist_ds"))


@pytest.fixture(scope="module")
def serial(dataset, tmp_path_factory) -> tuple[dict, bytes]:
    out = tmp_path_factory.mktemp("serial") / "stats.yaml"
    r = subprocess.run([sys.executable, "stats.py", dataset, "--out", out, *CHUNK_ARGS], cwd=ROOT,
                       capture_output=True, text=True, timeout=TIMEOUT)
    require_run(r, "the serial stats.py", f"run it as {task('04', 1)} says")
    stats = yaml.safe_load(out.read_text())
    # the serial result is itself right (independent float64 numpy reference)
    assert S.max_relative_difference(without_loss_weight(stats), reference_stats(dataset)) <= 1e-10
    return stats, out.read_bytes()


def check_equal(out: Path, serial) -> None:
    stats, raw = serial
    require(out.is_file(), f"no {out.name} was written: rank 0 writes it {task('04', 5)}")
    got = yaml.safe_load(out.read_text())
    difference = S.max_relative_difference(got, stats)
    # 1e-10: what the serial result itself is allowed against the float64 reference (test_stats.py);
    # merging per-rank totals in rank order reached 1.1e-12 here with 4 ranks (the ramp's deltas).
    require(difference <= 1e-10,
            f"stats.yaml differs from the serial one by {difference:.1e} relative (allowed 1e-10): rank 0 "
            f"must merge every rank's summary, in rank order {task('04', 5)}")
    if IS_SOLUTION:  # the fixed merge tree makes the reference solution bitwise equal to serial
        require(out.read_bytes() == raw, f"stats.yaml equals the serial one to {difference:.1e} but not "
                f"bit for bit: merge along the fixed tree {task('04', 6)}")


def torchrun(dataset, out, nproc, *extra, env=None):
    cmd = [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), str(dataset), "--out", str(out),
           *CHUNK_ARGS, *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env or base_env(), capture_output=True, text=True, timeout=TIMEOUT)


def srun_like(dataset, out, ntasks, *extra, env_extra=None, timeout=TIMEOUT, script=None):
    """Start ntasks processes with the variables srun sets for one step on one node (localhost)."""
    port = free_port()
    procs = []
    for rank in range(ntasks):
        env = base_env(SLURM_PROCID=str(rank), SLURM_NTASKS=str(ntasks), SLURM_STEP_NUM_TASKS=str(ntasks),
                       SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE=str(ntasks),
                       SLURM_JOB_NODELIST="localhost", SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID="4242",
                       SLURM_STEP_ID="0", MASTER_PORT=str(port), **(env_extra or {}))
        procs.append(subprocess.Popen([sys.executable, str(script or SCRIPT), str(dataset), "--out", str(out),
                                       *CHUNK_ARGS, *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a rank hung for more than {timeout} s")
        results.append((p.returncode, stdout, stderr))
    return results


def injected(inject_dir: Path, **variables) -> dict:
    """Environment that loads the sitecustomize above, ahead of whatever PYTHONPATH was."""
    return {"PYTHONPATH": pythonpath_with(inject_dir), **variables}


# ---- tasks 3 and 4, in this process: the participant's split and merge (no launch, a second each)
@pytest.fixture(scope="module")
def idea():
    """(split_items, chan_merge) of the script under test; for the reference solution, the helpers."""
    if IS_SOLUTION:
        from types import SimpleNamespace

        from wellfno.moments import merge

        def split(n_items, world):  # the solution splits a plan's items by bytes; equal bytes here
            return S.rank_ranges(SimpleNamespace(items=[SimpleNamespace(n_bytes=1)] * n_items), world)
        return split, merge
    module = import_script(SCRIPT)
    for name, number in (("split_items", 3), ("chan_merge", 4)):
        require(callable(getattr(module, name, None)),
                f"{SCRIPT.name} has no function {name}: keep the starter's {name} {task('04', number)}")
    return module.split_items, module.chan_merge


def calling(function, *args, number: int):
    """The participant's function's result; an exception it raises becomes one sentence."""
    try:
        return function(*args)
    except Exception as err:  # noqa: BLE001 - whatever it raises, say so in one line
        first = str(err).splitlines()[0] if str(err) else ""
    named = "" if "(exercise 04, task" in first else " " + task("04", number)
    require(False, f"{function.__name__} raised an error: {first}{named}")


@pytest.mark.parametrize("n_items", [0, 1, 5, 17])
def test_split_gives_every_item_to_exactly_one_rank(idea, n_items):
    split = idea[0]
    for world in range(1, 6):
        ranges = [tuple(map(int, r)) for r in calling(split, n_items, world, number=3)]
        require(len(ranges) == world, f"split_items({n_items}, {world}) gave {len(ranges)} ranges for "
                f"{world} ranks (allowed: one per rank) {task('04', 3)}")
        items = [i for start, stop in ranges for i in range(start, stop)]
        require(items == list(range(n_items)),
                f"split_items({n_items}, {world}): over all ranks, in rank order, the items are not "
                f"0..{n_items - 1} each once ({len(items)} items, {len(set(items))} different): "
                f"contiguous ranges, no padding, no overlap {task('04', 3)}")
        most = max(stop - start for start, stop in ranges)
        fair = -(-n_items // world)
        require(most <= fair + 1, f"split_items({n_items}, {world}) gives one rank {most} items (allowed "
                f"{fair + 1}): share the items about equally {task('04', 3)}")


def test_merge_equals_the_summary_of_all_values(idea):
    """Chan's merge against float64 numpy on the values themselves, with a count-0 side too."""
    merge = idea[1]
    rng = np.random.default_rng(4)
    x, y = 1e4 + rng.standard_normal((7, 3)), 1e4 + 3 + 2 * rng.standard_normal((5, 3))

    def summary(values):
        return np.stack([np.full(values.shape[1], float(len(values))), values.mean(0),
                         ((values - values.mean(0)) ** 2).sum(0)])

    empty = np.zeros((3, 3))
    cases = [(summary(x), summary(y), summary(np.concatenate([x, y])), "two summaries"),
             (empty, summary(y), summary(y), "an empty and a full summary"),
             (summary(x), empty, summary(x), "a full and an empty summary")]
    for left, right, want, what in cases:
        got = np.asarray(calling(merge, left.copy(), right.copy(), number=4), dtype=np.float64)
        require(got.shape == want.shape, f"chan_merge of {what} returned shape {got.shape} (allowed "
                f"{want.shape}: rows count, mean, M2) {task('04', 4)}")
        error = float(np.max(np.abs(got - want) / np.abs(want)))
        require(error <= 1e-12, f"chan_merge of {what} is off by {error:.1e} relative (allowed 1e-12) "
                f"from the summary of all the values: check n, mean and M2 against the formula "
                f"{task('04', 4)}")


# Each world size once, launchers alternating (a torch import per process is the cost on 2 cores).
# The srun run with 2 ranks also pretends that the node has 4 GPUs: `--backend auto` must still mean gloo.
@pytest.mark.slow
@pytest.mark.parametrize("launcher, world", [("python", 1), ("srun", 2), ("torchrun", 3), ("srun", 4)])
def test_world_sizes_equal_serial(dataset, serial, tmp_path, inject_dir, launcher, world):
    out, log = tmp_path / "stats.yaml", tmp_path / "reads"
    log.mkdir()
    variables = injected(inject_dir, STATS_READ_LOG=str(log), **({"STATS_FAKE_GPUS": "4"} if world == 2 else {}))
    if launcher == "torchrun":
        r = torchrun(dataset, out, world, env=base_env(**variables))
        require_run(r, f"torchrun with {world} ranks", f"run it yourself as in {task('04', 5)}")
    elif launcher == "srun":
        results = srun_like(dataset, out, world, env_extra=variables)
        failed = [(rank, err) for rank, (rc, _, err) in enumerate(results) if rc != 0]
        require(not failed, f"{len(failed)} of {world} ranks started as srun starts them failed, rank "
                f"{failed[0][0] if failed else ''}: {last_error_line(failed[0][1]) if failed else ''}; "
                f"use the launch environment, not fixed ranks or devices {task('04', 5)}")
    else:
        r = subprocess.run([sys.executable, str(SCRIPT), str(dataset), "--out", str(out), *CHUNK_ARGS], cwd=ROOT,
                           env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)
        require_run(r, "your script as one process (plain python)", f"it must run without a launcher "
                    f"{task('04', 5)}")
    check_equal(out, serial)
    if world > 1:
        check_split(log, world, dataset)


@pytest.mark.slow
def test_two_torchrun_agents_as_two_nodes(dataset, serial, tmp_path):
    port = free_port()
    out = tmp_path / "stats.yaml"
    agents = [subprocess.Popen([*TORCHRUN, "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=stats2",
                                str(SCRIPT), str(dataset), "--out", str(out), *CHUNK_ARGS],
                               cwd=ROOT, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for node in (0, 1)]
    outputs = [a.communicate(timeout=TIMEOUT) for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(err[-2000:] for _, err in outputs)
    check_equal(out, serial)


@pytest.mark.slow
def test_missing_dataset_fails_on_every_rank_without_output(tmp_path):
    out = tmp_path / "out" / "stats.yaml"
    results = srun_like(tmp_path / "nowhere", out, 2)
    said = "".join(err for _, _, err in results)
    require(all(rc != 0 for rc, _, _ in results) and "nowhere" in said and not out.exists()
            and "Traceback" not in said,
            f"with a missing dataset {sum(rc == 0 for rc, _, _ in results)} of 2 ranks exited 0 or a traceback was "
            f"printed (allowed: every rank fails with one line naming the folder): keep the plan inside the "
            f"`with Watchdog` block and do not catch its errors {task('04', 6)}")


def one_line_naming(results, rank: int, world: int) -> str:
    lines = [line for _, _, err in results for line in err.splitlines() if line.endswith(f"stopped all {world} ranks")]
    require(len(lines) == 1 and lines[0].startswith(f"error: rank {rank} "),
            f"{len(lines)} lines say `error: rank {rank} ...; stopped all {world} ranks` (allowed: exactly 1): keep "
            f"every collective after watchdog.wait_for_all() and do not catch a rank's error {task('04', 6)}")
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "die"])
def test_a_rank_that_fails_or_dies_stops_every_rank(dataset, tmp_path, inject_dir, mode):
    """Rank 1's reads fail (or it dies without a word): every rank ends soon, one line names rank 1."""
    out = tmp_path / "stats.yaml"
    started = time.monotonic()
    results = srun_like(dataset, out, 2, env_extra=injected(inject_dir, STATS_FAIL_MODE=mode, STATS_FAIL_RANK="1"),
                        timeout=90)
    elapsed = time.monotonic() - started
    require(results[0][0] == 1, f"rank 0 exited {results[0][0]} when rank 1 failed (allowed: 1, stopped by the "
            f"watchdog): {last_error_line(results[0][2])} {task('04', 6)}")
    line = one_line_naming(results, 1, 2)
    if mode == "raise":
        require(results[1][0] != 0 and "injected read error" in line,
                f"rank 1's read error is not in the line that stops the ranks {task('04', 6)}")
    else:  # the injected death
        require(results[1][0] == 9 and "stopped responding" in line,
                f"rank 1 died, but the line does not say it stopped responding {task('04', 6)}")
    require(not out.exists() and not list(out.parent.glob(".stats.yaml.*")),
            f"a stats.yaml (or a temporary one) was left after rank 1 failed: rank 0 writes only after every "
            f"rank finished {task('04', 6)}")
    # process start-up (torch import) on a busy 2-core machine, plus the 10 s of silence that means death
    require(elapsed < 60, f"the ranks took {elapsed:.0f} s to stop after rank 1 failed (allowed: 60 s) "
            f"{task('04', 6)}")


# What a participant writes into the starter: this test's own answers (equal items, Chan's formula,
# one all_gather), replacing the starter's stubs line for line.
ANSWERS = {
    "    return [(0, n_items)] * world_size  # as it stands: every rank reads everything\n":
        "    bounds = [n_items * rank // world_size for rank in range(world_size + 1)]\n"
        "    return list(zip(bounds[:-1], bounds[1:]))\n",
    '    raise UserError("chan_merge in your stats_parallel.py is not written yet (exercise 04, task 4)")\n':
        "    na, ma, m2a = a\n    nb, mb, m2b = b\n    n = na + nb\n    d = mb - ma\n"
        "    share = np.divide(nb, n, out=np.zeros_like(n), where=n > 0)\n"
        "    return np.stack([n, ma + d * share, m2a + m2b + d * d * na * share])\n",
    "            every_local = [local]  # as it stands: rank 0 has only its own\n":
        "            mine = torch.from_numpy(local).to(device)\n"
        "            gathered = [torch.empty_like(mine) for _ in range(env.world_size)]\n"
        "            dist.all_gather(gathered, mine) if env.is_distributed else gathered[0].copy_(mine)\n"
        "            every_local = [t.cpu().numpy() for t in gathered]\n",
}


def finished_starter(folder: Path) -> Path:
    """The starter with the TODOs written (ANSWERS), saved under a participant's own file name."""
    text = STARTER.read_text()
    for stub, answer in ANSWERS.items():
        assert stub in text, f"the starter's stub changed; update ANSWERS: {stub!r}"
        text = text.replace(stub, answer)
    finished = folder / "my_stats.py"
    finished.write_text(text)
    return finished


@pytest.mark.slow
@pytest.mark.skipif(not IS_SOLUTION, reason="checks the exercise's own files")
def test_check_your_work_fails_the_starter_and_passes_a_finished_copy(tmp_path):
    """The check-your-work command on the untouched starter fails, naming tasks 3 and 4 in one
    sentence each; the starter with the TODOs written, under another name, passes."""
    finished = finished_starter(tmp_path)

    def check(script, selection):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_stats_distributed.py", "--script", str(script), "-k", selection],
                              cwd=ROOT, env={k: v for k, v in base_env().items() if k != "STATS_SCRIPT"},
                              capture_output=True, text=True, timeout=600)

    r = check(STARTER, "split or merge")
    assert r.returncode == 1, r.stdout[-3000:]
    assert "(exercise 04, task 3)" in r.stdout and "(exercise 04, task 4)" in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stdout and "array(" not in r.stdout, r.stdout[-3000:]
    r = check(finished, "split or merge or (world_sizes_equal_serial and torchrun)")
    assert r.returncode == 0 and "6 passed" in r.stdout, r.stdout[-3000:]
