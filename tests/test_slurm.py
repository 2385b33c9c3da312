"""The job scripts of slurm/, run as real jobs on a Slurm cluster.

CI starts the two-node test cluster (slurm/ci/start_cluster.sh, from .ci/run; the
two-node jobs are in tests/test_slurm_2nodes.py); a
developer starts it with `sudo slurm/ci/install.sh && sudo slurm/ci/start_cluster.sh`.
Without a cluster these tests skip on a laptop and FAIL in CI (CI=true).
Select them with `pytest -k slurm`.

Every job runs the CPU variant on tiny generated data, and the tests check what
the job really did: its final state (COMPLETED), the files in its run folder,
the statistics against the serial program, the CPU masks against Slurm's own
cpu-bind report.

The jobs, and what each proves (all but gpu_select's sruns are submitted together with the
other Slurm modules' jobs, `batch`, and run side by side on the two nodes):
- 00_baseline on an empty data folder: the data is generated, the baseline trains (5 steps);
- 04_stats (srun -n 2) and 04_stats_torchrun (2 workers): statistics equal to the serial one;
- 03_affinity_report with 2 x 1 and 1 x 2 CPUs: each rank's CPUs are the mask Slurm applied;
- three 04_stats jobs with a bad site setting: each FAILS with one `error:` line naming it;
- 00_baseline signalled USR1 while it trains: it requeues itself under its id;
- 01_profiling (8 steps), 02_throughput (2 points), 03_affinity_train (1 step): their outputs;
- submit_all.sh in probe mode (no program runs) on an NVIDIA, an AMD and a CPU site: every task
  of the course holds the GPUs, CPUs and variables it should;
- srun of gpu_select.sh under Slurm's GPU modes: it keeps what Slurm set;
- 00_gpu_check on a CPU site (passes) and on a GPU site whose torch sees no GPU (fails);
- 01_profiling on a GPU site without GPUs: fails in one line saying how to submit it.
- one job of each later step (05, 06, 07 with 7 steps, 08, 09, 11; moved here from their
  tests/test_NN_*.py): the outputs and checks of each step's job script.
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.ddp_helpers import SMALL_MODEL

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
SLURM_DIR = REPO / "slurm"
DATASET = "gray_scott_embedded"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"}
START_HINT = "start it with: sudo slurm/ci/install.sh && sudo slurm/ci/start_cluster.sh"


# --------------------------------------------------------------------------- cluster
def _cmd(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


# A node that can run jobs, whatever it is doing now. sinfo's %T adds flags to the state: "*" not
# responding, "~" "#" "%" "!" power saving, "$" "@" "^" maintenance and reboots, "-" planned by
# the backfill scheduler, "+" more states (https://slurm.schedmd.com/sinfo.html, NODE STATE CODES).
USABLE_STATES = ("idle", "mixed", "allocated", "completing", "planned")


def usable(state: str) -> bool:
    return re.split(r"[^a-z_]", state.lower(), maxsplit=1)[0] in USABLE_STATES


def _sinfo_nodes() -> subprocess.CompletedProcess | None:
    """sinfo's line per node, "name state cpus" (None if it does not answer in time)."""
    try:
        return _cmd("sinfo", "-h", "-N", "-o", "%N %T %c")
    except subprocess.TimeoutExpired:
        return None


def node_states(r: subprocess.CompletedProcess | None = None) -> list[list[str]]:
    """[name, state, cpus] of each node in sinfo's answer `r` (default: ask it now); [] if it did
    not answer."""
    r = r if r is not None else _sinfo_nodes()
    return [line.split() for line in r.stdout.strip().splitlines()] if r and r.returncode == 0 else []


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The running cluster (sinfo answers, a node is usable); skip or, in CI, fail."""
    problem = None
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        problem = "Slurm client tools (sinfo, sbatch) are not installed"
    else:
        r = _sinfo_nodes()
        nodes = node_states(r)
        if not nodes:
            problem = "no Slurm cluster answers to sinfo" + (f" ({r.stderr.strip()})" if r else "")
        elif not [n for n in nodes if usable(n[1])]:
            problem = f"the Slurm cluster has no usable node: {r.stdout.strip()}"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem}; .ci/run should have started the local test cluster "
                        f"(slurm/ci/start_cluster.sh)", pytrace=False)
        pytest.skip(f"{problem}; {START_HINT}")
    return {"nodes": nodes}


# Pytest makes a session-scoped fixture once per module that imports it (tests/test_slurm_*.py
# import these from here: tests/conftest.py is not theirs), so what must exist once per session
# (the data, the serial statistics, the batch of jobs) is kept here, by fixture name.
_ONCE: dict = {}


@pytest.fixture(scope="session")
def slurm_data(tmp_path_factory) -> Path:
    """WELL_DATA with the tiny embedded dataset, generated once per session."""
    if "slurm_data" not in _ONCE:
        _ONCE["slurm_data"] = _generate_data(tmp_path_factory)
    return _ONCE["slurm_data"]


def _generate_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slurm_well_data")
    r = subprocess.run([sys.executable, "-m", "wellfno.grayscott", "--data-dir", str(root),
                        "--size", "tiny"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"generating tiny data failed:\n{r.stdout}\n{r.stderr}"
    assert (root / "datasets" / DATASET / "data").is_dir()
    return root


# 10 input frames of the tiny data's 12 per trajectory: 2 samples a trajectory (8 to train on), so
# the validation and rollout that end every training are a few model calls, not ~30: half the CPU
# time of a short run. For jobs whose checks do not need more training samples.
SHORT_VALIDATION = ("--n-steps-input", "10")
# SMALL_MODEL (tests/ddp_helpers.py) for the jobs whose checks do not depend on the model's size:
# most of a profiled run of the course's model is torch's key_averages over 90,000 events.


def job_env(run_root: Path, well_data: Path, **extra: str) -> dict:
    """The environment sbatch exports into the job: the repo's site.env with test values."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    in_venv = sys.prefix != sys.base_prefix
    env.update(
        WELLFNO_ROOT=str(REPO), WELL_DATA=str(well_data), RUN_ROOT=str(run_root),
        DATASET=DATASET, DATA_SIZE="tiny", GPU_VENDOR="none", GPUS_PER_NODE="0",
        # Use the Python running these tests: its venv activated like a site's venv.
        SITE_VENV=sys.prefix if in_venv else "", SITE_MODULES="", SITE_SETUP="",
    )
    if not in_venv:
        env["PYTHON"] = sys.executable
    env.update(extra)
    return env


class Job:
    def __init__(self, jobid: str, name: str, run_root: Path):
        self.id, self.name, self.run_root = jobid, name, run_root
        self.out = run_root / f"{name}-{jobid}.out"
        self.err = run_root / f"{name}-{jobid}.err"
        self.run_dir = run_root / f"{name}-{jobid}"
        self.state = "PENDING"
        self.exit_code = ""

    def logs(self) -> str:
        text = ""
        for p in (self.out, self.err):
            body = p.read_text(errors="replace") if p.exists() else "(missing)"
            text += f"--- {p.name}\n{body[-3000:]}\n"
        return text

    def assert_completed(self):
        assert self.state == "COMPLETED", (
            f"job {self.id} ({self.name}) ended {self.state} exit={self.exit_code}\n{self.logs()}")


