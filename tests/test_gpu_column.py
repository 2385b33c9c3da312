"""The day-0 check's GPU ladder in the docs (issue #40, part 5): a GPU machine's ladder.json, kept at
coursetools.day0.GPU_LADDER, renders as a GPU column and rows beside the CPU's numbers; a CPU's (a
dry run's) is refused; without one the docs say the GPU numbers are to be measured, and how."""
import json
import shutil
import subprocess
import sys

import pytest

from benchtools import resultfiles
from coursetools import day0, measure, results, staleness
from tests.conftest import REPO
from wellfno.cli import UserError

COMMIT = "abc1234" + "0" * 33
H200 = {"cpu": "Intel(R) Xeon(R) Platinum 8480C", "cores": 16, "torch": "2.11.0+cu130",
        "python": "3.12.3", "torch_threads": 16, "load_average": 3.2, "gpu": "NVIDIA H200",
        "gpu_count": 1, "hip": None, "cuda": "13.0"}
CPU = {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0+cpu", "python": "3.11.7",
       "torch_threads": 2, "load_average": 1.0}
DOC = ("intro\n<!-- table: coursetools.results:readme_results_table -->\n<!-- /table -->\n"
       "<!-- table: coursetools.results:efficiency_gpu_table -->\n<!-- /table -->\n")


def _row(name, against, samples, speedup, mfu, precision="tf32", skipped=None):
    numbers = dict(samples_per_s=samples, flops_per_sample=1.6e9,
                   achieved_flops_per_s=None if samples is None else 1.6e9 * samples,
                   peak_flops_per_s=494.5e12, peak_precision=precision, mfu=mfu,
                   peak_memory_bytes=2**30, peak_memory_of="cuda", compile_seconds=None)
    if skipped:
        numbers = dict.fromkeys(numbers)
    return dict(row=name, against=against, speedup_of="samples/s", speedup=speedup,
                skipped=skipped, command="x.py", **numbers)


GPU_ROWS = [_row("fno.py", None, 1234.0, None, 0.004),
            _row("02 data pipeline", "fno.py", 2345.0, 1.9, 0.0076),
            _row("08 no host syncs", "02 data pipeline", 3456.0, 1.47, 0.0112),
            _row("09 mixed precision (bf16)", "08 no host syncs", 5678.0, 1.64, 0.0092, "bf16"),
            _row("11 torch.compile", "08 no host syncs", None, None, None,
                 skipped="timed out after 90 s")]


def _write_ladder(path, monkeypatch, machine, device, gpu, stamp=None):
    """A ladder.json as coursetools.day0.ladder writes it (write_result), on a fake machine."""
    monkeypatch.setattr(resultfiles, "machine_info", lambda device=None: dict(machine))
    monkeypatch.setattr(resultfiles, "code_stamp",
                        lambda root=None: stamp or {"commit": COMMIT, "clean": True})
    data = {"device": device, "gpu": gpu, "peak_device": "NVIDIA H200" if gpu else "AMD EPYC",
            "peak_source": "NVIDIA H200 datasheet", "steps": 60, "grid": "128x128",
            "workers": 4, "rows": GPU_ROWS}
    return resultfiles.write_result(path, "python -m coursetools.day0 ladder --data-dir D "
                                          "--out ladder.json --steps 60", data)


@pytest.fixture
def repo(tmp_path):
    """A repository with the real CPU efficiency file and a doc with both GPU tables."""
    (tmp_path / "fno.py").write_text("")
    target = tmp_path / results.EFFICIENCY_RESULT
    target.parent.mkdir(parents=True)
    shutil.copyfile(REPO / results.EFFICIENCY_RESULT, target)
    (tmp_path / "README.md").write_text(DOC)
    return tmp_path


def test_a_gpu_ladder_renders_a_column_with_its_numbers_machine_and_commit(repo, monkeypatch):
    _write_ladder(repo / day0.GPU_LADDER, monkeypatch, H200, "cuda:0", "NVIDIA H200")
    results.render(repo)
    text = (repo / "README.md").read_text()
    machine = "NVIDIA H200, torch 2.11.0+cu130, CUDA 13.0"
    # README: the 08-11 row's GPU part, and the ladder's own row
    row = next(line for line in text.splitlines() if line.startswith("| 08-11 |"))
    assert f"GPU ({machine}): fno.py 1234 samples/s to 09 mixed precision (bf16) 5678 " \
           "samples/s (**4.60×**), MFU 0.92 %" in row and "to be measured" not in row
    gpu = next(line for line in text.splitlines() if line.startswith("| 08-11, GPU |"))
    assert f"{machine}, at commit abc1234; 128x128 grid, 60 steps a row" in gpu
    assert "fno.py 1234 samples/s, MFU 0.40 % of tf32" in gpu
    assert "02 data pipeline 2345 samples/s (1.90× fno.py), MFU 0.76 % of tf32" in gpu
    assert "09 mixed precision (bf16) 5678 samples/s (1.64× 08 no host syncs), MFU 0.92 % of " \
           "bf16" in gpu and "11 torch.compile skipped (timed out after 90 s)" in gpu
    assert "[`results/gpu/ladder.json`](results/gpu/ladder.json)" in gpu
    assert "NVIDIA H200 — load average at the end of each run: `gpu/ladder.json` 3.2" in text
    # exercise 11: the GPU column beside the CPU's, step by step
    table = text.split("coursetools.results:efficiency_gpu_table -->\n")[1]
    assert table.startswith("| row | CPU samples/s | CPU MFU | GPU samples/s | GPU MFU |")
    # the CPU column: the committed results/efficiency_cpu/efficiency.json's rows, as measured
    cpu = {r["row"]: r for r in json.loads((repo / "results/efficiency_cpu/efficiency.json")
                                           .read_text())["data"]["rows"]}

    def cpu_cells(name, versus=None):
        r = cpu[name]
        rate = f"{r['samples_per_s']:,.0f}" + (f" ({r['speedup']:.2f}× {versus})" if versus else "")
        return f"| {name} | {rate} | {100 * r['mfu']:.2f}% {r['peak_precision']} |"

    assert cpu_cells("07 baseline") + " not in this ladder |  |" in table
    assert cpu_cells("08 no host syncs", "07") + " 3,456 (1.47× 02) | 1.12% tf32 |" in table
    assert "| 02 data pipeline | not in this ladder |  | 2,345 (1.90× fno.py) | 0.76% tf32 |" \
        in table
    assert cpu_cells("11 torch.compile", "08") + " skipped | - |" in table
    assert "GPU 11 torch.compile: skipped: timed out after 90 s." in table
    assert f"GPU column: {machine}, at commit abc1234;" in table
    assert "_GPU column measured by `python -m coursetools.day0 ladder" in table
    assert results.render(repo, check=True) == []


