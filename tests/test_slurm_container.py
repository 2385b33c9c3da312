"""The job scripts with CONTAINER_EXEC (slurm/site.env): every program inside a container.

Without podman or Apptainer, a stand-in runtime (tests/container_standin/record_exec.sh) takes
the container's place: it records the command and the environment srun handed it, then runs
the program with an image's PATH, as a runtime would. Each job runs twice in the session's
batch (tests/test_slurm.py), with and without it, and the two give the same results:
- 04_stats (srun -n 2) and 04_stats_torchrun (2 workers): stats.yaml byte for byte;
- 05_ddp and 06_exact_metrics (2 ranks): the same checkpoint, parameter for parameter, the
  same losses; 06's one-task evaluation too;
- 08_host_syncs: the same host syncs per traced step;
and the runtime was handed each rank with its Slurm rank variables (torchrun's `env -u` inside
the container, after them), no host venv, the image's python in the job log.
- A badly configured container (environment not passed, the repository / WELL_DATA / RUN_ROOT
  not bound, no python on the image's PATH, not started in the repository) and bad settings:
  each job FAILS with one `error:` line naming the fix.
- On two nodes (tests/test_slurm_2nodes.py's cluster): 04_stats_2nodes inside the stand-in,
  bit for bit the serial statistics; 05_ddp over 2 x 2 ranks inside it, equal to one rank
  with the global batch.
- Outside Slurm (a workstation: the job script run with bash) the same check and results.
- With real podman and the course image (containers/, localhost/wellfno-course:cpu or
  WELLFNO_TEST_IMAGE): 04_stats bit for bit and 05 on one rank (valid_loss within 1e-5)
  inside vs outside; skipped, saying why, where podman or the image is missing.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ddp_helpers import SMALL_MODEL
from tests.test_slurm import (
    REPO,
    SLURM_DIR,
    batch,  # noqa: F401
    batched,
    error_lines,
    job_env,
    sbatch,
    serial_stats,  # noqa: F401
    slurm_cluster,  # noqa: F401
    slurm_data,  # noqa: F401
    wait,
)

STANDIN = REPO / "tests" / "container_standin" / "record_exec.sh"
VENV_BIN = str(Path(sys.executable).parent)
# The stand-in image's PATH: where this Python lives (the image's python), then the system's.
IMAGE_PATH = f"{VENV_BIN}:/usr/bin:/bin"
TRAIN = ("--epochs", "1", "--batch-size", "2", "--n-steps-input", "10", "--seed", "3", *SMALL_MODEL)


def standin(records: Path, *options: str) -> str:
    return f"bash {STANDIN} --out {records} --path {IMAGE_PATH} {' '.join(options)} --"


def container_env(run_root: Path, data: Path, records: Path, *options: str, **extra: str) -> dict:
    """job_env with the stand-in as CONTAINER_EXEC, submitted from an activated host venv
    (VIRTUAL_ENV and its bin/ on PATH, as a participant's shell): the job must drop both."""
    env = job_env(run_root, data, CONTAINER_EXEC=standin(records, *options))
    env.pop("SITE_VENV", None)      # the default with a container: none
    env.pop("PYTHON", None)         # the image's `python`, found on its PATH
    env["VIRTUAL_ENV"] = str(Path(VENV_BIN).parent)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    return env | extra


def records(folder: Path) -> list[dict]:
    """What the stand-in was handed, one dict per call: argv, env."""
    out = []
    for argv in sorted(folder.glob("*.argv")):
        raw = argv.with_suffix(".env").read_bytes().split(b"\0")
        env = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
        out.append({"argv": argv.read_text().splitlines(), "env": env})
    return out


def program_calls(recs: list[dict], program: str) -> list[dict]:
    return [r for r in recs if any(a.endswith(program) for a in r["argv"])]


def assert_no_host_venv(recs: list[dict]):
    for r in recs:
        assert "VIRTUAL_ENV" not in r["env"], r["env"].get("VIRTUAL_ENV")
        assert VENV_BIN not in r["env"]["PATH"].split(":"), r["env"]["PATH"]


def assert_python_in_container(job):
    text = (job.run_dir / "job.txt").read_text()
    assert f"python={VENV_BIN}/python (in the container)" in text, text


def pair(script: str, root: Path, data: Path, *args: str, sbatch_opts=()) -> dict:
    """The job without and with the stand-in container, submitted side by side."""
    plain = sbatch(script, *args, env=job_env(root / "plain", data), run_root=root / "plain",
                   sbatch_opts=sbatch_opts)
    rec = root / "records"
    inside = sbatch(script, *args, env=container_env(root / "inside", data, rec),
                    run_root=root / "inside", sbatch_opts=sbatch_opts)
    return {"plain": plain, "inside": inside, "records": rec}


def both_completed(jobs: dict, timeout=900):
    for key in ("plain", "inside"):
        wait(jobs[key], timeout=timeout)
        jobs[key].assert_completed()
    return jobs["plain"], jobs["inside"], records(jobs["records"])


def same_parameters(a: Path, b: Path):
    pa = torch.load(a, map_location="cpu", weights_only=True)["model"]
    pb = torch.load(b, map_location="cpu", weights_only=True)["model"]
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), f"{name} differs inside the container"


