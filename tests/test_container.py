"""The course's container image (containers/), built from the recipe with podman and run.

The image: containers/build.sh (the CPU base made locally when podman lacks it, then the course's
layer: containers/Containerfile). Inside it, with a copy of the repository bind-mounted at
/course (as participants mount theirs): make demo's training on the embedded data (the same
numbers as the same run outside the container: same torch, same data, one thread), make
test-fast on CONTAINER_FAST_TESTS, and the day-0 check's dry run; then each setup mistake is one
`error:` line naming its fix (wellfno-container-check, containers/install-course.sh).

Skipped, saying so, only where podman is absent; CI installs it (.ci/run: make test-container).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coursetools import day0
from tests.conftest import REPO

# every test but the first builds or runs the image: make test-container, not make test
container = pytest.mark.container
IMAGE = os.environ.get("WELLFNO_IMAGE", "localhost/wellfno-course:cpu")
CONF = REPO / "containers" / "containers.conf"
ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONF))}
FAST_TESTS = os.environ.get(
    "CONTAINER_FAST_TESTS",
    "tests/test_fno.py tests/test_cli.py tests/test_grayscott.py tests/test_imports.py")
METRICS = ("train_loss", "valid_loss", "rollout_vrmse", "persistence_vrmse")


def load_check():
    spec = importlib.util.spec_from_file_location(
        "container_check", REPO / "containers" / "container-check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_knows_the_oldest_supported_torch():
    """Runs without podman: the image's check and the course agree on the oldest torch."""
    from wellfno.cli import OLDEST_TORCH

    assert load_check().OLDEST_TORCH == OLDEST_TORCH
    text = (REPO / "containers" / "install-course.sh").read_text()
    assert f"OLDEST_TORCH=${{OLDEST_TORCH:-{'.'.join(map(str, OLDEST_TORCH))}}}" in text


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None:
        pytest.skip("podman not found: the container tests build the image with it "
                    "(apt-get install podman debootstrap runc; .ci/run installs them)")
    r = subprocess.run(["bash", str(REPO / "containers" / "build.sh")], env=ENV,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "container check: ok: repository at /course" in r.stdout, r.stdout[-2000:]
    return IMAGE


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A copy of the repository's files (tracked and new, as git lists them: no venvs, data or
    runs), mounted in place of the participant's; data and runs beside it."""
    root = tmp_path_factory.mktemp("container")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (root / "repo" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / "repo" / name)
    (root / "data").mkdir()
    (root / "runs").mkdir()
    return root


