"""tests/device/day0.sh on a stand-in of the machine it was written for, on the CPU.

The lent machine (issue #40): a bare image whose `python3` is a venv's interpreter holding torch
(and numpy, h5py, matplotlib, pytest, pytest-xdist, scipy, PyYAML, tqdm) but not the course's
other packages, no network, at most 8 files back. The stand-in: a venv of this Python whose
site-packages links exactly those distributions (and what they require) from the course's own
.venv, first on PATH as `python3`; the course's packages as wheels made from .venv's installed
copies of tests/device/wheels.txt (the versions the course is tested with; pip cannot build a
wheel of an installed package, and the network is out: a wheel is a zip of the installed files and
their .dist-info); PIP_NO_INDEX=1. Then day0.sh's dry run end to end.
"""
from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coursetools import day0
from tests.conftest import REPO

SCRIPT = REPO / "tests" / "device" / "day0.sh"
# What the lent machine's image holds (the list): each with its own requirements.
MACHINE_HAS = ("torch", "numpy", "h5py", "matplotlib", "pytest", "pytest-xdist", "scipy", "PyYAML",
               "tqdm")


def requirement_closure(names) -> dict[str, metadata.Distribution]:
    from packaging.requirements import Requirement

    seen, todo = {}, list(names)
    while todo:
        name = day0.canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this venv does not have: the machine lacks it too
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def installed_files(dist: metadata.Distribution):
    """(path in site-packages, file) of an installed distribution: its RECORD, less the scripts
    in bin/ (../../../bin) and bytecode."""
    for f in dist.files or []:
        if not str(f).startswith("..") and "__pycache__" not in f.parts:
            yield str(f), Path(dist.locate_file(f))


