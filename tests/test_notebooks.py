"""The notebooks: committed without outputs, and executed end to end with nbclient on tiny data.

The kernel is the `python3` kernel spec, which jupyter_client resolves to the interpreter running
these tests (the venv's); every notebook prints its `sys.prefix` and the tests check it, so a
personal kernel spec that points at another Python fails here instead of in class.
The results notebook reads a runs folder that the test fills with fast real runs of each step's
tool, and with the committed results files of the tools that take minutes (05's scaling, the
ladder of 07-11): what `make results` wrote.
"""
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO

# The notebooks' own packages (requirements.txt; make venv installs them): a GPU machine's image
# may lack them (tests/device/day0.sh there: `pytest -m gpu` collects every test file, and one
# import error here would stop it before its first GPU test), so this file skips without them.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

EXPLORE = REPO / "exercises" / "00_explore_the_data.ipynb"
RESULTS = REPO / "exercises" / "results.ipynb"
NOTEBOOKS = [EXPLORE, RESULTS]
# Sections of the results notebook; each prints "note: no <what> under ..." when its files are missing.
SECTIONS = ("metrics.json", "profiler traces", "throughput.json", "scripts.json", "affinity_report.txt",
            "statistics benchmark JSON", "stats*.yaml", "scaling.json", "efficiency.json",
            "compare.json")
# results files of tools that run for minutes, copied into the runs folder: name there -> file
COMMITTED = {"scaling/scaling.json": REPO / "results" / "05_ddp_scaling.json",
             "ex11/efficiency.json": REPO / "results" / "efficiency_cpu" / "efficiency.json",
             "ex11/efficiency.png": REPO / "results" / "efficiency_cpu" / "efficiency.png",
             "compare14/compare.json": REPO / "results" / "14_long_rollouts.json"}


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


@pytest.mark.slow  # executes a notebook
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
    for name, committed in COMMITTED.items():
        (runs / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(committed, runs / name)
    dataset_dir = tiny_data_dir / "datasets" / "gray_scott_embedded"
    throughput = REPO / "profiling" / "throughput.py"
    benchmark = REPO / "solutions" / "04_distributed_stats" / "benchmark.py"
    # Two chains of runs, one after the other within a chain, next to the notebook's kernel: 2 cores in CI.
    chains = [{"baseline": ["fno.py", "--data-dir", tiny_data_dir, "--out", runs / "baseline",
                            "--epochs", "1", "--max-steps", "2"]}, {}]
    if benchmark.is_file():
        chains[0]["benchmark"] = [benchmark, "--dataset-dir", dataset_dir, "--ranks", "1", "--dask-workers", "1",
                                  "--json", runs / "04_stats_benchmark.json"]
    if throughput.is_file():
        chains[1]["throughput"] = [throughput, "--data-dir", tiny_data_dir, "--out", runs / "throughput",
                                   "--workers", "0", "--readers", "fast", "--seconds", "0.2", "--repeats", "1",
                                   "--warmup", "1"]
        compare_scripts = REPO / "profiling" / "compare_scripts.py"
        if compare_scripts.is_file():
            chains[1]["scripts"] = [compare_scripts, "--data-dir", tiny_data_dir, "--out", runs / "ex02", "--scripts",
                                    "fno.py", "--script-args", "--epochs 1 --max-steps 1", "--repeats", "1"]
    procs = []
    for chain in filter(None, chains):
        script = " && ".join(f"{shlex.join([PYTHON, *map(str, args)])} > {shlex.quote(str(runs / name))}.log 2>&1"
                             for name, args in chain.items())
        procs.append(subprocess.Popen(["bash", "-c", script], cwd=REPO))
    commands = {name for chain in chains for name in chain}
    yield runs, commands, procs, time.perf_counter()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def runs_dir(background_runs):
    runs, made, procs, started = background_runs
    codes = [proc.wait(timeout=300) for proc in procs]
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(runs.glob("*.log")))
    assert codes == [0] * len(procs), f"a run for the results notebook failed:\n{logs}"
    print(f"runs for the results notebook ({', '.join(sorted(made))}) took {time.perf_counter() - started:.0f} s")
    return runs, made


@pytest.mark.slow  # executes a notebook
def test_results_notebook_plots_every_run(runs_dir, monkeypatch):
    import json

    runs, made = runs_dir
    nb = execute(RESULTS, monkeypatch, RUNS_DIR=runs)
    text = text_of(nb)
    assert_venv_kernel(text)
    metrics = json.loads((runs / "baseline" / "metrics.json").read_text())
    assert f"{metrics['samples_per_second']:10.1f}" in text  # the baseline's row of the table
    expected = {"metrics.json": 2, "throughput.json": 1, "scripts.json": 1,  # figures
                "statistics benchmark JSON": 1, "scaling.json": 1, "efficiency.json": 1,
                "compare.json": 1}
    present = {"metrics.json", "scaling.json", "efficiency.json", "compare.json"}
    if "throughput" in made:
        present.add("throughput.json")
    if "scripts" in made:
        present.add("scripts.json")
        scripts = json.loads((runs / "ex02" / "scripts.json").read_text())["rows"]
        assert f"{scripts[0]['samples_per_s']:8.1f} samples/s" in text
        assert "0_round0" not in text  # the comparison's own fno.py runs stay out of section 00
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
    scaling = json.loads((runs / "scaling" / "scaling.json").read_text())["data"]["modes"]
    assert f"{scaling['weak'][-1]['samples_per_second']:8.1f} samples/s" in text
    for row in json.loads((runs / "ex11" / "efficiency.json").read_text())["data"]["rows"]:
        if row["skipped"]:
            assert f"{row['row']:28s} skipped: {row['skipped']}" in text
        elif row["against"]:  # each row against the one it builds on: 08 on 07; 09, 10, 11 on 08
            speedup = f"{row['speedup']:.2f}x vs {row['against']} ({row['speedup_of']})"
            assert speedup in text, (row["row"], speedup)
    long_rollouts = json.loads((runs / "compare14" / "compare.json").read_text())["data"]
    for variant, s in long_rollouts["summary"].items():  # each variant's row of exercise 14's table
        assert f"{variant:<18}{s['whole_trajectory']:10.3f}{s['step_1']:9.4f}" in text, variant


@pytest.mark.slow  # executes a notebook
def test_results_notebook_skips_what_is_missing(tmp_path, monkeypatch):
    nb = execute(RESULTS, monkeypatch, RUNS_DIR=tmp_path / "nothing_here")
    text = text_of(nb)
    assert "does not exist" in text
    for section in SECTIONS:
        assert f"note: no {section} under" in text, section
    assert n_images(nb) == 0
    assert not [out for out in outputs(nb) if out.output_type == "error"]
