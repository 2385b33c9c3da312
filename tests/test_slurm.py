"""The job scripts of slurm/, run as real jobs on a Slurm cluster.

CI starts a single-node cluster (slurm/ci/start_cluster.sh, from .ci/run); a
developer starts it with `sudo slurm/ci/install.sh && sudo slurm/ci/start_cluster.sh`.
Without a cluster these tests skip on a laptop and FAIL in CI (CI=true).
Select them with `pytest -k slurm`.

Every job runs the CPU variant on tiny generated data, and the tests check what
the job really did: its final state (COMPLETED), the files in its run folder,
the statistics against the serial program, the CPU masks against Slurm's own
cpu-bind report.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The running cluster (sinfo answers, a node is usable); skip or, in CI, fail."""
    problem = None
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        problem = "Slurm client tools (sinfo, sbatch) are not installed"
    else:
        try:
            r = _cmd("sinfo", "-h", "-N", "-o", "%N %T %c")
        except subprocess.TimeoutExpired:
            r = None
        if r is None or r.returncode != 0 or not r.stdout.strip():
            problem = "no Slurm cluster answers to sinfo" + (f" ({r.stderr.strip()})" if r else "")
        else:
            nodes = [line.split() for line in r.stdout.strip().splitlines()]
            usable = [n for n in nodes if n[1].rstrip("*~#") in ("idle", "mixed", "allocated", "completing")]
            if not usable:
                problem = f"the Slurm cluster has no usable node: {r.stdout.strip()}"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem}; .ci/run should have started the local test cluster "
                        f"(slurm/ci/start_cluster.sh)", pytrace=False)
        pytest.skip(f"{problem}; {START_HINT}")
    return {"nodes": nodes}