def make_machine(folder: Path, has=MACHINE_HAS) -> Path:
    """A venv (no pip) of the base Python whose site-packages links the files of `has`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    for dist in requirement_closure(has).values():
        for top in {name.split("/")[0] for name, _ in installed_files(dist)}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return folder / "bin" / "python3"


def make_wheels(folder: Path) -> dict[str, str]:
    """A wheel of each distribution in tests/device/wheels.txt, from .venv's installed copy (its
    version: the requirements' requirements are not pinned, and a venv made later may hold newer
    ones than the list, which records what the course was tested with when it was written)."""
    folder.mkdir()
    made = {}
    for name in day0.wanted():
        dist = metadata.distribution(name)
        version = dist.version
        stem = f"{dist.metadata['Name'].replace('-', '_')}-{version}"
        with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as whl:
            for arcname, path in installed_files(dist):
                if arcname.endswith(".so"):
                    # a compiled build (charset-normalizer's mypyc one): its pure-Python wheel,
                    # the one make device-wheels fetches, is the same files less the extensions,
                    # each of which has its .py
                    assert Path(arcname.split(".cpython")[0] + ".py").name in {
                        Path(n).name for n, _ in installed_files(dist)}, arcname
                elif arcname.endswith(".dist-info/WHEEL"):
                    whl.writestr(arcname, "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
                else:
                    whl.write(path, arcname)
        made[name] = version
    return made


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    root = tmp_path_factory.mktemp("machine")
    return make_machine(root / "venv"), make_wheels(root / "wheels"), root / "wheels"


@pytest.fixture(scope="module")
def machine_without_scipy(tmp_path_factory):
    """The lent machine's image less scipy: a site's torch module often comes without it."""
    root = tmp_path_factory.mktemp("machine_without_scipy")
    return make_machine(root / "venv", [name for name in MACHINE_HAS if name != "scipy"])


def run_day0(python: Path, tmp_path: Path, wheels: Path, script: Path = SCRIPT, **env):
    full = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}",
            "PIP_NO_INDEX": "1", "OUT": str(tmp_path / "out"),
            "DAY0_SCRATCH": str(tmp_path / "scratch"), "DAY0_WHEELS": str(wheels), **env}
    full.pop("PY", None)
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True,
                          timeout=600)


def test_the_wheel_list_agrees_with_the_requirements():
    """A package both pin: one version (requirements.txt's is the one the course tests)."""
    pinned = day0.wanted(REPO / "requirements.txt")
    shared = set(pinned) & set(day0.wanted())
    assert {"the-well", "neuraloperator", "threadpoolctl"} <= shared
    assert {n: day0.wanted()[n] for n in shared} == {n: pinned[n] for n in shared}


def test_the_stand_in_is_the_lent_machine(machine):
    """Its python3 is a venv's, imports torch, and lacks the course's packages and nbformat."""
    python, _, _ = machine
    probe = ("import sys, importlib.util as u; import torch; print(sys.prefix != sys.base_prefix, "
             "[m for m in ('neuralop', 'the_well', 'tensorly', 'tltorch', 'nbformat', 'nbclient') "
             "if u.find_spec(m)])")
    r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": ""})
    assert r.stdout.split() == ["True", "[]"], r.stdout + r.stderr


@pytest.mark.slow
def test_day0_dry_run_on_a_stand_in_of_the_lent_machine(machine, tmp_path):
    python, made, wheels = machine
    r = run_day0(python, tmp_path, wheels, DAY0_DRY_RUN="1", DAY0_SECONDS="240")
    log = f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert r.returncode == 0, log
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    steps = day0.read_steps(scratch / "steps.tsv")
    assert [(s["name"], s["outcome"]) for s in steps] == [
        (name, "ok") for name in
        ("site", "toolchain", "task", "data", "compile", "node", "report", "collect", "ladder")
    ], log
    # the environment it built: the machine's own torch, the course's packages from the wheels
    probe = ("import torch, neuralop, the_well, wellfno.model; "
             "print(torch.__file__); print(neuralop.__file__)")
    env = {**os.environ, "PYTHONPATH": f"{scratch / 'site'}{os.pathsep}{REPO}"}
    where = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env)
    torch_file, neuralop_file = where.stdout.split()
    assert Path(torch_file).resolve() == Path(metadata.distribution("torch").locate_file(
        "torch/__init__.py")).resolve(), where.stdout + where.stderr
    assert Path(neuralop_file).is_relative_to(scratch / "site"), neuralop_file
    record = json.loads((scratch / "site.json").read_text())
    assert set(record["added"]) == set(made), record  # the stand-in lacks every one of them
    # what comes back: at most 8 files, none deeper than two folders below OUT
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= day0.MAX_FILES, files
    assert all(len(p.relative_to(out).parts) <= 3 for p in files), files
    assert {p.name for p in files} <= set(day0.OUT_FILES), files
    text = (out / "day0.txt").read_text()
    assert text.startswith("day-0 check: INCOMPLETE"), text
    gpu_questions = text.split("GPU questions:\n")[1].split("\n\n")[0].splitlines()
    assert len(gpu_questions) == 9 and all(
        "NOT ANSWERED (no GPU: torch sees none)" in line for line in gpu_questions), text
    assert "GPU check: no GPU: N/A" in text  # the day-0 report, quoted
    assert (out / "toolchain.txt").read_text().startswith("python ")
    # the ladder's results file: its first rows measured on the tiny data, the rest left out
    ladder = json.loads((out / "ladder.json").read_text())
    assert {"command", "machine", "data"} <= ladder.keys() and ladder["data"]["gpu"] is None
    rows = ladder["data"]["rows"]
    assert [r["row"] for r in rows] == [name for name, *_ in day0.LADDER]
    assert all(r["samples_per_s"] > 0 and r["flops_per_sample"] > 0 for r in rows[:2]), rows
    assert rows[1]["against"] == "fno.py" and rows[1]["speedup"] > 0, rows[1]
    assert all(r["skipped"] and r["samples_per_s"] is None for r in rows[2:]), rows
    assert "| 02 data pipeline |" in text  # the table, rendered in day0.txt
    # a CPU's energy: NOT ANSWERED, and why (coursetools.energy), never a number
    assert ladder["data"]["energy"] == {
        "not_answered": "no GPU: the energy counters are a GPU's (NVML, amdsmi)"}
    assert all(r["joules_per_sample"] is None and r["mean_watts"] is None for r in rows)
    assert "| J/sample | mean W |" in text and "Energy: NOT ANSWERED (no GPU: " in text