def check_step(recs: list[dict], n_nodes: int = 1):
    """The start-of-job check: one srun step, one task per node, through the runtime."""
    checks = [r for r in recs if r["argv"][:2] == ["/bin/sh", "-c"]]
    assert len(checks) == n_nodes, [r["argv"][:3] for r in recs]
    assert all(r["env"].get("SLURM_STEP_ID") == "0" for r in checks)


# --------------------------------------------------------------------------- the same results
STATS = ("04_stats.sbatch", "04_stats_torchrun.sbatch")


@batched(f"test_slurm_container_stats_equal_no_container[{STATS[0]}]", seconds=15, script=STATS[0])
@batched(f"test_slurm_container_stats_equal_no_container[{STATS[1]}]", seconds=15, script=STATS[1])
def _stats(root, data, script):
    return pair(script, root, data, sbatch_opts=["--ntasks=2"] if script == STATS[0] else [])


@pytest.mark.slurm
@pytest.mark.parametrize("script", STATS)
def test_slurm_container_stats_equal_no_container(batch, request, script):
    """04_stats (srun -n 2) and 04_stats_torchrun inside the stand-in: stats.yaml byte for byte
    the one without a container; each rank (srun) or the one torchrun went through the runtime
    with its Slurm rank variables; torchrun's `env -u` ran inside, after it."""
    plain, inside, recs = both_completed(batch[request.node.name])
    assert (inside.run_dir / "stats.yaml").read_bytes() == (plain.run_dir / "stats.yaml").read_bytes()
    check_step(recs)
    calls = program_calls(recs, "stats.py")
    if script == "04_stats.sbatch":
        assert sorted(r["env"]["SLURM_PROCID"] for r in calls) == ["0", "1"]
        assert all(r["argv"][0] == "python" for r in calls), [r["argv"] for r in calls]
    else:
        assert len(calls) == 1 and calls[0]["env"]["SLURM_PROCID"] == "0"
        argv = calls[0]["argv"]
        assert argv[:3] == ["env", "-u", "SLURM_PROCID"], argv
        assert "torch.distributed.run" in argv and "--nproc-per-node=2" in argv, argv
    assert_no_host_venv(recs)
    assert_python_in_container(inside)


@batched("test_slurm_container_05_ddp_equals_no_container", seconds=60)
def _ddp(root, data):
    return pair("05_ddp.sbatch", root, data, *TRAIN)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_container_05_ddp_equals_no_container(batch, request):
    """05_ddp's 2 ranks inside the stand-in: the same parameters and losses as without."""
    plain, inside, recs = both_completed(batch[request.node.name])
    same_parameters(plain.run_dir / "checkpoint.pt", inside.run_dir / "checkpoint.pt")
    a = json.loads((plain.run_dir / "metrics.json").read_text())
    b = json.loads((inside.run_dir / "metrics.json").read_text())
    assert b["world_size"] == 2 and b["valid_loss"] == a["valid_loss"], (a, b)
    assert "Training on 2 rank(s) (srun, gloo backend, cpu)" in inside.logs()
    calls = program_calls(recs, "solutions/05_ddp/fno.py")
    assert sorted(r["env"]["SLURM_PROCID"] for r in calls) == ["0", "1"]
    check_step(recs)
    assert_no_host_venv(recs)


@batched("test_slurm_container_06_equals_no_container", seconds=90)
def _exact(root, data):
    return pair("06_exact_metrics.sbatch", root, data, *TRAIN)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_container_06_equals_no_container(batch, request):
    """06_exact_metrics inside the stand-in: 2 ranks train, 1 task evaluates; the same
    checkpoint and validation losses as without a container."""
    plain, inside, recs = both_completed(batch[request.node.name])
    same_parameters(plain.run_dir / "checkpoint.pt", inside.run_dir / "checkpoint.pt")
    for name in ("metrics.json", "eval.json"):
        a = json.loads((plain.run_dir / name).read_text())
        b = json.loads((inside.run_dir / name).read_text())
        assert b["valid_loss"] == a["valid_loss"], (name, a["valid_loss"], b["valid_loss"])
    calls = program_calls(recs, "solutions/06_exact_metrics/fno.py")
    assert len(calls) == 3 and sum("--eval-only" in r["argv"] for r in calls) == 1
    check_step(recs)


