"""The notebooks: committed without outputs, and executed end to end with nbclient on tiny data.

The kernel is the `python3` kernel spec, which jupyter_client resolves to the interpreter running
these tests (the venv's); every notebook prints its `sys.prefix` and the tests check it, so a
personal kernel spec that points at another Python fails here instead of in class.
The results notebook reads a runs folder that the test fills with fast real runs of each step's tool.
"""
import shlex
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import PYTHON, REPO

EXPLORE = REPO / "exercises" / "00_explore_the_data.ipynb"
RESULTS = REPO / "exercises" / "results.ipynb"
NOTEBOOKS = [EXPLORE, RESULTS]
# Sections of the results notebook; each prints "note: no <what> under ..." when its files are missing.
SECTIONS = ("metrics.json", "profiler traces", "throughput.json", "affinity_report.txt",
            "statistics benchmark JSON", "stats*.yaml")


def execute(path: Path, monkeypatch, **env) -> nbformat.NotebookNode:
    """Run every cell as Jupyter would (cwd = the notebook's folder); raise on the first failing cell."""
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebooks choose the inline backend
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=240,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def outputs(nb) -> list:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(nb) -> str:
    return "".join(out.get("text", "") for out in outputs(nb) if out.output_type == "stream")


def n_images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs(nb))


def assert_venv_kernel(text: str):
    assert f"(environment {sys.prefix})" in text, (
        f"the notebook kernel is not this environment's Python ({sys.prefix}); its first lines:\n{text[:300]}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} have outputs; clear them before committing "
                       f"(jupyter nbconvert --clear-output --inplace {path.relative_to(REPO)})")
    assert nb.metadata.kernelspec.name == "python3"


def test_explore_notebook_runs_on_tiny_data(tiny_data_dir, background_runs, monkeypatch):
    nb = execute(EXPLORE, monkeypatch, WELL_DATA=tiny_data_dir)
    text = text_of(nb)
    assert_venv_kernel(text)
    assert "generating" not in text  # it used WELL_DATA, it did not make its own dataset
    assert "on a 16 x 16 grid" in text  # the tiny size: the file came from WELL_DATA
    assert "WellDataset sample 0 == (h5py frame 0 - mean) / std" in text
    assert "t0_fields: group" in text and "dim_varying=[ True  True]" in text  # the h5py walk
    assert text.count("(yaml ") == 3 * 2  # mean, std, std_delta recomputed for A and B
    assert n_images(nb) == 3  # fields over time, histograms of values and changes, one frame's change


@pytest.fixture(scope="module")
def background_runs(tiny_data_dir, tmp_path_factory):
    """Start one fast real run of each step's tool that exists in this checkout, writing into RUNS_DIR.

    They run in the background while the explore notebook executes (both mostly wait on
    one core each); `runs_dir` waits for them.
    """
    runs = tmp_path_factory.mktemp("runs")
    commands = {"baseline": ["fno.py", "--data-dir", tiny_data_dir, "--out", runs / "baseline",
                             "--epochs", "1", "--max-steps", "2"]}
    if (REPO / "profiling" / "throughput.py").is_file():
        commands["throughput"] = ["profiling/throughput.py", "--data-dir", tiny_data_dir, "--out", runs / "throughput",
                                  "--workers", "0", "--readers", "fast", "--seconds", "0.2", "--repeats", "1",
                                  "--warmup", "1"]
    benchmark = REPO / "solutions" / "04_distributed_stats" / "benchmark.py"
    if benchmark.is_file():
        commands["benchmark"] = [benchmark, "--dataset-dir", tiny_data_dir / "datasets" / "gray_scott_embedded",
                                 "--ranks", "1", "--dask-workers", "1", "--json", runs / "04_stats_benchmark.json"]
    # One after the other in one background shell, next to the notebook's kernel: 2 cores in CI.
    script = " && ".join(f"{shlex.join([PYTHON, *map(str, args)])} > {shlex.quote(str(runs / name))}.log 2>&1"
                         for name, args in commands.items())
    proc = subprocess.Popen(["bash", "-c", script], cwd=REPO)
    yield runs, set(commands), proc, time.perf_counter()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def runs_dir(background_runs):
    runs, made, proc, started = background_runs
    rc = proc.wait(timeout=300)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(runs.glob("*.log")))
    assert rc == 0, f"a run for the results notebook failed:\n{logs}"
    print(f"runs for the results notebook ({', '.join(sorted(made))}) took {time.perf_counter() - started:.0f} s")
    return runs, made


def test_results_notebook_plots_every_run(runs_dir, monkeypatch):
    import json

    runs, made = runs_dir
    nb = execute(RESULTS, monkeypatch, RUNS_DIR=runs)
    text = text_of(nb)
    assert_venv_kernel(text)
    metrics = json.loads((runs / "baseline" / "metrics.json").read_text())
    assert f"{metrics['samples_per_second']:10.1f}" in text  # the baseline's row of the table
    expected = {"metrics.json": 2, "throughput.json": 1, "statistics benchmark JSON": 1}  # figures per section
    present = {"metrics.json"}
    if "throughput" in made:
        present.add("throughput.json")
    if "benchmark" in made:
        present.add("statistics benchmark JSON")
    for section in SECTIONS:
        skipped = f"note: no {section} under" in text
        assert skipped == (section not in present), (section, text)
    assert n_images(nb) == sum(expected[s] for s in present)
    if "throughput" in made:
        rows = json.loads((runs / "throughput" / "throughput.json").read_text())["rows"]
        assert f"{rows[0]['data_only']:10.0f}" in text
    if "benchmark" in made:
        assert "bitwise identical to serial: {'dist1': True}" in text


def test_results_notebook_skips_what_is_missing(tmp_path, monkeypatch):
    nb = execute(RESULTS, monkeypatch, RUNS_DIR=tmp_path / "nothing_here")
    text = text_of(nb)
    assert "does not exist" in text
    for section in SECTIONS:
        assert f"note: no {section} under" in text, section
    assert n_images(nb) == 0
    assert not [out for out in outputs(nb) if out.output_type == "error"]