def test_a_machine_without_scipy_stops_at_the_site_step(machine, machine_without_scipy, tmp_path):
    """Issue 48's case: neuralop's tensorly imports scipy, a binary package no pure-Python wheel
    brings. The site step names it, and what to load, in one line; every later step is SKIPPED
    with that reason (not run into the same traceback); exit 2; the summary's files come back."""
    import time

    _, made, wheels = machine
    probe = subprocess.run([str(machine_without_scipy), "-c", "import scipy"],
                           capture_output=True, env={**os.environ, "PYTHONPATH": ""})
    assert probe.returncode == 1, "the stand-in has scipy"
    t0 = time.monotonic()
    r = run_day0(machine_without_scipy, tmp_path, wheels, DAY0_DRY_RUN="1", DAY0_SECONDS="240")
    took = time.monotonic() - t0
    log = f"{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert r.returncode == 2, log
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    steps = day0.read_steps(scratch / "steps.tsv")
    later = ("toolchain", "task", "data", "compile", "node", "report", "collect", "ladder")
    assert [(s["name"], s["outcome"]) for s in steps] == [
        ("site", "failed"), *((name, "skipped") for name in later)], log
    assert {s["why"] for s in steps[1:]} == {"the site step failed"}
    errors = [line for line in (scratch / "logs" / "site.log").read_text().splitlines()
              if line.startswith("error: ")]
    assert len(errors) == 1, errors  # scipy, and nothing else, is missing
    line = errors[0]
    assert "lacks scipy, which neuralop imports (through tensorly" in line, line
    assert "load the site's scipy (`module load`" in line and str(machine_without_scipy) in line
    assert "day0: site: FAILED (exit 2 after" in r.stdout and line in r.stdout, r.stdout
    assert "Traceback" not in (out / "day0.log").read_text()  # nothing ran into it
    for name in later:
        assert f"day0: {name}: SKIPPED (the site step failed)" in r.stdout, r.stdout
    text = (out / "day0.txt").read_text()
    assert text.startswith("day-0 check: FAIL: 1 step(s) failed, 0 question(s) answered wrong, "
                           "8 skipped (the site step failed)"), text
    assert f"the site step:\n  {line}\n" in text
    assert "  ladder: SKIPPED (the site step failed)\n" in text
    assert sorted(p.name for p in out.iterdir()) == ["day0.json", "day0.log", "day0.txt"]
    assert took < 60, f"{took:.0f} s: it should stop at the site step"
    record = json.loads((scratch / "site.json").read_text())
    assert record["problems"] == [line[len("error: "):]] and set(record["added"]) == set(made)


def test_a_python_without_torch_is_one_error_line(tmp_path):
    """A machine whose torch cannot be imported: one line naming the Python and what to load."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    r = run_day0(bare / "bin" / "python3", tmp_path, tmp_path / "no-wheels",
                 PYTHONPATH="", DAY0_DRY_RUN="1")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: python3 ("), r.stderr
    assert str(bare / "bin" / "python3") in lines[0] and "cannot import torch" in lines[0]
    assert "load the site's PyTorch" in lines[0] and "Traceback" not in r.stdout + r.stderr
    assert (tmp_path / "out" / "day0.txt").read_text() == f"day-0 check: {lines[0]}\n"
    assert not (tmp_path / "scratch").exists()


@pytest.mark.parametrize("env,needle", [
    ({"DAY0_SCRATCH": "{out}/scratch"}, "is inside OUT"),
    ({"DAY0_SECONDS": "8m"}, "DAY0_SECONDS=8m is not a whole number of seconds"),
    ({"DAY0_SCRATCH": "{tmp}/mine"}, "holds files day0.sh did not write"),
])
def test_bad_settings_are_one_error_line(tmp_path, env, needle):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not day0.sh's")
    env = {k: v.format(out=tmp_path / "out", tmp=tmp_path) for k, v in env.items()}
    r = run_day0(Path(sys.executable), tmp_path, tmp_path / "no-wheels", **env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert (tmp_path / "mine" / "notes.txt").is_file()  # a folder it did not make: left alone


def test_missing_packages_without_their_wheels_are_one_error_line(machine, tmp_path):
    """The stand-in with no .device-wheels/: what it lacks, and `make device-wheels`."""
    python, _, _ = machine
    r = subprocess.run([str(python), "-m", "coursetools.day0", "site", "--wheels",
                        str(tmp_path / "none"), "--target", str(tmp_path / "site")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "lacks the-well==1.2.0, neuraloperator==2.0.0" in r.stderr
    assert "run `make device-wheels` where there is a network" in r.stderr


def test_site_leaves_the_machines_own_packages_alone(tmp_path):
    """This venv has every package of the list: nothing unpacked, each reported as the machine's."""
    record = day0.site(tmp_path / "no-wheels", tmp_path / "site")
    assert record["added"] == {} and set(record["machine"]) == set(day0.wanted())
    assert list((tmp_path / "site").iterdir()) == []