@pytest.fixture(scope="session")
def slurm_data(tmp_path_factory) -> Path:
    """WELL_DATA with the tiny embedded dataset, generated once per session."""
    root = tmp_path_factory.mktemp("slurm_well_data")
    r = subprocess.run([sys.executable, "-m", "wellfno.grayscott", "--data-dir", str(root),
                        "--size", "tiny"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"generating tiny data failed:\n{r.stdout}\n{r.stderr}"
    assert (root / "datasets" / DATASET / "data").is_dir()
    return root


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


def wait(job: Job, timeout: float = 180) -> Job:
    deadline = time.monotonic() + timeout
    delay = 0.5
    while time.monotonic() < deadline:
        job.state, job.exit_code = job_state(job.id)
        if job.state in TERMINAL:
            return job
        time.sleep(delay)
        delay = min(delay * 1.5, 3)
    _cmd("scancel", job.id)
    pytest.fail(f"job {job.id} ({job.name}) still {job.state} after {timeout:.0f}s; cancelled\n{job.logs()}")


def run_job(script: str, *args: str, env: dict, run_root: Path, sbatch_opts=(), timeout=180) -> Job:
    return wait(sbatch(script, *args, env=env, run_root=run_root, sbatch_opts=sbatch_opts), timeout)


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
    """Every script, the two-node one included (it cannot run on one node), parses."""
    scripts = sorted(SLURM_DIR.glob("*.sbatch")) + sorted(SLURM_DIR.glob("*.sh")) \
        + sorted((SLURM_DIR / "ci").glob("*.sh")) + [SLURM_DIR / "common.sh", SLURM_DIR / "site.env"]
    assert any(p.name == "04_stats_2nodes.sbatch" for p in scripts)
    for p in scripts:
        r = _cmd("bash", "-n", str(p))
        assert r.returncode == 0, f"{p.name}: {r.stderr}"
    two = (SLURM_DIR / "04_stats_2nodes.sbatch").read_text()
    assert re.search(r"^#SBATCH --nodes=2$", two, re.M)


def test_slurm_submit_all_dry_run_chains_steps(tmp_path):
    env = job_env(tmp_path / "runs", tmp_path / "data")
    r = subprocess.run([str(SLURM_DIR / "submit_all.sh"), "--dry-run"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    cmds = [line for line in r.stdout.splitlines() if line.startswith("sbatch ")]
    expected = sorted(p.name for p in SLURM_DIR.glob("[0-9][0-9]_*.sbatch") if "2nodes" not in p.name)
    assert [c.split()[-1].rsplit("/", 1)[-1] for c in cmds] == expected
    assert "--dependency" not in cmds[0]
    assert all("--dependency=afterok:" in c for c in cmds[1:])
    assert not (tmp_path / "runs").exists(), "a dry run must not create anything"
    r = subprocess.run([str(SLURM_DIR / "submit_all.sh"), "--dry-run", "--with-2nodes", "04"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert "04_stats_2nodes.sbatch" in r.stdout and "00_baseline" not in r.stdout


def test_slurm_baseline_trains_and_writes_results(slurm_cluster, tmp_path):
    """00_baseline on an EMPTY data folder: generates tiny data, trains, writes its results."""
    need("fno.py")
    need("wellfno/grayscott.py")
    well_data, run_root = tmp_path / "data", tmp_path / "runs"
    job = run_job("00_baseline.sbatch", "--epochs", "1", "--max-steps", "5",
                  env=job_env(run_root, well_data), run_root=run_root, timeout=240)
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


@pytest.mark.parametrize("script", ["04_stats.sbatch", "04_stats_torchrun.sbatch"])
def test_slurm_stats_two_tasks_equal_serial(slurm_cluster, slurm_data, tmp_path, script):
    """Statistics with 2 ranks (srun -n 2, or torchrun with 2 workers) == the serial program."""
    need("stats.py")
    need("solutions/04_distributed_stats/stats.py")
    dataset_dir = slurm_data / "datasets" / DATASET
    serial = tmp_path / "serial.yaml"
    r = subprocess.run([sys.executable, "stats.py", str(dataset_dir), "--out", str(serial)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"serial stats.py failed:\n{r.stderr}"
    run_root = tmp_path / "runs"
    job = run_job(script, env=job_env(run_root, slurm_data), run_root=run_root,
                  sbatch_opts=["--ntasks=2"] if script == "04_stats.sbatch" else [])
    job.assert_completed()
    assert "ntasks=2" in (job.run_dir / "job.txt").read_text()
    expected = yaml.safe_load(serial.read_text())
    got = yaml.safe_load((job.run_dir / "stats.yaml").read_text())
    assert _count_numbers(expected) > 0, "serial stats.yaml holds no numbers"
    _assert_same_numbers(got, expected)


@pytest.mark.parametrize("ntasks,cpus_per_task", [(2, 1), (1, 2)])
def test_slurm_affinity_report_shows_slurm_masks(slurm_cluster, slurm_data, tmp_path, ntasks, cpus_per_task):
    """Each rank reports exactly the CPUs of the mask Slurm says it applied; with
    --cpus-per-task=2 the step gets 2 CPUs per task (SRUN_CPUS_PER_TASK passed on)."""
    need("affinity/report.py")
    run_root = tmp_path / "runs"
    job = run_job("03_affinity_report.sbatch", env=job_env(run_root, slurm_data), run_root=run_root,
                  sbatch_opts=[f"--ntasks={ntasks}", f"--cpus-per-task={cpus_per_task}"])
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


def test_slurm_bad_site_settings_fail_in_one_line(slurm_cluster, slurm_data, tmp_path):
    """A wrong GPU_VENDOR, a missing dataset, an empty WELL_DATA in site.env: the job
    FAILS with one `error:` line that names the setting."""
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
    for job, needle in jobs:
        wait(job, timeout=60)
        assert job.state == "FAILED", f"job {job.id} ended {job.state}, expected FAILED\n{job.logs()}"
        errors = error_lines(job.err.read_text())
        assert len(errors) == 1 and needle in errors[0], f"expected one error line about {needle}\n{job.logs()}"


def test_slurm_baseline_requeues_itself_near_time_limit(slurm_cluster, slurm_data, tmp_path):
    """The signal Slurm sends before the time limit (--signal=B:USR1@...) makes the
    baseline job requeue itself under the same id, so it finds its run folder again.
    (Slurm holds a requeued job ~2 minutes before it may start again: the test stops there.)"""
    need("fno.py")
    run_root = tmp_path / "runs"
    job = sbatch("00_baseline.sbatch", "--epochs", "1", "--max-steps", "5",
                 env=job_env(run_root, slurm_data), run_root=run_root)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the training step runs: the trap is set
            steps = _cmd("squeue", "-h", "-s", "-j", job.id, "-o", "%i").stdout.split()
            if f"{job.id}.0" in steps:  # not just the .batch/.extern steps
                break
            job.state, _ = job_state(job.id)
            assert job.state not in TERMINAL, f"job ended {job.state} before it could be signalled\n{job.logs()}"
            time.sleep(0.3)
        else:
            pytest.fail(f"job {job.id} never started its training step\n{job.logs()}")
        r = _cmd("scancel", "--batch", "--signal=USR1", job.id)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 60
        info = ""
        while time.monotonic() < deadline:
            info = _cmd("scontrol", "show", "job", "-o", job.id).stdout
            if re.search(r"Restarts=1\b", info) and re.search(r"JobState=(PENDING|REQUEUED)", info):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"job {job.id} was not requeued: {info}\n{job.logs()}")
        assert "requeueing job" in job.err.read_text()
        assert job.run_dir.is_dir()
    finally:
        _cmd("scancel", job.id)


def test_slurm_profiling_writes_trace_summary_and_timeline(slurm_cluster, slurm_data, tmp_path):
    """01_profiling: the profiled solution writes a valid Chrome trace with 5 recorded steps."""
    need("solutions/01_profiling/fno.py")
    import gzip
    import json
    run_root = tmp_path / "runs"
    job = run_job("01_profiling.sbatch", "--max-steps", "8", "--batch-size", "4",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=240)
    job.assert_completed()
    traces = sorted(job.run_dir.glob("trace_rank0_steps*.json.gz"))
    assert len(traces) == 1, f"no trace in {job.run_dir}\n{job.logs()}"
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 5, steps
    assert any(p.suffix == ".png" for p in job.run_dir.iterdir()), "no timeline picture"
    assert "forward" in (job.run_dir / "profile_summary.txt").read_text()


def test_slurm_throughput_sweep_writes_its_table(slurm_cluster, slurm_data, tmp_path):
    """02_throughput: a minimal sweep runs as a job and writes json/csv/png with the measured columns."""
    need("profiling/throughput.py")
    import json
    run_root = tmp_path / "runs"
    job = run_job("02_throughput.sbatch", "--workers", "0,1", "--readers", "fast", "--seconds", "0.3",
                  "--warmup", "1", "--repeats", "1", "--batch-size", "4",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=240)
    job.assert_completed()
    result = json.loads((job.run_dir / "throughput.json").read_text())
    rows = result["rows"] if isinstance(result, dict) else result
    assert {r["num_workers"] for r in rows} == {0, 1}
    for r in rows:
        assert r["data_only"] > 0 and r["compute_only"] > 0 and r["full"] > 0, r
    assert (job.run_dir / "throughput.csv").is_file() and (job.run_dir / "throughput.png").is_file()


def test_slurm_affinity_train_binds_each_rank_and_its_workers(slurm_cluster, slurm_data, tmp_path):
    """03_affinity_train: two ranks bind themselves to disjoint cores; workers stay inside their rank's."""
    need("solutions/03_affinity/fno.py")
    run_root = tmp_path / "runs"
    job = run_job("03_affinity_train.sbatch", "--epochs", "1", "--max-steps", "1", "--batch-size", "8",
                  env=job_env(run_root, slurm_data), run_root=run_root, timeout=240,
                  sbatch_opts=["--ntasks=2", "--cpus-per-task=1"])
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