def podman(image, course, *command, mount_repo=True, options=(), timeout=900):
    args = ["podman", "run", "--rm", "--network", "none", "-e", "OMP_NUM_THREADS=1",
            "-v", f"{course / 'data'}:/data", "-v", f"{course / 'runs'}:/runs", *options]
    if mount_repo:
        args += ["-v", f"{course / 'repo'}:/course"]
    return subprocess.run([*args, image, *command], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def one_error(r) -> str:
    """The run failed with exactly one `error:` line, and no traceback: that line."""
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr
    return errors[0]


@container
def test_make_demo_trains_inside_as_outside(image, course):
    """make demo in the image, on the embedded data: the image's venv (make installs nothing),
    the mounted repository's fno.py, and the numbers of the same run outside the container."""
    r = podman(image, course, "bash", "-c",
               "python -m wellfno.grayscott --data-dir /data --size tiny --seed 0 && "
               "make demo DATA_DIR=/data DEMO_OUT=/runs/demo")
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "/opt/wellfno-venv/bin/python fno.py --data-dir /data --out /runs/demo" in r.stdout
    assert "pip" not in r.stdout and "Found torch" not in r.stdout  # the venv step did nothing
    inside = json.loads((course / "runs" / "demo" / "metrics.json").read_text())
    outside_dir = course / "outside"
    subprocess.run([sys.executable, str(REPO / "fno.py"), "--data-dir", str(course / "data"),
                    "--out", str(outside_dir)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                   capture_output=True, check=True, timeout=600)
    outside = json.loads((outside_dir / "metrics.json").read_text())
    assert {k: inside[k] for k in METRICS} == {k: outside[k] for k in METRICS}


@container
def test_an_edit_of_the_mounted_repository_is_seen_inside(image, course):
    module = course / "repo" / "wellfno" / "_container_probe.py"
    module.write_text("ANSWER = 41 + 1\n")
    try:
        r = podman(image, course, "python", "-c",
                   "import wellfno._container_probe as m; print(m.ANSWER, m.__file__)")
    finally:
        module.unlink()
    assert r.stdout.split() == ["42", "/course/wellfno/_container_probe.py"], r.stderr


@container
def test_make_test_fast_inside(image, course):
    r = podman(image, course, "make", "test-fast", f"FAST_TESTS={FAST_TESTS}",
               "XDIST=-n 2 -p no:cacheprovider", timeout=1500)
    tail = f"{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    assert r.returncode == 0, tail
    assert " passed" in r.stdout.splitlines()[-1] and " failed" not in r.stdout, tail


@container
def test_day0_dry_run_inside(image, course):
    """tests/device/day0.sh's dry run (as tests/test_day0.py runs it) with the image's Python:
    every step ok, and nothing added from wheels (the image has the course's packages)."""
    r = podman(image, course, "env", "DAY0_DRY_RUN=1", "DAY0_SECONDS=240", "PIP_NO_INDEX=1",
               "OUT=/runs/day0", "DAY0_SCRATCH=/runs/day0_scratch", "DAY0_WHEELS=/runs/none",
               "bash", "tests/device/day0.sh", timeout=900)
    assert r.returncode == 0, f"{r.stdout[-5000:]}\n{r.stderr[-2000:]}"
    steps = day0.read_steps(course / "runs" / "day0_scratch" / "steps.tsv")
    assert [(s["name"], s["outcome"]) for s in steps] == [
        (name, "ok") for name in
        ("site", "toolchain", "task", "data", "compile", "node", "report", "collect", "ladder")]
    assert json.loads((course / "runs" / "day0_scratch" / "site.json").read_text())["added"] == {}
    text = (course / "runs" / "day0" / "day0.txt").read_text()
    assert text.startswith("day-0 check: INCOMPLETE") and "GPU check: no GPU: N/A" in text, text


@container
def test_the_check_passes_with_the_repository_mounted(image, course):
    r = podman(image, course)  # the image's default command: wellfno-container-check
    assert r.returncode == 0 and r.stdout == (
        "container check: ok: repository at /course; torch 2.13.0+cpu (CPU-only), "
        "no GPU on this node\n"), r.stdout + r.stderr


@container
def test_the_repository_not_mounted_is_one_line(image, course):
    line = one_error(podman(image, course, mount_repo=False))
    assert line.startswith("error: the course's repository is not mounted at /course (fno.py, ")
    assert '-v "$PWD":/course' in line and '--bind "$PWD":/course' in line


def fake_torch(folder: Path, version: str, cuda: str | None = None, hip: str | None = None):
    """A torch module on PYTHONPATH that reports a version and a build, and sees no GPU: the
    check reads only these (a real old or GPU torch is gigabytes; the check cannot tell)."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(
        f"__version__ = {version!r}\n"
        f"class version:\n    cuda = {cuda!r}\n    hip = {hip!r}\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n"
        "    device_count = staticmethod(lambda: 0)\n")
    return ["-v", f"{folder}:/fake:ro", "-e", "PYTHONPATH=/fake"]


@container
def test_an_old_torch_is_one_line(image, course, tmp_path):
    from wellfno.cli import OLDEST_TORCH

    older = f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1] - 1}.1"
    line = one_error(podman(image, course, options=fake_torch(tmp_path, older)))
    assert line.startswith(f"error: the image's torch {older} is older than "
                           f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}, the oldest"), line
    assert "rebuild on a newer PyTorch image" in line
    # the build stops on it too, before making anything
    line = one_error(podman(image, course, "env", "VENV=/tmp/v", "SRC=/course",
                            "bash", "containers/install-course.sh",
                            options=fake_torch(tmp_path / "b", older)))
    assert line.startswith(f"error: the base image's torch {older} is older than"), line


@container
@pytest.mark.parametrize("options,needle", [
    (["--device", "/dev/null:/dev/nvidia0"], "NVIDIA GPU (/dev/nvidia0)"),
    (["--device", "/dev/null:/dev/kfd"], "AMD GPU (/dev/kfd)"),
    (["-e", "ROCR_VISIBLE_DEVICES=0"], "AMD GPU (ROCR_VISIBLE_DEVICES=0)"),
])
def test_a_gpu_torch_does_not_see_is_one_line(image, course, options, needle):
    """A GPU node's device files (or Slurm's GPU selection) but torch sees no GPU: with this
    CPU-only torch, the fix is the image's base."""
    line = one_error(podman(image, course, options=options))
    assert f"this node has a {needle} but torch 2.13.0+cpu (CPU-only) inside" in line, line
    assert "rebuild it on the site's PyTorch image" in line


@container
@pytest.mark.parametrize("build,device,flag", [
    ({"cuda": "12.4"}, "/dev/nvidia0", "apptainer exec --nv"),
    ({"hip": "6.2"}, "/dev/kfd", "apptainer exec --rocm"),
])
def test_a_gpu_build_started_without_its_gpu_is_one_line(image, course, tmp_path, build, device,
                                                         flag):
    """A GPU build of torch that sees no GPU: the container was started without it."""
    options = [*fake_torch(tmp_path, "2.7.1", **build), "--device", f"/dev/null:{device}"]
    line = one_error(podman(image, course, options=options))
    assert f"but torch 2.7.1 ({'CUDA 12.4' if 'cuda' in build else 'ROCm 6.2'}) inside" in line
    assert flag in line and "podman-hpc run --gpu" in line, line


def wheel(folder: Path, name: str, version: str, requires=()):
    """A minimal pure-Python wheel (metadata only): what pip's resolver reads."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\n"
                     f"Name: {name}\nVersion: {version}\n"
                     + "".join(f"Requires-Dist: {r}\n" for r in requires))
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                     "Tag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


@container
def test_a_requirement_that_would_replace_torch_is_one_line(image, course, tmp_path):
    """install-course.sh with a requirement asking for a newer torch than the image's: pip's dry
    run says it would install one; the build stops there, the image's torch untouched."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "torch", "99.0")
    wheel(wheels, "needs-new-torch", "1.0", ["torch>=99"])
    (wheels / "requirements.txt").write_text("needs-new-torch==1.0\n")
    r = podman(image, course, "bash", "-c",
               "VENV=/tmp/v SRC=/course REQUIREMENTS=/fake/requirements.txt "
               "bash containers/install-course.sh; rc=$?; python -c 'import torch; "
               "print(torch.__version__)' >&2; exit $rc",
               options=["-v", f"{wheels}:/fake:ro", "-e", "PIP_NO_INDEX=1",
                        "-e", "PIP_FIND_LINKS=/fake"])
    line = one_error(r)
    assert line.startswith("error: pip would install torch 99.0 over the base image's torch "
                           "2.13.0+cpu (asked for by needs-new-torch==1.0)"), line
    assert "never let pip replace the site's torch build" in line
    assert r.stderr.splitlines()[-1] == "2.13.0+cpu"  # the image's torch, still