def sbatch(script: str, *args: str, env: dict, run_root: Path, sbatch_opts=()) -> Job:
    run_root.mkdir(parents=True, exist_ok=True)
    path = SLURM_DIR / script if not Path(script).is_absolute() else Path(script)
    name = re.search(r"^#SBATCH --job-name=(\S+)", path.read_text(), re.M).group(1)
    r = subprocess.run(["sbatch", "--parsable", f"--output={run_root}/%x-%j.out",
                        f"--error={run_root}/%x-%j.err", *sbatch_opts, str(path), *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"sbatch {script} failed: {r.stderr}"
    return Job(r.stdout.strip().split(";")[0], name, run_root)


def job_state(jobid: str) -> tuple[str, str]:
    r = _cmd("scontrol", "show", "job", "-o", jobid)
    if r.returncode == 0 and "JobState=" in r.stdout:
        state = re.search(r"JobState=(\S+)", r.stdout).group(1)
        code = re.search(r"ExitCode=(\S+)", r.stdout)
        return state, code.group(1) if code else ""
    # Purged from slurmctld's memory: ask accounting, where there is one.
    r = _cmd("sacct", "-n", "-X", "-P", "-j", jobid, "-o", "State,ExitCode")
    if r.returncode == 0 and r.stdout.strip():
        state, code = r.stdout.strip().splitlines()[0].split("|")
        return state.split()[0], code
    return "UNKNOWN", ""


# How often a test asks slurmctld for a job's state: one scontrol call (about 10 ms of CPU) a
# quarter second. A poll that grew to 3 s cost the suite about 1.5 s per job on average.
POLL_S = 0.25


def wait(job: Job, timeout: float = 180) -> Job:
    """The job once it has ended; `timeout` counts its time in the queue too (a batch's jobs
    may wait for each other's nodes), so it bounds a failure, not a run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.state, job.exit_code = job_state(job.id)
        if job.state in TERMINAL:
            return job
        time.sleep(POLL_S)
    _cmd("scancel", job.id)
    pytest.fail(f"job {job.id} ({job.name}) still {job.state} after {timeout:.0f}s; cancelled\n{job.logs()}")


def run_job(script: str, *args: str, env: dict, run_root: Path, sbatch_opts=(), timeout=180) -> Job:
    return wait(sbatch(script, *args, env=env, run_root=run_root, sbatch_opts=sbatch_opts), timeout)


# --------------------------------------------------------------------------- the session's batch
# Every job of every Slurm test module that shares nothing with the others is submitted at once,
# when the first test that needs one runs (`batch`, a session-scoped fixture; each module registers
# its jobs with `batched`): Slurm runs them side by side on the two nodes, so both cores work while
# a test waits, the queue never idles between tests or modules, and each test waits only for its
# own jobs. Submission order is Slurm's start order (priority/basic: first come, first served):
# the job a test signals while it runs first, then the one-node jobs, longest first (the last
# one to end bounds the batch), then the jobs that take both nodes (a job that needs both waits
# until both are free; jobs behind it wait too). Only the selected tests' jobs are submitted
# (`pytest -k` works), and whatever a failed test did not wait for is cancelled at the end.
BATCH: dict = {}     # test id -> (order key, what it needs, submit(root, data))
SIGNALLED, ONE_NODE, BOTH_NODES = 0, 1, 2


def batched(test_id: str, gpus: int = 0, nodes: int = 1, seconds: float = 10,
            order: int = ONE_NODE, **params):
    """Register `submit(root, data, **params)` as what test `test_id` submits (stackable).
    gpus: stand-in GPUs per node it needs (not submitted on a cluster without them); nodes: 2
    for jobs that take both nodes (submitted last); seconds: about how long it runs on the
    loaded 2-core machine (longest first)."""
    def register(submit):
        assert test_id not in BATCH, f"two submissions registered for {test_id}"
        key = (BOTH_NODES if nodes > 1 else order, -seconds)
        BATCH[test_id] = (key, dict(gpus=gpus, nodes=nodes), functools.partial(submit, **params))
        return submit
    return register


def submit_batch(request, table: dict, tmp_path_factory, can, **kwargs):
    """{test id: what its submit(root, **kwargs) submitted} for the session's selected tests that
    the cluster `can` run, in their order; a generator for a fixture: yields that dict, cancels
    the jobs in it at the end."""
    selected = {item.name for item in request.session.items}
    submitted = {}
    for name, (_, needs, submit) in sorted(table.items(), key=lambda kv: kv[1][0]):
        if name in selected and can(**needs):
            root = tmp_path_factory.mktemp(re.sub(r"\W+", "_", name)[:40])
            submitted[name] = submit(root, **kwargs)
    yield submitted
    ids = [job.id for job in _jobs_in(submitted) if job.state not in TERMINAL]
    if ids:
        _cmd("scancel", *ids)


def _jobs_in(x) -> list[Job]:
    if isinstance(x, Job):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [job for item in x for job in _jobs_in(item)]
    return []


def need(path: str):
    if not (REPO / path).exists():
        pytest.fail(f"{path} is not in the repository yet; the Slurm job for it cannot run", pytrace=False)


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- helpers
def _cpus(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def _mask_cpus(mask: str) -> set[int]:
    value = int(mask, 16)
    return {i for i in range(value.bit_length()) if value >> i & 1}


def _assert_same_numbers(a, b, where="stats"):
    """Equal structure; strings equal; numbers equal to float64 reduction-order noise."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys differ: {sorted(a)} vs {sorted(b)}"
        for k in a:
            _assert_same_numbers(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_numbers(x, y, f"{where}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert isinstance(b, (int, float)), f"{where}: {a!r} vs {b!r}"
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _count_numbers(x) -> int:
    if isinstance(x, dict):
        return sum(_count_numbers(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_count_numbers(v) for v in x)
    return int(isinstance(x, (int, float)) and not isinstance(x, bool))


# --------------------------------------------------------------------------- tests
def test_slurm_job_scripts_are_valid_bash():
    """Every script parses (the two-node ones also run, in tests/test_slurm_2nodes.py)."""
    scripts = sorted(SLURM_DIR.glob("*.sbatch")) + sorted(SLURM_DIR.glob("*.sh")) \
        + sorted((SLURM_DIR / "ci").glob("*.sh")) + [SLURM_DIR / "common.sh", SLURM_DIR / "site.env"]
    assert any(p.name == "04_stats_2nodes.sbatch" for p in scripts)
    for p in scripts:
        r = _cmd("bash", "-n", str(p))
        assert r.returncode == 0, f"{p.name}: {r.stderr}"
    two = (SLURM_DIR / "04_stats_2nodes.sbatch").read_text()
    assert re.search(r"^#SBATCH --nodes=2$", two, re.M)


def _dry_run(env, *args, cwd=None):
    r = subprocess.run([str(SLURM_DIR / "submit_all.sh"), "--dry-run", *args], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    cmds = [line.split() for line in r.stdout.splitlines() if line.startswith("sbatch ")]
    return {Path(next(x for x in c if x.endswith(".sbatch"))).stem: c for c in cmds}, r.stdout


def _opt(cmd: list[str], name: str) -> str | None:
    return next((c.split("=", 1)[1] for c in cmd if c.startswith(name + "=")), None)


# submit_all.sh's STEPS table: name -> (resources, after)
STEPS = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
    r'^\s+"(\d\d_\w+)\s+(\w+)\s+(\S+)"$', (SLURM_DIR / "submit_all.sh").read_text(), re.M)}


def test_slurm_submit_all_dry_run_orders_steps_and_resources(tmp_path):
    """The day-0 check first; every step after it; statistics after the data only; one GPU per
    task (or all of a node's for the per-GPU steps) and CPUS_PER_GPU cores on GPU sites; no GPU
    for the statistics; nothing created by a dry run."""
    env = job_env(tmp_path / "runs", tmp_path / "data")          # no dataset yet: steps wait for 00_baseline
    steps, out = _dry_run(env, cwd=tmp_path)
    scripts = sorted(p.stem for p in SLURM_DIR.glob("[0-9][0-9]_*.sbatch") if "2nodes" not in p.stem)
    assert sorted(steps) == scripts and list(steps)[0] == "00_gpu_check"
    assert f"submitting {len(scripts)} jobs" in out
    assert _opt(steps["00_gpu_check"], "--dependency") is None
    for name, cmd in steps.items():
        if name == "00_gpu_check":
            continue
        dep = _opt(cmd, "--dependency")
        assert dep and dep.startswith("afterok:") and "$00_gpu_check" in dep.split(":"), (name, dep)
        assert ("$00_baseline" in dep.split(":")) == (STEPS[name][1] == "data"), (name, dep)
        assert not any(c.startswith(("--gpus", "--gres")) for c in cmd), f"a CPU site's job asks for GPUs: {cmd}"
    assert not (tmp_path / "runs").exists(), "a dry run must not create anything"

    # The dataset exists: nothing waits for the baseline (statistics only need the data).
    (tmp_path / "data" / "datasets" / DATASET / "data").mkdir(parents=True)
    steps, _ = _dry_run(env)
    assert all("$00_baseline" not in (_opt(c, "--dependency") or "") for c in steps.values())

    # A GPU site: resources per step.
    gpu_env = {**env, "GPU_VENDOR": "amd", "GPUS_PER_NODE": "8", "CPUS_PER_GPU": "7"}
    steps, _ = _dry_run(gpu_env, "--args", "00_baseline=--epochs 5 --batch-size 16")
    assert {n for n, (res, _) in STEPS.items() if res == "gpu"} >= set(GPU_STEPS_ONE)
    assert {n for n, (res, _) in STEPS.items() if res == "gpus"} >= set(GPU_STEPS_NODE) | {"00_gpu_check"}
    assert {n for n, (res, _) in STEPS.items() if res == "cpu"} >= set(CPU_STEPS)
    for name, c in steps.items():
        res = STEPS[name][0]
        got = (_opt(c, "--ntasks"), _opt(c, "--gpus-per-task"), _opt(c, "--gpus-per-node"), _opt(c, "--cpus-per-task"))
        expected = {"gpu": ("1", "1", None, "7"), "gpus": ("8", None, "8", "7"), "cpu": (None, None, None, None)}[res]
        assert got == expected, (name, c)
    assert steps["00_baseline"][-4:] == ["--epochs", "5", "--batch-size", "16"]
    assert all(c[-1].endswith(".sbatch") for n, c in steps.items() if n != "00_baseline"), "--args went to other steps"
    steps, _ = _dry_run({**gpu_env, "GPU_TYPE": "mi250"}, "00_b")
    assert list(steps) == ["00_baseline"] and _opt(steps["00_baseline"], "--gpus-per-task") == "mi250:1"
    assert _opt(steps["00_baseline"], "--dependency") is None, "a step submitted alone waits for nothing"

    steps, _ = _dry_run(env, "--with-2nodes", "04")
    assert "04_stats_2nodes" in steps and "00_baseline" not in steps


def test_slurm_every_job_script_has_a_line_in_submit_all(tmp_path):
    """A new slurm/NN_*.sbatch without a STEPS line is refused (it would get no resources)."""
    root = tmp_path / "copy"
    shutil.copytree(SLURM_DIR, root / "slurm")
    (root / "slurm" / "07_new.sbatch").write_text("#!/bin/bash\n#SBATCH --job-name=07_new\n")
    env = job_env(tmp_path / "runs", tmp_path / "data")
    del env["WELLFNO_ROOT"]
    r = subprocess.run([str(root / "slurm" / "submit_all.sh"), "--dry-run"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and error_lines(r.stderr) == [
        "error: slurm/07_new.sbatch has no line in STEPS of slurm/submit_all.sh (resources and what it runs after)"]
    r = subprocess.run([str(SLURM_DIR / "submit_all.sh"), "--dry-run", "--args", "99=--x"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no submitted step starts with '99'" in r.stderr


def _gpus_per_node() -> int:
    r = _cmd("sinfo", "-h", "-N", "-o", "%G")
    return min((int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", r.stdout)), default=0)


# Before the batch (the first test that asks for `batch` submits it): its five sruns then start at
# once, where behind the batch they waited about 90 s for free cores.
def test_slurm_gpu_select_keeps_what_slurm_set(slurm_gpus, tmp_path):
    """slurm/gpu_select.sh under real srun GPU modes: it never picks a GPU itself, keeps what
    Slurm set, only rewrites HIP's second filter on AMD, and maps local rank -> GPU only when
    Slurm set nothing and the site asked for it."""
    # --gpu-bind=closest: each task gets every GPU near its core (stand-ins: 0,1 on core 0; 2,3 on core 1).
    for vendor in ("nvidia", "amd"):
        recs, _ = _srun_probe(tmp_path, {"GPU_VENDOR": vendor}, "-n2", "--cpu-bind=cores", "--gpus-per-node=4",
                              "--gpu-bind=closest")
        assert [r["env"]["SLURM_STEP_GPUS"] for r in recs] == ["0,1", "2,3"], recs
        for r in recs:
            e = r["env"]
            assert e["ROCR_VISIBLE_DEVICES"] == e["SLURM_STEP_GPUS"], "ROCR_VISIBLE_DEVICES changed"
            expected = e["SLURM_STEP_GPUS"] if vendor == "nvidia" else "0,1"
            assert e["CUDA_VISIBLE_DEVICES"] == expected, (vendor, e)
    # Slurm set nothing (no GPU asked for): left alone, unless GPU_SELECT_BY_LOCALID=1.
    recs, err = _srun_probe(tmp_path, {"GPU_VENDOR": "amd"}, "-n2")
    assert all(not any("VISIBLE" in k for k in r["env"]) for r in recs)
    assert "Slurm set no CUDA_/ROCR_VISIBLE_DEVICES" in err
    recs, _ = _srun_probe(tmp_path, {"GPU_VENDOR": "amd", "GPU_SELECT_BY_LOCALID": "1"}, "-n2")
    assert [r["env"].get("ROCR_VISIBLE_DEVICES") for r in recs] == ["0", "1"]
    assert all("CUDA_VISIBLE_DEVICES" not in r["env"] for r in recs)
    recs, _ = _srun_probe(tmp_path, {"GPU_VENDOR": "nvidia", "GPU_SELECT_BY_LOCALID": "1"}, "-n2")
    assert [r["env"].get("CUDA_VISIBLE_DEVICES") for r in recs] == ["0", "1"]


@pytest.fixture(scope="session")
def batch(request, slurm_cluster, slurm_data, tmp_path_factory):
    """The session's batch (see `batched`): {test id: what it submitted}."""
    up = {n for n, state, *_ in slurm_cluster["nodes"] if usable(state)}
    per_node = _gpus_per_node()

    def can(gpus, nodes):
        return len(up) >= nodes and per_node >= gpus
    if "batch" in _ONCE:  # submitted by another module's instance of this fixture
        yield _ONCE["batch"]
        return
    submitting = submit_batch(request, BATCH, tmp_path_factory, can, data=slurm_data)
    _ONCE["batch"] = next(submitting)
    yield _ONCE["batch"]
    next(submitting, None)  # cancels what is left


@pytest.fixture(scope="session")
def serial_stats(slurm_data, tmp_path_factory) -> Path:
    """stats.yaml of the serial program (stats.py) on the tiny dataset: what every distributed
    statistics job must give, computed once."""
    if "serial_stats" not in _ONCE:
        _ONCE["serial_stats"] = _serial_stats(slurm_data, tmp_path_factory)
    return _ONCE["serial_stats"]


def _serial_stats(slurm_data, tmp_path_factory) -> Path:
    need("stats.py")
    out = tmp_path_factory.mktemp("serial_stats") / "stats.yaml"
    r = subprocess.run([sys.executable, "stats.py", str(slurm_data / "datasets" / DATASET),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"serial stats.py failed:\n{r.stderr}"
    return out


@batched("test_slurm_baseline_trains_and_writes_results", seconds=40)
def _baseline(root, data):
    well_data, run_root = root / "data", root / "runs"  # an EMPTY data folder
    return sbatch("00_baseline.sbatch", "--epochs", "1", "--max-steps", "5", *SHORT_VALIDATION,
                  *SMALL_MODEL, env=job_env(run_root, well_data), run_root=run_root), well_data


def test_slurm_baseline_trains_and_writes_results(batch, request):
    """00_baseline on an EMPTY data folder: generates tiny data, trains, writes its results."""
    need("fno.py")
    need("wellfno/grayscott.py")
    job, well_data = batch[request.node.name]
    wait(job, timeout=600)
    job.assert_completed()
    assert (well_data / "datasets" / DATASET / "data" / "train").is_dir(), "dataset was not generated"
    assert job.run_dir.is_dir(), f"no run folder {job.run_dir}\n{job.logs()}"
    import json
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    assert metrics, "metrics.json is empty"
    png = (job.run_dir / "rollout.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (job.run_dir / "checkpoint.pt").stat().st_size > 0
    assert (job.run_dir / "slurm.out").resolve() == job.out.resolve(), "job log not linked into the run folder"
    assert "device=cpu" in (job.run_dir / "job.txt").read_text()


STATS_SCRIPTS = ("04_stats.sbatch", "04_stats_torchrun.sbatch")


@batched(f"test_slurm_stats_two_tasks_equal_serial[{STATS_SCRIPTS[0]}]", script=STATS_SCRIPTS[0])
@batched(f"test_slurm_stats_two_tasks_equal_serial[{STATS_SCRIPTS[1]}]", script=STATS_SCRIPTS[1])
def _stats(root, data, script):
    run_root = root / "runs"
    return sbatch(script, env=job_env(run_root, data), run_root=run_root,
                  sbatch_opts=["--ntasks=2"] if script == "04_stats.sbatch" else [])


@pytest.mark.parametrize("script", STATS_SCRIPTS)
def test_slurm_stats_two_tasks_equal_serial(batch, request, serial_stats, script):
    """Statistics with 2 ranks (srun -n 2, or torchrun with 2 workers) == the serial program."""
    need("solutions/04_distributed_stats/stats.py")
    serial = serial_stats
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    assert "ntasks=2" in (job.run_dir / "job.txt").read_text()
    expected = yaml.safe_load(serial.read_text())
    got = yaml.safe_load((job.run_dir / "stats.yaml").read_text())
    assert _count_numbers(expected) > 0, "serial stats.yaml holds no numbers"
    _assert_same_numbers(got, expected)


@batched("test_slurm_affinity_report_shows_slurm_masks[2-1]", ntasks=2, cpus_per_task=1)
@batched("test_slurm_affinity_report_shows_slurm_masks[1-2]", ntasks=1, cpus_per_task=2)
def _affinity_report(root, data, ntasks, cpus_per_task):
    run_root = root / "runs"
    return sbatch("03_affinity_report.sbatch", env=job_env(run_root, data), run_root=run_root,
                  sbatch_opts=[f"--ntasks={ntasks}", f"--cpus-per-task={cpus_per_task}"])


@pytest.mark.parametrize("ntasks,cpus_per_task", [(2, 1), (1, 2)])
def test_slurm_affinity_report_shows_slurm_masks(batch, request, ntasks, cpus_per_task):
    """Each rank reports exactly the CPUs of the mask Slurm says it applied; with
    --cpus-per-task=2 the step gets 2 CPUs per task (SRUN_CPUS_PER_TASK passed on)."""
    need("affinity/report.py")
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    # Slurm's own words: "cpu-bind=MASK - vm, task  0  0 [1234]: mask 0x1 set"
    masks = {int(t): _mask_cpus(m) for t, m in
             re.findall(r"cpu-bind=MASK - \S+, task\s+(\d+)\s+\d+\s+\[\d+\]: mask (0x[0-9a-fA-F]+) set",
                        job.err.read_text())}
    assert sorted(masks) == list(range(ntasks)), f"no cpu-bind line per task\n{job.logs()}"
    report = (job.run_dir / "affinity_report.txt").read_text()
    seen = {int(m.group(1)): _cpus(m.group(2)) for m in
            re.finditer(r"\brank=(\d+)\b.*?\bcpus=([0-9,\-]+)", report)}
    assert sorted(seen) == list(range(ntasks)), f"no report line per rank:\n{report}"
    for rank in range(ntasks):
        assert seen[rank] == masks[rank], f"rank {rank}: reports CPUs {seen[rank]}, Slurm applied {masks[rank]}"
        assert len(seen[rank]) == cpus_per_task
    if ntasks > 1:
        assert not set.intersection(*seen.values()), "ranks share cores under --cpu-bind=cores"


@batched("test_slurm_bad_site_settings_fail_in_one_line", seconds=1)
def _bad_site(tmp_path, data):
    slurm_data = data
    run_root = tmp_path / "runs"
    jobs = [
        (sbatch("04_stats.sbatch", env=job_env(run_root, slurm_data, GPU_VENDOR="nvidai"),
                run_root=run_root), "GPU_VENDOR"),
        (sbatch("04_stats.sbatch", env=job_env(run_root, tmp_path / "empty"),
                run_root=run_root), "no dataset at"),
    ]
    # A site.env whose WELL_DATA line was emptied by hand, in a copy of slurm/.
    root = tmp_path / "site_copy"
    shutil.copytree(SLURM_DIR, root / "slurm")
    site = root / "slurm" / "site.env"
    text, n = re.subn(r"^WELL_DATA=.*$", "WELL_DATA=", site.read_text(), flags=re.M)
    assert n == 1
    site.write_text(text)
    env = job_env(run_root, slurm_data, WELLFNO_ROOT=str(root))
    del env["WELL_DATA"]
    jobs.append((sbatch(str(root / "slurm" / "04_stats.sbatch"), env=env, run_root=run_root), "WELL_DATA"))
    return jobs


def test_slurm_bad_site_settings_fail_in_one_line(batch, request):
    """A wrong GPU_VENDOR, a missing dataset, an empty WELL_DATA in site.env: the job
    FAILS with one `error:` line that names the setting."""
    for job, needle in batch[request.node.name]:
        wait(job, timeout=600)
        assert job.state == "FAILED", f"job {job.id} ended {job.state}, expected FAILED\n{job.logs()}"
        errors = error_lines(job.err.read_text())
        assert len(errors) == 1 and needle in errors[0], f"expected one error line about {needle}\n{job.logs()}"


def _signal_while_it_trains(job: Job) -> str | None:
    """Send the job the baseline's requeue signal while its training step runs; None once it is
    requeued under its id (then cancelled: Slurm holds a requeued job ~2 minutes before it may
    start again), else what went wrong. Runs in a thread beside the batch (see _requeue)."""
    try:
        deadline = time.monotonic() + 300  # first in the queue: it starts at once
        while time.monotonic() < deadline:
            job.state, _ = job_state(job.id)
            if job.state != "PENDING":
                break
            time.sleep(POLL_S)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the training step runs: the trap is set
            steps = _cmd("squeue", "-h", "-s", "-j", job.id, "-o", "%i").stdout.split()
            if f"{job.id}.0" in steps:  # not just the .batch/.extern steps
                break
            job.state, _ = job_state(job.id)
            if job.state in TERMINAL:
                return f"job ended {job.state} before it could be signalled\n{job.logs()}"
            time.sleep(POLL_S)
        else:
            return f"job {job.id} never started its training step\n{job.logs()}"
        r = _cmd("scancel", "--batch", "--signal=USR1", job.id)
        if r.returncode != 0:
            return f"scancel --signal=USR1 failed: {r.stderr}"
        deadline = time.monotonic() + 60
        info = ""
        while time.monotonic() < deadline:
            info = _cmd("scontrol", "show", "job", "-o", job.id).stdout
            if re.search(r"Restarts=1\b", info) and re.search(r"JobState=(PENDING|REQUEUED)", info):
                return None
            time.sleep(POLL_S)
        return f"job {job.id} was not requeued: {info}\n{job.logs()}"
    finally:
        _cmd("scancel", job.id)
        job.state = "CANCELLED"


@batched("test_slurm_baseline_requeues_itself_near_time_limit", order=SIGNALLED)
def _requeue(root, data):
    """Submitted before every other job of the session (the first in Slurm's queue, so it starts
    at once), and signalled by a thread while the rest of the batch runs: neither its start nor
    the signal waits behind the batch."""
    run_root = root / "runs"
    job = sbatch("00_baseline.sbatch", "--epochs", "1", "--max-steps", "5",
                 env=job_env(run_root, data), run_root=run_root)
    outcome: dict = {}
    watcher = threading.Thread(target=lambda: outcome.update(failure=_signal_while_it_trains(job)),
                               daemon=True, name=f"requeue-{job.id}")
    watcher.start()
    return job, watcher, outcome


def test_slurm_baseline_requeues_itself_near_time_limit(batch, request):
    """The signal Slurm sends before the time limit (--signal=B:USR1@...) makes the
    baseline job requeue itself under the same id, so it finds its run folder again.
    (Slurm holds a requeued job ~2 minutes before it may start again: the test stops there.)
    Signalled while it trains, by a thread started when the batch was submitted."""
    need("fno.py")
    job, watcher, outcome = batch[request.node.name]
    watcher.join(timeout=600)
    assert not watcher.is_alive(), f"job {job.id}: still watching it after 600 s\n{job.logs()}"
    if outcome["failure"]:
        pytest.fail(outcome["failure"])
    assert "requeueing job" in job.err.read_text(), job.logs()
    assert job.run_dir.is_dir()


@batched("test_slurm_profiling_writes_trace_summary_and_timeline", seconds=40)
def _profiling(root, data):
    run_root = root / "runs"
    return sbatch("01_profiling.sbatch", "--max-steps", "8", "--batch-size", "4", *SMALL_MODEL,
                  env=job_env(run_root, data), run_root=run_root)


def test_slurm_profiling_writes_trace_summary_and_timeline(batch, request):
    """01_profiling: the profiled solution writes a valid Chrome trace with 5 recorded steps."""
    need("solutions/01_profiling/fno.py")
    import gzip
    import json
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    traces = sorted(job.run_dir.glob("trace_rank0_steps*.json.gz"))
    assert len(traces) == 1, f"no trace in {job.run_dir}\n{job.logs()}"
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 5, steps
    assert any(p.suffix == ".png" for p in job.run_dir.iterdir()), "no timeline picture"
    assert "forward" in (job.run_dir / "profile_summary.txt").read_text()


@batched("test_slurm_throughput_sweep_writes_its_table", seconds=30)
def _throughput(root, data):
    run_root = root / "runs"
    return sbatch("02_throughput.sbatch", "--workers", "0,1", "--readers", "fast",
                  "--seconds", "0.3", "--warmup", "1", "--repeats", "1", "--batch-size", "4",
                  env=job_env(run_root, data), run_root=run_root)


def test_slurm_throughput_sweep_writes_its_table(batch, request):
    """02_throughput: a minimal sweep runs as a job and writes json/csv/png with the measured columns."""
    need("profiling/throughput.py")
    import json
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    result = json.loads((job.run_dir / "throughput.json").read_text())
    rows = result["rows"] if isinstance(result, dict) else result
    assert {r["num_workers"] for r in rows} == {0, 1}
    for r in rows:
        assert r["data_only"] > 0 and r["compute_only"] > 0 and r["full"] > 0, r
    assert (job.run_dir / "throughput.csv").is_file() and (job.run_dir / "throughput.png").is_file()


@batched("test_slurm_affinity_train_binds_each_rank_and_its_workers", seconds=35)
def _affinity_train(root, data):
    run_root = root / "runs"
    return sbatch("03_affinity_train.sbatch", "--epochs", "1", "--max-steps", "1",
                  "--batch-size", "8", *SMALL_MODEL,
                  env=job_env(run_root, data), run_root=run_root,
                  sbatch_opts=["--ntasks=2", "--cpus-per-task=1"])


def test_slurm_affinity_train_binds_each_rank_and_its_workers(batch, request):
    """03_affinity_train: two ranks bind themselves to disjoint cores; workers stay inside their rank's."""
    need("solutions/03_affinity/fno.py")
    job = wait(batch[request.node.name], timeout=600)
    job.assert_completed()
    report = (job.run_dir / "affinity_report.txt").read_text()
    ranks = {int(m.group(1)): _cpus(m.group(2)) for m in
             re.finditer(r"\brank=(\d+)\b.*?\bworker=-.*?\bcpus=([0-9,\-]+)", report)}
    assert sorted(ranks) == [0, 1], report
    assert not ranks[0] & ranks[1], f"ranks share cores: {ranks}"
    workers = [(int(m.group(1)), _cpus(m.group(2))) for m in
               re.finditer(r"\brank=(\d+)\b.*?\bworker=\d+.*?\bcpus=([0-9,\-]+)", report)]
    assert {rank for rank, _ in workers} == {0, 1}, report
    for rank, cpus in workers:
        assert cpus <= ranks[rank], f"a worker of rank {rank} runs outside its rank's CPUs"
    for rank in (0, 1):
        assert (job.run_dir / f"rank{rank}" / "metrics.json").is_file()


# --------------------------------------------------------------------------- GPU plumbing
# The CI cluster has stand-in GPUs (slurm/ci/start_cluster.sh: gres.conf with 4 device files,
# AutoDetect=off, no Flags= so Slurm sets CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES,
# GPU_DEVICE_ORDINAL and ZE_AFFINITY_MASK). Slurm hands them out for real; the programs cannot
# use them, so the job scripts run in their test mode (WELLFNO_PROBE): each task records what it
# was given (slurm/ci/probe_task.py) instead of running the program.
@pytest.fixture(scope="session")
def slurm_gpus(slurm_cluster) -> int:
    r = _cmd("sinfo", "-h", "-N", "-o", "%G")
    counts = [int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", r.stdout)]
    if sum(counts) < 2:
        msg = f"the Slurm cluster has no stand-in GPUs (sinfo %G: {r.stdout.strip()!r}); restart it with slurm/ci/start_cluster.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return sum(counts)


def _probes(folder: Path) -> dict[str, dict[str, list[dict]]]:
    """job name -> step id -> the records of its tasks, by rank."""
    import json
    out: dict[str, dict[str, list[dict]]] = {}
    for p in sorted(folder.glob("*.json")):
        m = re.match(r"(.+)-(\d+)\.(\w+)-(\d+)\.json$", p.name)
        rec = json.loads(p.read_text())
        out.setdefault(m.group(1), {}).setdefault(m.group(3), []).append(rec)
    for steps in out.values():
        for recs in steps.values():
            recs.sort(key=lambda r: int(r["env"]["SLURM_PROCID"]))
    return out


def _submit_all(env: dict, *args: str) -> list[Job]:
    r = subprocess.run([str(SLURM_DIR / "submit_all.sh"), *args], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"submit_all.sh failed:\n{r.stdout}\n{r.stderr}"
    run_root = Path(env["RUN_ROOT"])
    jobs = [Job(m.group(1), m.group(2), run_root) for m in re.finditer(r"^(\d+)\s+(\S+)\s+->", r.stdout, re.M)]
    for job in jobs:  # submit_all.sh names the log %x-%j.out (stderr in it too)
        job.err = job.out
    return jobs


GPU_STEPS_ONE = ("00_baseline", "01_profiling", "02_throughput")      # 1 task, 1 GPU, CPUS_PER_GPU cores
GPU_STEPS_NODE = ("03_affinity_report", "03_affinity_train")           # a task per GPU
CPU_STEPS = ("04_stats", "04_stats_torchrun")


def _gpu_ids(rec: dict, vendor: str) -> list[str]:
    """The physical GPUs the task was given, read from the variable its vendor's runtime uses."""
    var = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}[vendor]
    value = rec["env"].get(var)
    return value.split(",") if value else []


@batched("test_slurm_every_job_hands_each_task_its_devices", gpus=2, seconds=20)
def _every_job(tmp_path, data):
    sites = {}
    for vendor in ("nvidia", "amd", "none"):
        root = tmp_path / vendor
        env = job_env(root / "runs", data, GPU_VENDOR=vendor,
                      GPUS_PER_NODE="2" if vendor != "none" else "0", CPUS_PER_GPU="1",
                      LOCAL_TMP=str(root / "local"), WELLFNO_PROBE=str(root / "probe"))
        sites[vendor] = (root, _submit_all(env))
    return sites


def test_slurm_every_job_hands_each_task_its_devices(slurm_gpus, batch, request):
    """The whole course through submit_all.sh on a 2-GPU 'NVIDIA', a 2-GPU 'AMD' and a CPU site
    (GPU_VENDOR=nvidia|amd|none; GPUS_PER_NODE=2, CPUS_PER_GPU=1 on the 2-core node): every job
    completes, and every task of every GPU step holds exactly one GPU of its own, the CPUs and
    threads it should, `--device cuda`, and on AMD the variables HIP reads right and the caches
    on node-local storage; the statistics hold no GPU (probe mode: no program runs)."""
    sites = batch[request.node.name]
    for vendor, (root, jobs) in sites.items():
        for job in jobs:
            wait(job, timeout=600)
            job.assert_completed()
        assert [j.name for j in jobs][0] == "00_gpu_check"

    for vendor, (root, jobs) in sites.items():
        probes = _probes(root / "probe")
        where = f"GPU_VENDOR={vendor}"
        assert set(probes) == {j.name for j in jobs}, f"{where}: jobs without a task record: {set(probes) ^ {j.name for j in jobs}}"
        for name in CPU_STEPS:
            for recs in probes[name].values():
                for rec in recs:
                    gpu_vars = {k: v for k, v in rec["env"].items() if "VISIBLE" in k or k.endswith("_GPUS")}
                    assert not gpu_vars, f"{where} {name}: a CPU-only step holds GPUs: {gpu_vars}"
        if vendor == "none":
            for name in GPU_STEPS_ONE + GPU_STEPS_NODE:
                for rec in probes[name]["0"]:
                    assert "--device" not in rec["argv"] or rec["argv"][rec["argv"].index("--device") + 1] == "cpu"
                    assert not any("VISIBLE" in k for k in rec["env"]), f"{where} {name}: {rec['env']}"
            # CPU sites keep the scripts' #SBATCH lines: 2 cores for one task, 1 core for each of 2.
            assert [len(r["cpus"]) for r in probes["00_baseline"]["0"]] == [2]
            assert [len(r["cpus"]) for r in probes["03_affinity_report"]["0"]] == [1, 1]
            continue

        def check_one_gpu(name, rec, ncpus):
            e = rec["env"]
            ids = _gpu_ids(rec, vendor)
            assert len(ids) == 1 and ids == e["SLURM_STEP_GPUS"].split(","), f"{where} {name}: {e}"
            if vendor == "amd":
                # Slurm set CUDA_VISIBLE_DEVICES to the same physical id; HIP would filter twice.
                assert e.get("CUDA_VISIBLE_DEVICES") == "0" and "HIP_VISIBLE_DEVICES" not in e, f"{where} {name}: {e}"
                for var in ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "ROCFFT_RTC_CACHE_PATH"):
                    assert e[var].startswith(str(root / "local")), f"{where} {name}: {var}={e[var]}"
                assert all(rec["dirs"].values()) and len(rec["dirs"]) == 3, f"{where} {name}: {rec['dirs']}"
            else:
                assert not any(k.startswith(("MIOPEN", "ROCFFT")) for k in e), f"{where} {name}: {e}"
            assert len(rec["cpus"]) == ncpus, f"{where} {name}: CPUs {rec['cpus']}"
            return ids[0]

        for name in GPU_STEPS_ONE:
            (rec,) = probes[name]["0"]
            check_one_gpu(name, rec, ncpus=1)
            assert rec["env"]["OMP_NUM_THREADS"] == "1" and rec["env"]["SLURM_CPUS_PER_TASK"] == "1"
            assert rec["argv"][rec["argv"].index("--device") + 1] == "cuda", rec["argv"]
        for name in GPU_STEPS_NODE + ("00_gpu_check",):
            recs = probes[name]["0"]
            assert len(recs) == 2, f"{where} {name}: {len(recs)} tasks, expected one per GPU"
            # 03_affinity_train: srun --cpu-bind=none, each rank sees the job's cores and binds itself.
            ncpus = 2 if name == "03_affinity_train" else 1
            ids = [check_one_gpu(name, r, ncpus) for r in recs]
            assert len(set(ids)) == 2, f"{where} {name}: two tasks share GPU {ids}"
            if ncpus == 1:
                assert not set(recs[0]["cpus"]) & set(recs[1]["cpus"]), f"{where} {name}: tasks share cores"
        assert "--workers" in probes["03_affinity_report"]["0"][0]["argv"], "report.py must look at the GPU"
        (node,) = probes["00_gpu_check"]["1"]
        assert sorted(_gpu_ids(node, vendor)) == ["0", "1"] and len(node["cpus"]) == 2, node
        assert node["argv"][1:4] == ["-m", "coursetools.gpucheck", "node"] and "--pytest" in node["argv"], node["argv"]


def _srun_probe(tmp_path, env_extra: dict, *srun_opts: str) -> list[dict]:
    """srun the real slurm/gpu_select.sh in front of the probe; one record per task."""
    out = tmp_path / f"probe{len(list(tmp_path.glob('probe*')))}"
    env = job_env(tmp_path / "runs", tmp_path, WELLFNO_PROBE=str(out), **env_extra)
    # -N1: on the two-node test cluster srun may otherwise spread the tasks over both nodes.
    # timeout: the step may wait in the queue behind the session's batch.
    r = subprocess.run(["srun", "--time=2", "-N1", *srun_opts,
                        "bash", str(SLURM_DIR / "gpu_select.sh"),
                        sys.executable, str(SLURM_DIR / "ci" / "probe_task.py")],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    recs = [__import__("json").loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    recs.sort(key=lambda x: int(x["env"]["SLURM_PROCID"]))
    return recs, r.stderr


@batched("test_slurm_gpu_check_passes_on_a_cpu_node_and_fails_a_gpu_site_without_gpu", gpus=2,
         seconds=20)
def _gpu_check(tmp_path, data):
    small = ("--steps", "2", "--batch-size", "2", "--grid", "8")
    cpu_root, gpu_root = tmp_path / "cpu", tmp_path / "gpu"
    cpu = sbatch("00_gpu_check.sbatch", *small, env=job_env(cpu_root, tmp_path / "data"), run_root=cpu_root)
    gpu = sbatch("00_gpu_check.sbatch", *small, run_root=gpu_root, sbatch_opts=["--ntasks=1", "--gpus-per-node=1"],
                 env=job_env(gpu_root, tmp_path / "data", GPU_VENDOR="nvidia", GPUS_PER_NODE="1"))
    return cpu, gpu


def test_slurm_gpu_check_passes_on_a_cpu_node_and_fails_a_gpu_site_without_gpu(
        slurm_gpus, batch, request):
    """00_gpu_check for real. On a CPU site every part runs and the report says no GPU: N/A;
    on a GPU site (GPU_VENDOR=nvidia, a stand-in GPU) where torch sees no GPU the job FAILS,
    so that afterok cancels the rest of the course."""
    need("coursetools/gpucheck.py")
    import json
    cpu, gpu = batch[request.node.name]
    wait(cpu, timeout=600)
    cpu.assert_completed()
    rep = json.loads((cpu.run_dir / "gpu_check" / "gpu_check.json").read_text())
    assert rep["status"] == "no GPU: N/A" and not rep["problems"], rep["problems"]
    (task,) = rep["tasks"]
    assert task["gpus"] == [] and task["cpu_check"]["matmul_ok"] and task["cpu_check"]["fft_ok"]
    assert rep["node"]["training"]["steps"] == 2
    text = (cpu.run_dir / "gpu_check" / "gpu_check.txt").read_text()
    assert text.startswith("GPU check: no GPU: N/A") and "GPU utilization: not available" in text
    wait(gpu, timeout=600)
    assert gpu.state == "FAILED", gpu.logs()
    log = gpu.out.read_text()
    assert "GPU check: FAIL" in log and "torch sees no GPU" in log, gpu.logs()
    rep = json.loads((gpu.run_dir / "gpu_check" / "gpu_check.json").read_text())
    # The jobs of this module run side by side: Slurm hands the job whichever stand-in GPU is free,
    # and the task must see exactly that one (without device cgroups, its index on the node).
    visible = rep["tasks"][0]["visible"]
    given = (visible.get("SLURM_STEP_GPUS") or visible.get("SLURM_JOB_GPUS")
             or visible["CUDA_VISIBLE_DEVICES"])
    assert given in ("0", "1", "2", "3") and visible["CUDA_VISIBLE_DEVICES"] == given, \
        f"the task did not get its stand-in GPU: {visible}"


@batched("test_slurm_gpu_site_job_without_gpus_fails_in_one_line", gpus=2, seconds=1)
def _gpu_site_without_gpus(tmp_path, data):
    run_root = tmp_path / "runs"
    env = job_env(run_root, data, GPU_VENDOR="nvidia", GPUS_PER_NODE="2")
    return sbatch("01_profiling.sbatch", env=env, run_root=run_root)


def test_slurm_gpu_site_job_without_gpus_fails_in_one_line(slurm_gpus, batch, request):
    """On a GPU site, a step submitted by plain sbatch (no GPU asked for) stops at once and says
    how to submit it."""
    job = wait(batch[request.node.name], timeout=600)
    assert job.state == "FAILED", job.logs()
    errors = error_lines(job.err.read_text())
    assert len(errors) == 1 and "has no GPU; submit it with slurm/submit_all.sh 01_profiling" in errors[0], job.logs()


# --------------------------------------------------------------------------- the course's steps
# One job of each later step's script (moved here from tests/test_NN_*.py: DESIGN.md puts a job
# script's test in this file), in the batch: they run beside the jobs above.
@batched("test_slurm_05_ddp_two_tasks", seconds=30)
def _ddp(root, data):
    return sbatch("05_ddp.sbatch", "--epochs", "1", "--batch-size", "2", "--n-steps-input", "10",
                  "--seed", "3", *SMALL_MODEL, env=job_env(root / "runs", data), run_root=root / "runs")


@pytest.mark.slow
def test_slurm_05_ddp_two_tasks(batch, request):
    """slurm/05_ddp.sbatch: srun starts 2 ranks (rendezvous from the allocation)."""
    import json
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 4
    log = job.logs()
    assert "Training on 2 rank(s) (srun, gloo backend, cpu)" in log, log


@batched("test_slurm_06_two_tasks_then_one_task_evaluates", seconds=45)
def _exact_metrics(root, data):
    return sbatch("06_exact_metrics.sbatch", "--epochs", "1", "--batch-size", "2",
                  "--n-steps-input", "10", "--seed", "3", *SMALL_MODEL, env=job_env(root / "runs", data),
                  run_root=root / "runs")


@pytest.mark.slow
def test_slurm_06_two_tasks_then_one_task_evaluates(batch, request):
    """slurm/06_exact_metrics.sbatch: 2 ranks train, then 1 task evaluates the checkpoint: the
    same validation loss."""
    import json
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    evaluation = json.loads((job.run_dir / "eval.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 4
    assert evaluation["world_size"] == 1
    assert abs(evaluation["valid_loss"] - metrics["valid_loss"]) <= 1e-6 * abs(
        metrics["valid_loss"])
    assert "Training on 2 rank(s) (srun, gloo backend, cpu)" in job.logs()


@batched("test_slurm_08_counts_the_syncs_per_step", seconds=85)
def _host_syncs(root, data):
    # --max-steps 7: the fewest --profile allows (2 warm-up + 5 traced steps; the job's own: 20)
    # batch 1: the 8 samples of SHORT_VALIDATION's data are 8 steps an epoch
    return sbatch("08_host_syncs.sbatch", "--batch-size", "1", "--max-steps", "7",
                  *SHORT_VALIDATION, *SMALL_MODEL, env=job_env(root / "runs", data), run_root=root / "runs")


@pytest.mark.slow
def test_slurm_08_counts_the_syncs_per_step(batch, request):
    """slurm/08_host_syncs.sbatch: two profiled runs, their syncs per step."""
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    out = job.out.read_text()
    assert "--log-every 1000: host syncs per traced step [0, 0, 0, 0, 0]" in out, out[-2000:]
    assert "--log-every 1: host syncs per traced step [1, 1, 1, 1, 1]" in out, out[-2000:]


@batched("test_slurm_09_runs_each_precision", seconds=85)
def _mixed_precision(root, data):
    return sbatch("09_mixed_precision.sbatch", "--max-steps", "2", "--batch-size", "2",
                  *SHORT_VALIDATION, *SMALL_MODEL, env=job_env(root / "runs", data), run_root=root / "runs")


@pytest.mark.slow
def test_slurm_09_runs_each_precision(batch, request):
    """slurm/09_mixed_precision.sbatch: float32, bf16 and fp16 side by side."""
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    from tests.test_09_mixed_precision import this_cpu_has_bf16_units  # the nodes are this machine

    # bf16 runs where the node's CPU has bf16 units (wellfno.amp refuses emulated bf16)
    amps = ("none", "bf16", "fp16") if this_cpu_has_bf16_units() else ("none", "fp16")
    for amp in amps:
        assert (job.run_dir / f"amp_{amp}" / "metrics.json").is_file(), f"no metrics.json: {amp}"
    assert job.out.read_text().count("peak memory") == len(amps)


@batched("test_slurm_efficiency_job_writes_its_table", seconds=60)
def _efficiency(root, data):
    # one round (--repeats 1): the job's table, not the best of three measurements; every row's
    # run with the short validation (the --common given after the job's own replaces it; 1 worker
    # is what the job gives a task of 1 CPU)
    return sbatch("11_compile.sbatch", "--steps", "2", "--repeats", "1", "--no-compile",
                  "--width", "8", "--batch-size", "4",
                  "--common", " ".join(("--num-workers 1 --fast-reader", *SHORT_VALIDATION)),
                  env=job_env(root / "runs", data), run_root=root / "runs")


@pytest.mark.slow
def test_slurm_efficiency_job_writes_its_table(batch, request):
    """slurm/11_compile.sbatch: the benchmark's rows, no vendor profiler on a CPU."""
    import json
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    result = json.loads((job.run_dir / "efficiency.json").read_text())
    rows = result["data"]["rows"]
    from tests.test_09_mixed_precision import this_cpu_has_bf16_units  # the nodes are this machine

    mixed = "09 mixed precision (bf16)" if this_cpu_has_bf16_units() else "09 mixed precision"
    assert [r["row"] for r in rows] == ["07 baseline", "08 no host syncs", mixed,
                                        "10 width 8, batch 4"]
    assert all(r["samples_per_s"] > 0 and r["achieved_flops_per_s"] > 0 for r in rows
               if r["skipped"] is None)
    assert (job.run_dir / "efficiency.png").is_file()
    assert "no vendor profiler run" in job.out.read_text()


@batched("test_slurm_13_domain_group_of_two_tasks_then_one_task_evaluates",
         seconds=30)
def _domain_parallel(root, data):
    return sbatch("13_domain_parallel.sbatch", "--epochs", "1", "--batch-size", "2",
                  "--n-steps-input", "10", "--seed", "3", *SMALL_MODEL, env=job_env(root / "runs", data),
                  run_root=root / "runs")


@pytest.mark.slow
def test_slurm_13_domain_group_of_two_tasks_then_one_task_evaluates(batch, request):
    """slurm/13_domain_parallel.sbatch: srun starts one domain group of 2 tasks (--domain-size =
    tasks per node), then 1 task evaluates the checkpoint: the same valid loss."""
    import json
    job = wait(batch[request.node.name], timeout=900)
    job.assert_completed()
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    evaluation = json.loads((job.run_dir / "eval.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 2
    assert evaluation["world_size"] == 1 and metrics["config"]["domain_size"] == 2
    assert abs(evaluation["valid_loss"] - metrics["valid_loss"]) <= 1e-5 * abs(
        metrics["valid_loss"])
    log = job.logs()
    assert "Training on 2 rank(s) (srun, gloo backend, cpu)" in log, log
    assert "1 data x 2 domain ranks" in log, log


@batched("test_slurm_14_a_job_array_trains_each_variant_then_collect_summarizes", seconds=60)
def _long_rollouts(root, data):
    runs = root / "runs"
    return sbatch("14_long_rollouts.sbatch", "--variants", "fno.py", "unrolled-4", "--seeds", "0",
                  "--epochs", "1", env=job_env(runs, data), run_root=runs,
                  sbatch_opts=("--array=0-1", f"--output={runs}/%x-%A_%a.out",
                               f"--error={runs}/%x-%A_%a.err"))


@pytest.mark.slow
def test_slurm_14_a_job_array_trains_each_variant_then_collect_summarizes(batch, request):
    """slurm/14_long_rollouts.sbatch as a job array (2 tasks here: 2 variants x 1 seed): each
    task trains and scores its run into the array's one folder (common.sh), each with its own
    log; then compare.py --collect, as the job's last line says, summarizes them."""
    import json
    job = batch[request.node.name]
    logs = lambda: "".join(p.read_text(errors="replace")[-2000:]  # noqa: E731
                           for p in sorted(job.run_root.glob(f"{job.name}-{job.id}_*")))
    deadline = time.monotonic() + 900
    while _cmd("squeue", "-h", "-j", job.id).stdout.strip():  # until every task has left the queue
        assert time.monotonic() < deadline, f"job array {job.id} still queued or running\n{logs()}"
        time.sleep(POLL_S)
    for task, variant in enumerate(("fno.py", "unrolled-4")):
        run = job.run_dir / variant / "seed0"
        assert (run / "evaluation.json").is_file(), f"task {task} ({variant}) did not finish\n{logs()}"
        assert (job.run_dir / f"job-task{task}.txt").is_file()  # each task's own record
    said = (job.run_root / f"{job.name}-{job.id}_1.out").read_text()
    assert f"--collect --out {job.run_dir}" in said, said
    data_dir = json.loads((job.run_dir / "fno.py" / "seed0" / "metrics.json").read_text())["config"][
        "data_dir"]  # the job's WELL_DATA
    collect = subprocess.run(
        [sys.executable, "solutions/14_long_rollouts/compare.py", "--collect", "--out", str(job.run_dir),
         "--variants", "fno.py", "unrolled-4", "--seeds", "0", "--epochs", "1", "--data-dir", data_dir],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert collect.returncode == 0, collect.stderr
    summary = json.loads((job.run_dir / "compare.json").read_text())["data"]
    assert set(summary["runs"]) == {"fno.py", "unrolled-4"}
    assert summary["runs"]["unrolled-4"][0]["flops_per_sample"] > 0
    assert (job.run_dir / "compare.png").is_file()