@batched("test_slurm_container_08_equals_no_container", seconds=170)
def _syncs(root, data):
    return pair("08_host_syncs.sbatch", root, data, "--batch-size", "1", "--max-steps", "7",
                "--n-steps-input", "10", *SMALL_MODEL)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_container_08_equals_no_container(batch, request):
    """08_host_syncs inside the stand-in: the two profiled runs and the batch shell's count of
    syncs (in_container) give the lines they give without a container."""
    plain, inside, recs = both_completed(batch[request.node.name])

    def counts(job):
        return [line for line in job.out.read_text().splitlines() if "host syncs per traced step" in line]
    assert counts(plain) and counts(inside) == counts(plain), (counts(plain), counts(inside))
    assert len(program_calls(recs, "solutions/08_host_syncs/fno.py")) == 2
    # the two counts ran in the batch shell through the runtime too (profiling's python)
    assert sum(r["argv"][:2] == ["python", "-c"] for r in recs) == 2, [r["argv"][:2] for r in recs]


# --------------------------------------------------------------------------- what goes wrong
def _bad_cases(root: Path, data: Path) -> list[tuple[dict, str]]:
    """(job env, the words its one error line must hold) for each way a container is set wrong."""
    run_root = root / "runs"
    rec = root / "records"
    hide_ok = subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    cases = [
        (container_env(run_root, data, rec, "--clean-env"), "--env-host"),
        (container_env(run_root, data, rec, "--cd", "/"), "-w "),
        (container_env(run_root, data, rec) | {"CONTAINER_EXEC": f"bash {STANDIN} --out {rec} --path /nonexistent --"},
         "--env PATH="),
        (container_env(run_root, data, rec) | {"CONTAINER_EXEC": "no-such-runtime exec img.sif"},
         "'no-such-runtime' not found"),
        (container_env(run_root, data, rec, SITE_VENV=str(Path(VENV_BIN).parent)), "SITE_VENV="),
        (container_env(run_root, data, rec) | {"CONTAINER_EXEC": "apptainer exec 'img.sif"},
         "is not a command line"),
    ]
    if Path("/usr/bin/python3").exists():
        # an image whose own PYTHONPATH wins (Apptainer) and whose python has no course install
        cases.append((container_env(run_root, data, rec, "--env", "PYTHONPATH=/nonexistent",
                                    PYTHON="/usr/bin/python3"), "--env PYTHONPATH="))
    if hide_ok:
        cases += [
            # the check only looks python up: `sh` stands in for one outside the hidden repository
            (container_env(run_root, data, rec, "--hide", str(REPO), PYTHON="sh"),
             f"repository {REPO} is not visible"),
            (container_env(run_root, data, rec, "--hide", str(data)), "WELL_DATA="),
            (container_env(run_root, data, rec, "--hide", str(run_root)), "bind RUN_ROOT"),
        ]
    return cases


@batched("test_slurm_container_misconfigured_fails_in_one_line", seconds=2)
def _bad(root, data):
    return [(sbatch("04_stats.sbatch", env=env, run_root=root / "runs"), needle)
            for env, needle in _bad_cases(root, data)]


@pytest.mark.slurm
def test_slurm_container_misconfigured_fails_in_one_line(batch, request):
    """Each container set wrong (under Slurm: the check is an srun step): the job FAILS with
    one `error:` line, which names the fix; without user namespaces (unshare -rm) the three
    unbound-path cases are left out, without /usr/bin/python3 the foreign-PYTHONPATH one."""
    jobs = batch[request.node.name]
    assert len(jobs) >= 6
    for job, needle in jobs:
        wait(job, timeout=300)
        assert job.state == "FAILED", f"job {job.id} ({needle!r}) ended {job.state}, expected FAILED\n{job.logs()}"
        errors = error_lines(job.err.read_text())
        assert len(errors) == 1 and needle in errors[0], f"expected one error line with {needle!r}\n{job.logs()}"