def test_a_cpu_ladder_is_refused_with_one_line_naming_the_file(repo, monkeypatch, tmp_path):
    """A dry run's ladder.json (device cpu, no GPU) never renders as a GPU column."""
    _write_ladder(repo / day0.GPU_LADDER, monkeypatch, CPU, "cpu", None)
    before = (repo / "README.md").read_text()
    with pytest.raises(UserError) as err:
        results.render(repo)
    message = str(err.value)
    assert "\n" not in message and "results/gpu/ladder.json was measured on a CPU" in message
    assert "a dry run's ladder, not GPU numbers" in message
    assert (repo / "README.md").read_text() == before   # nothing rendered from it
    # and `keep` refuses to bring one into the repository
    cpu_file = _write_ladder(tmp_path / "out" / "ladder.json", monkeypatch, CPU, "cpu", None)
    r = subprocess.run([sys.executable, "-m", "coursetools.day0", "keep", str(cpu_file),
                        "--root", str(repo)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{cpu_file} was measured on a CPU" in r.stderr


def test_no_gpu_file_says_to_be_measured_and_how(repo):
    results.render(repo)
    text = (repo / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 08-11 |"))
    assert row.split(" | ")[2].endswith("GPU: to be measured, the next row says how")
    gpu = next(line for line in text.splitlines() if line.startswith("| 08-11, GPU |"))
    table = text.split("coursetools.results:efficiency_gpu_table -->\n")[1]
    for said in (gpu, table):
        assert "to be measured (no `results/gpu/ladder.json` yet)" in said
        assert "`OUT=DIR bash tests/device/day0.sh` on a GPU machine" in said
        assert "slurm/00_gpu_check.sbatch" in said
        assert "python -m coursetools.day0 keep DIR/ladder.json" in said
        assert "samples/s" not in said and "MFU" not in said   # no number invented
    assert gpu.endswith("| — |")


def test_keep_copies_a_gpu_ladder_and_stamps_a_commit_given(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    root.mkdir()
    (root / "fno.py").write_text("")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "fno.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    no_git = {"commit": None, "clean": None, "commit_note": "not measured in a git checkout"}
    found = _write_ladder(tmp_path / "out" / "ladder.json", monkeypatch, H200, "cuda:0",
                          "NVIDIA H200", stamp=no_git)
    kept = day0.keep(found, root, "HEAD")
    saved = json.loads(kept.read_text())
    assert kept == root / day0.GPU_LADDER and saved["commit"] == head
    assert saved["data"]["rows"] == GPU_ROWS and saved["machine"]["gpu"] == "NVIDIA H200"
    assert "keep --commit HEAD" in saved["commit_note"]
    with pytest.raises(UserError, match="records its commit"):
        day0.keep(kept, root, "HEAD")
    with pytest.raises(UserError, match="not a commit"):
        day0.keep(found, root, "no-such-rev")


def test_the_gpu_ladder_is_a_staleness_target_not_a_make_results_one(repo, monkeypatch):
    [target] = measure.ELSEWHERE
    assert target.file == day0.GPU_LADDER.as_posix()
    assert target.name not in {t.name for t in measure.TARGETS}   # make results never runs it
    with pytest.raises(UserError, match="not measured by make results.*day0.sh"):
        measure.pick([target.name])
    assert measure.pick([target.name], elsewhere=True) == [target]
    code = staleness.dependencies(target, REPO)
    assert {"coursetools/day0.py", "fno.py", "solutions/11_compile/fno.py",
            "solutions/09_mixed_precision/fno.py", "wellfno/model.py",
            "wellfno/grayscott.py"} <= set(code)
    # a file without a commit is stale, and says how to measure it again (not make results)
    _write_ladder(repo / day0.GPU_LADDER, monkeypatch, H200, "cuda:0", "NVIDIA H200",
                  stamp={"commit": None, "clean": None, "commit_note": "not in git"})
    [line] = [x for x in staleness.stale_files(repo) if x.startswith("results/gpu/")]
    assert line.startswith("results/gpu/ladder.json is stale: not in git: re-measure it with "
                           "`OUT=DIR bash tests/device/day0.sh`") and "make results" not in line


def test_the_compile_question_says_what_is_checked():
    asked = day0.questions({}, None, gpus=0, dry_run=True)
    [compile_question] = [q["question"] for q in asked if q["step"] == "compile"]
    assert compile_question == ("solution 11 --compile on the GPU (the compiled model, its "
                                "spectral convolutions run eagerly)")


def test_render_check_passes_on_the_repository():
    assert results.render(REPO, check=True) == []