def test_a_wheel_that_is_not_pure_python_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "x-1-cp312-cp312-linux_x86_64.whl", "w") as whl:
        whl.writestr("x-1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
    with pytest.raises(day0.UserError, match="not a pure-Python wheel"):
        day0.unpack(tmp_path / "x-1-cp312-cp312-linux_x86_64.whl", tmp_path / "site")


# --------------------------------------------------------------------------- make venv
@pytest.mark.slow
def test_make_venv_reuses_the_torch_of_a_venvs_python(machine, tmp_path):
    """`make venv PYTHON=<a venv's python with torch>`: the new venv imports THAT torch and
    installs none of its own. Offline (PIP_NO_INDEX=1) make stops at requirements.txt, the first
    step that needs the network; everything before it ran."""
    python, _, _ = machine
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "--no-print-directory", "venv", f"VENV={venv}",
                        f"PYTHON={python}"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PIP_NO_INDEX": "1"}, timeout=300)
    out = r.stdout + r.stderr
    assert f"Found torch in {python}, a venv's" in out, out
    assert "pip install -q -r requirements.txt" in out and r.returncode != 0, out  # offline
    assert "torch==" not in out, out  # the pinned torch never installed
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sys, torch; print(sys.prefix); print(torch.__file__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    prefix, torch_file = probe.stdout.split()
    assert Path(prefix) == venv, probe.stdout + probe.stderr
    machine_torch = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"],
                                   capture_output=True, text=True).stdout.strip()
    assert torch_file == machine_torch
    assert not list(venv.glob("lib/python*/site-packages/torch")), "a torch of its own"


def test_sitevenv_refuses_a_folder_that_is_not_empty():
    from coursetools import sitevenv

    if sys.prefix == sys.base_prefix:
        pytest.skip("this Python is not a venv's: sitevenv refuses it before the folder")
    r = subprocess.run([sys.executable, "-m", "coursetools.sitevenv", str(REPO)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "exists and is not empty" in r.stderr and sitevenv.PTH


# --------------------------------------------------------------------------- summary, on a GPU
GPU_TASK = {"host": "n1", "rank": 0, "local_rank": 0, "cpus": [0], "visible": {},
            "versions": {"python": "3.12", "torch": "2.11", "cuda": "13.0", "hip": None,
                         "driver": "d", "cudnn_or_miopen": 1, "nccl_or_rccl": "2"},
            "gpus": [{"index": 0, "name": "NVIDIA H200", "placement": "p", "device": "cuda:0",
                      "matmul_rel_error": 1e-7, "matmul_ok": True, "fft_rel_error": 1e-7,
                      "fft_ok": True}]}


def _scratch(tmp_path, steps, problems, node=None):
    scratch = tmp_path / "scratch"
    (scratch / "gpu").mkdir(parents=True)
    (scratch / "steps.tsv").write_text("".join(f"{line}\n" for line in steps))
    (scratch / "gpu" / "gpu_check.json").write_text(json.dumps(
        {"status": "FAIL" if problems else "PASS", "problems": problems, "not_answered": [],
         "tasks": [GPU_TASK], "node": node}))
    return scratch


def test_a_node_step_out_of_time_is_not_answered_not_failed(tmp_path):
    """On a GPU, the node step killed at its time: the report's "no node results" is that
    timeout, not a failure; its questions say NOT ANSWERED (timed out after N s); exit 0."""
    scratch = _scratch(tmp_path, ["site\t0\t1\t60\t", "task\t0\t9\t90\t", "compile\t0\t70\t150\t",
                                  "node\t124\t200\t200\tchecks 90 s", "report\t1\t3\t30\t",
                                  "ladder\t0\t100\t120\t"],
                       ["no node results (the training/pytest step did not run)"])
    assert day0.summary(scratch, tmp_path / "out", gpus=1, dry_run=False) == 0
    text = (tmp_path / "out" / "day0.txt").read_text()
    assert text.startswith("day-0 check: INCOMPLETE"), text
    assert "report: NOT ANSWERED (the node step timed out after 200 s)" in text
    assert "pytest -m gpu: NOT ANSWERED (timed out after 200 s)" in text
    assert "matmul and FFT on each GPU against float64: right on every GPU" in text
    assert ("solution 11 --compile on the GPU (the compiled model, its spectral convolutions run "
            "eagerly): compiled") in text
    assert "FAIL" not in text


def test_a_failed_step_and_a_wrong_answer_are_counted(tmp_path):
    node = {"training": {"samples_per_second": 9e3, "batch": 16, "grid": 32},
            "utilization": {"available": False},
            "complex_ddp": {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2},
            "transport": {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2},
            "step_06": {"ran": True, "runs": {
                "float32": {"ok": True},
                "bf16": {"ok": True, "max_relative_loss_difference": 2e-4, "tolerance": 1e-3},
                "compile": {"ok": False, "max_relative_loss_difference": 1e-3,
                            "tolerance": 1e-4}}},
            "pytest_gpu": {"ran": True, "ok": True, "summary": "9 passed", "timed_out": False}}
    scratch = _scratch(tmp_path, ["task\t0\t9\t90\t", "compile\t2\t5\t150\t--compile",
                                  "node\t0\t100\t200\t", "report\t1\t3\t30\t"],
                       ["solutions/11_compile/fno.py on the GPU (compile): loss off"], node)
    assert day0.summary(scratch, tmp_path / "out", gpus=1, dry_run=False) == 3
    text = (tmp_path / "out" / "day0.txt").read_text()
    assert text.startswith("day-0 check: FAIL: 2 step(s) failed, 1 question(s) answered wrong")
    assert "step 06 --compile against float32 on the GPU: FAILED: loss within 1.0e-03" in text
    assert "step 06 --amp bf16 against float32 on the GPU: loss within 2.0e-04" in text
    assert "complex gradients under DDP over NCCL/RCCL: NOT ANSWERED (needs 2 GPUs" in text
    assert ("the course's ladder on the GPU (samples/s, MFU, J/sample; ladder.json): NOT "
            "ANSWERED (its step did not run)") in text


def test_no_gpu_on_a_gpu_machine_is_a_failure(tmp_path):
    """Not a dry run, and torch sees no GPU: FAIL, whatever the steps did in their time."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "steps.tsv").write_text("task\t0\t9\t90\t\nnode\t124\t46\t46\t\n")
    assert day0.summary(scratch, tmp_path / "out", gpus=0, dry_run=False) == 1
    text = (tmp_path / "out" / "day0.txt").read_text()
    assert text.startswith("day-0 check: FAIL: 0 step(s) failed, 1 question(s) answered wrong")
    assert "FAILED: torch sees no GPU" in text
    assert day0.summary(scratch, tmp_path / "dry", gpus=0, dry_run=True) == 0


def test_a_node_step_cut_off_keeps_the_answers_it_gave(tmp_path):
    """The node step killed at its time after the training steps and DDP answered (node.json,
    written after each answer, lists the rest as unfinished): those questions answered, the
    others NOT ANSWERED for the step's reason; nothing failed."""
    node = {"training": {"samples_per_second": 9e3, "batch": 16, "grid": 32},
            "utilization": {"available": False},
            "complex_ddp": {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2},
            "transport": {"ran": False, "why": "needs 2 GPUs, torch sees 1", "needs_gpus": 2},
            "unfinished": ["step_06", "pytest_gpu"]}
    scratch = _scratch(tmp_path, ["task\t0\t9\t90\t", "node\t124\t200\t200\t",
                                  "report\t0\t3\t30\t"], [], node)
    assert day0.summary(scratch, tmp_path / "out", gpus=1, dry_run=False) == 0
    text = (tmp_path / "out" / "day0.txt").read_text()
    assert text.startswith("day-0 check: INCOMPLETE"), text
    assert ("training steps of the course's model on the GPU (samples/s, utilization): 9000 "
            "samples/s at batch 16, 32x32") in text
    for question in ("step 06 --amp bf16 against float32 on the GPU",
                     "step 06 --compile against float32 on the GPU", "pytest -m gpu"):
        assert (f"{question}: NOT ANSWERED (the node step timed out after 200 s before it)"
                in text), text
    assert "complex gradients under DDP over NCCL/RCCL: NOT ANSWERED (needs 2 GPUs" in text