# --------------------------------------------------------------------------- outside Slurm
def _bash_job(script: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    return subprocess.run(["bash", str(SLURM_DIR / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("container_data")
    r = subprocess.run([sys.executable, "-m", "wellfno.grayscott", "--data-dir", str(root), "--size", "tiny"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return root


def _run_dir(r: subprocess.CompletedProcess) -> Path:
    for line in r.stdout.splitlines():
        if line.startswith("results: "):
            return Path(line.split()[1]).parent
    raise AssertionError(f"no results line\n{r.stdout}\n{r.stderr}")


def test_container_outside_slurm_stats_equal_and_bad_case(tiny_data, tmp_path):
    """A job script run with bash (no Slurm: a workstation) through the stand-in: the check runs,
    stats.yaml is byte for byte the one without a container; the environment not passed is one
    error line."""
    plain = _bash_job("04_stats.sbatch", job_env(tmp_path / "plain", tiny_data))
    assert plain.returncode == 0, plain.stderr
    rec = tmp_path / "records"
    inside = _bash_job("04_stats.sbatch", container_env(tmp_path / "inside", tiny_data, rec))
    assert inside.returncode == 0, inside.stderr
    assert (_run_dir(inside) / "stats.yaml").read_bytes() == (_run_dir(plain) / "stats.yaml").read_bytes()
    assert f"python={VENV_BIN}/python (in the container)" in inside.stdout
    recs = records(rec)
    assert [r["argv"][:2] for r in recs].count(["/bin/sh", "-c"]) == 1
    assert len(program_calls(recs, "stats.py")) == 1
    assert_no_host_venv(recs)
    bad = _bash_job("04_stats.sbatch", container_env(tmp_path / "bad", tiny_data, rec, "--clean-env"))
    assert bad.returncode == 2
    errors = error_lines(bad.stderr)
    assert len(errors) == 1 and "--env-host" in errors[0], bad.stderr


# --------------------------------------------------------------------------- real podman
IMAGE = os.environ.get("WELLFNO_TEST_IMAGE", "localhost/wellfno-course:cpu")


def _podman_exec(image: str, paths: list[Path]) -> str:
    """CONTAINER_EXEC for podman, as slurm/site.env documents it, with the image's own PATH."""
    r = subprocess.run(["podman", "image", "inspect", "--format", "{{json .Config.Env}}", image],
                       capture_output=True, text=True, timeout=60, env=os.environ | _podman_env())
    env = dict(e.split("=", 1) for e in json.loads(r.stdout or "[]") or [] if "=" in e)
    image_path = env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    binds = " ".join(f"-v {p}:{p}" for p in paths)
    return (f"podman run --rm --env-host --network host --env PATH={image_path} {binds} "
            f"-w {REPO} {image}")


def _podman_env() -> dict:
    """The environment podman runs in: containers/containers.conf where this machine needs it
    (the recipe's; CONTAINERS_CONF from the caller wins)."""
    conf = REPO / "containers" / "containers.conf"
    return {"CONTAINERS_CONF": str(conf)} if conf.exists() and "CONTAINERS_CONF" not in os.environ else {}


def find_podman_image() -> tuple[str, str] | str:
    """(the image, its python's name), or why there is none (a skip's reason)."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman); the stand-in tests cover the job scripts"
    env = os.environ | _podman_env()
    r = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True, timeout=60, env=env)
    if r.returncode != 0:
        return f"no image {IMAGE} in podman (build it from containers/, or set WELLFNO_TEST_IMAGE)"
    r = subprocess.run(["podman", "run", "--rm", IMAGE, "sh", "-c", "command -v python || command -v python3"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip(), f"no python in {IMAGE}: {r.stdout}{r.stderr}"
    return IMAGE, Path(r.stdout.split()[0]).name


def podman_job_env(run_root: Path, data: Path, image: str, python: str) -> dict:
    """job_env with real podman as CONTAINER_EXEC (RUN_ROOT created: podman -v needs it)."""
    run_root.mkdir(parents=True, exist_ok=True)
    env = job_env(run_root, data, CONTAINER_EXEC=_podman_exec(image, [REPO, data, run_root]),
                  PYTHON=python, **_podman_env())
    env.pop("SITE_VENV")
    return env


@pytest.fixture(scope="module")
def podman_image() -> tuple[str, str]:
    found = find_podman_image()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.mark.slow
def test_container_podman_stats_and_one_rank_training_equal_outside(podman_image, tiny_data, tmp_path):
    """The job scripts with real podman and the course image (outside Slurm: one rank): 04_stats
    byte for byte and 05_ddp's one-rank valid_loss (within 1e-5: the image's torch may be
    another build) equal to the same jobs with this venv."""
    runs_out, runs_in = tmp_path / "outside", tmp_path / "inside"
    env_in = podman_job_env(runs_in, tiny_data, *podman_image)
    for script, args in (("04_stats.sbatch", ()), ("05_ddp.sbatch", TRAIN)):
        out = _bash_job(script, job_env(runs_out, tiny_data), *args)
        assert out.returncode == 0, out.stderr[-3000:]
        inside = _bash_job(script, env_in, *args)
        assert inside.returncode == 0, inside.stderr[-3000:]
        assert "(in the container)" in inside.stdout, inside.stdout
        a, b = _run_dir(out), _run_dir(inside)
        if script == "04_stats.sbatch":
            assert (b / "stats.yaml").read_bytes() == (a / "stats.yaml").read_bytes()
        else:
            va = json.loads((a / "metrics.json").read_text())["valid_loss"]
            vb = json.loads((b / "metrics.json").read_text())["valid_loss"]
            assert math.isclose(va, vb, rel_tol=1e-5), (va, vb)

