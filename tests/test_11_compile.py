"""Exercise 11 check-your-work: torch.compile, and the ladder of exercises 08-11.

    .venv/bin/python -m pytest -q tests/test_11_compile.py --script YOUR_SCRIPT

Runs the script on the tiny generated data, compiled and eager (float32 is the reference), and
checks the ladder benchmark's rows, each against the step it builds on.
"""
import json
import time

import pytest
import torch

from tests.checks import require, require_refused, task
from tests.conftest import REPO, call_main, exit_of, run_script
from tests.train_helpers import RUN, per_step_losses, run_once, train
from wellfno import flops

STEP = "11_compile"  # the cross-step matrix (tests/conftest.py) supplies `script`


# torch.compile only reorders and fuses float32 arithmetic: the same losses to float32 rounding.
@pytest.mark.slow
def test_compile_tracks_float32(script, tiny_data_dir, finished_run, tmp_path):
    steps = ["--max-steps", "3", "--log-every", "1"]
    reference = run_once(finished_run, script, tiny_data_dir, *steps)[0]  # also exercise 09's run
    compiled = train(script, tiny_data_dir, tmp_path / "compiled", *steps, "--compile", timeout=900,
                     fix=f"add --compile {task('11', 1)}")
    eager, fused = per_step_losses(reference), per_step_losses(compiled)
    worst = max((abs(a - b) / abs(b) for a, b in zip(fused, eager)), default=0.0)
    require(len(fused) == len(eager) and worst <= 1e-4,
            f"--compile's {len(fused)} step losses are {worst:.1e} (relative) from eager float32's "
            f"{len(eager)} (allowed: 1e-4, as many): train the compiled model, validate the eager "
            f"one {task('11', 1)}")
    require(compiled.get("compile_seconds", 0) > 0, "metrics.json has no compile_seconds > 0: "
            f"record the first (compiling) step apart {task('11', 1)}")


# A stand-in for torch.compile: what it returns (an OptimizedModule: the module under `_orig_mod`,
# its attributes passed through, its state_dict's keys prefixed `_orig_mod.`), without compiling,
# which takes minutes on a CPU. Its first call waits COMPILE_SECONDS, as compiling does.
COMPILE_SECONDS = 1.0


class StandInCompiled(torch.nn.Module):
    def __init__(self, module, calls):
        super().__init__()
        self._orig_mod = module
        self.calls = calls

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_mod, name)

    def forward(self, *args, **kwargs):
        note_call(self.calls, self._orig_mod, args)
        return self._orig_mod(*args, **kwargs)


def note_call(calls, module, args):
    """The first call waits as compiling would; each call's mode (the eager module's: training or
    not) and input shape is noted."""
    if not calls:
        time.sleep(COMPILE_SECONDS)
    calls.append((getattr(module, "training", True), tuple(args[0].shape) if args else ()))


def stand_in_compile(calls):
    def compile(model, *args, **kwargs):
        if isinstance(model, torch.nn.Module):
            return StandInCompiled(model, calls)
        owner = getattr(model, "__self__", None)  # nn.Module.compile() compiles its _call_impl

        def compiled(*a, **k):
            note_call(calls, owner, a)
            return model(*a, **k)
        return compiled
    return compile


def test_compile_trains_the_compiled_model_and_keeps_the_eager_one(script_module, tiny_data_dir,
                                                                    tmp_path, monkeypatch):
    """--compile with torch.compile replaced by a stand-in (no compiling: a wait at its first
    call): the model it returns trains, every step on one batch shape (a new shape compiles
    again); validation, rollouts and the checkpoint keep the eager model (a compiled module's
    state_dict keys start with `_orig_mod.`, which the model without --compile does not load);
    compile_seconds is the first step's time (torch.compile compiles at the first call, not where
    it is called). One epoch of the tiny data's 44 samples in batches of 16: a short last one."""
    from wellfno.cli import UserError

    calls = []
    monkeypatch.setattr(torch, "compile", stand_in_compile(calls))
    if hasattr(script_module, "check_compiler"):  # no compiler needed: nothing compiles
        monkeypatch.setattr(script_module, "check_compiler", lambda *a, **k: None)
    out, stopped = tmp_path / "out", None
    try:
        call_main(script_module, "--data-dir", tiny_data_dir, "--out", out, "--epochs", "1",
                  "--batch-size", "16", "--bind", "none", "--width", "8", "--modes", "4",
                  "--compile")
    except UserError as err:
        stopped = str(err)
    fix = task("11", 1)
    require(stopped is None, f"a run with --compile stopped: error: {stopped} {fix}")
    trained = [shape for training, shape in calls if training]
    require(trained, f"--compile: the model torch.compile returned never trained "
            f"({len(calls)} call(s)): train with train_model = torch.compile(ddp_model) {fix}")
    evaluated = len(calls) - len(trained)
    saved = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    prefixed = [key for key in saved if key.startswith("_orig_mod.")]
    require(not prefixed, f"--compile: {len(prefixed)} of checkpoint.pt's {len(saved)} keys start "
            f"with _orig_mod. (the compiled wrapper's state_dict), which the model without "
            f"--compile does not load: save the eager model's {fix}")
    require(not evaluated, f"--compile: the compiled model ran {evaluated} time(s) in eval mode: "
            f"validation and rollouts keep the eager model {fix}")
    require(len(set(trained)) == 1, f"--compile: the compiled model trained on "
            f"{len(set(trained))} batch shapes (allowed: 1, each new one compiles again): drop "
            f"the short last batch (drop_last) {fix}")
    written = json.loads((out / "metrics.json").read_text())
    compiling, epoch = written.get("compile_seconds") or 0, written["history"][0]["seconds"]
    require(COMPILE_SECONDS <= compiling < epoch, f"--compile: metrics.json's compile_seconds is "
            f"{compiling:.2f} s of the epoch's {epoch:.2f} s; the first step compiles (here a "
            f"stand-in that waits {COMPILE_SECONDS:.0f} s), so it is at least that and less than "
            f"the epoch: torch.compile compiles at the first call, not where it is called; record "
            f"the first step's time apart (untimed_seconds) {fix}")


def test_compile_without_a_compiler_is_one_line_error(script_module, tiny_data_dir, tmp_path,
                                                      monkeypatch):
    # No g++ or clang++ on PATH; `python SCRIPT ...` in this process (exit_of)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", "g++")
    result = exit_of(script_module, "--data-dir", tiny_data_dir, "--out", tmp_path / "out", *RUN,
                     "--compile", "--device", "cpu")
    require_refused(result, "--compile without a C++ compiler on PATH", "refuse it with "
                    f"check_compiler {task('11', 1)}", naming=["compiler", "without --compile"],
                    out=tmp_path / "out")


# This step's Slurm job is tested in tests/test_slurm.py with the other job scripts
# (DESIGN.md), where the jobs run side by side:
# test_slurm_efficiency_job_writes_its_table.


def _fake_triton(monkeypatch):
    """importlib finds a `triton` package (GPU builds of torch ship one; this CPU wheel not)."""
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            importlib.machinery.ModuleSpec(name, None) if name == "triton" else real(name, *a)
        ),
    )


def test_compile_on_a_gpu_without_a_host_c_compiler_is_one_line(
    script_module, monkeypatch, tmp_path
):
    """Triton compiles its launchers with $CC, gcc or clang (triton/runtime/build.py), and fails
    at the first kernel without one. check_compiler's GPU branch is called with a cuda device (no
    GPU is touched), a Triton import that resolves, and a PATH without any C compiler; then with
    one."""
    _fake_triton(monkeypatch)
    empty, tools = tmp_path / "empty", tmp_path / "tools"
    empty.mkdir()
    tools.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    gpu = torch.device("cuda", 0)
    check_compiler = getattr(script_module, "check_compiler", None)
    fix = f"refuse --compile without a compiler with wellfno.toolchain's check_compiler {task('11', 1)}"
    require(check_compiler, f"your script has no check_compiler: {fix}")

    def refusal() -> str:
        try:
            check_compiler(gpu)
        except script_module.UserError as err:
            return str(err)
        return ""

    message = refusal()
    require("\n" not in message and "C compiler" in message and "install one" in message
            and "without --compile" in message,
            f"on a GPU without a C compiler check_compiler must refuse in one line naming the C "
            f"compiler, 'install one' and 'without --compile': {fix}")
    monkeypatch.setenv("CC", "cc-that-is-not-there")
    require("C compiler" in refusal(), f"a CC that does not exist must be refused: {fix}")
    gcc = tools / "gcc"
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tools))
    script_module.check_compiler(gpu)  # gcc found: no error


# -- the ladder: solutions/11_compile/benchmark.py --------------------------------------------

BENCHMARK = REPO / "solutions" / "11_compile" / "benchmark.py"


@pytest.fixture(scope="module")
def benchmark():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("ladder_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _ladder(benchmark, device, no_compile=False, baseline=None):
    import argparse

    args = argparse.Namespace(steps=20, width=64, batch_size=64, no_compile=no_compile,
                              baseline=str(baseline or benchmark.BASELINE))
    rows = benchmark.rows_to_run(args, device)
    return [(r.name, None if r.against is None else rows[r.against].name, r.amp, r.skipped)
            for r in rows], rows


def _as_cpu(monkeypatch, name):
    from tests.fixtures.cpuinfo import RECORDED
    from wellfno.amp import cpuinfo_flags

    flags = cpuinfo_flags(RECORDED[name][1])
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {f: True for f in flags},
                        raising=False)  # torch 2.5 has none (wellfno.amp reads cpuinfo)


def test_ladder_adds_one_idea_per_row(benchmark, monkeypatch):
    """Each row against the step it builds on (issue 20): 08 on the baseline, 09, 10 and 11 on 08
    (the size row by FLOP/s in float32, compile in float32: not on top of bf16)."""
    _as_cpu(monkeypatch, "amd_epyc_9754")  # AVX512_BF16: the bf16 row runs
    ladder, rows = _ladder(benchmark, torch.device("cpu"))
    base = benchmark.BASELINE_ROW
    assert base == f"{benchmark.BASELINE.parent.name[:2]} baseline"
    assert ladder == [(base, None, "none", None),
                      ("08 no host syncs", base, "none", None),
                      ("09 mixed precision (bf16)", "08 no host syncs", "bf16", None),
                      ("10 width 64, batch 64", "08 no host syncs", "none", None),
                      ("11 torch.compile", "08 no host syncs", "none", None)]
    assert [r.script for r in rows] == [benchmark.BASELINE, benchmark.NO_SYNCS, benchmark.AMP,
                                        benchmark.MFU, benchmark.SOLUTION]
    assert "--compile" in rows[4].options and not any("--compile" in r.options for r in rows[:4])
    assert rows[3].by == "FLOP/s" and all(r.by == "samples/s" for r in rows if r is not rows[3])
    assert all("--log-every" in r.options for r in rows[1:]) and rows[0].options == []
    without_compile, _ = _ladder(benchmark, torch.device("cpu"), no_compile=True)
    assert [name for name, *_ in without_compile] == [name for name, *_ in ladder[:4]]


@pytest.mark.parametrize("first,name", [("solutions/06_exact_metrics/fno.py", "06 baseline"),
                                         ("fno.py", "fno.py baseline"),
                                         ("my_work/my_fno.py", "my_fno.py baseline")])
def test_the_first_row_is_named_after_baseline(benchmark, first, name):
    """--baseline another step's script (or a participant's): the first row, and the row that
    builds on it, name that script, not the default's step."""
    ladder, rows = _ladder(benchmark, torch.device("cpu"), baseline=REPO / first)
    assert ladder[0][:2] == (name, None) and rows[0].script == REPO / first
    assert ladder[1][:2] == ("08 no host syncs", name)


@pytest.mark.parametrize("cpu", ["amd_epyc_7763", "intel_xeon_8259cl"])
def test_ladder_skips_bf16_on_a_cpu_without_bf16_units(benchmark, monkeypatch, cpu):
    _as_cpu(monkeypatch, cpu)
    ladder, _ = _ladder(benchmark, torch.device("cpu"))
    name, against, _, skipped = ladder[2]
    assert (name, against) == ("09 mixed precision", "08 no host syncs")
    assert skipped and "no bfloat16 units" in skipped and "emulated" in skipped


def test_ladder_runs_fp16_on_a_gpu_without_bf16(benchmark, monkeypatch):
    """A V100 (no bf16 units, fp16 tensor cores): check_amp refuses bf16, the row runs fp16."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    ladder, _ = _ladder(benchmark, torch.device("cuda", 0))
    assert ladder[2] == ("09 mixed precision (fp16)", "08 no host syncs", "fp16", None)


@pytest.mark.slow
def test_ladder_writes_each_row_against_its_reference(benchmark, tiny_data_dir, tmp_path):
    """The benchmark end to end, as on an AVX2-only EPYC (tests/cpu_seam): the bf16 row skipped with
    its reason, each speed-up the ratio to the row it names, MFU against the float32 peak."""
    from tests.test_09_mixed_precision import as_cpu

    out = tmp_path / "ex11"
    result = run_script(BENCHMARK, "--data-dir", tiny_data_dir, "--out", out, "--steps", "2",
                        "--repeats", "1", "--no-compile", "--width", "8", "--batch-size", "4",
                        "--common", "--bind none", env=as_cpu("amd_epyc_7763"), timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((out / "efficiency.json").read_text())
    rows = {r["row"]: r for r in written["data"]["rows"]}
    base_row = benchmark.BASELINE_ROW
    assert list(rows) == [base_row, "08 no host syncs", "09 mixed precision",
                          "10 width 8, batch 4"]
    skipped = rows["09 mixed precision"]
    assert "no bfloat16 units" in skipped["skipped"] and skipped["samples_per_s"] is None
    base, no_syncs = rows[base_row], rows["08 no host syncs"]
    sized = rows["10 width 8, batch 4"]
    assert no_syncs["against"] == base_row and sized["against"] == "08 no host syncs"
    assert no_syncs["speedup"] == pytest.approx(no_syncs["samples_per_s"] / base["samples_per_s"])
    assert sized["speedup"] == pytest.approx(sized["achieved_flops_per_s"]
                                             / no_syncs["achieved_flops_per_s"])
    assert sized["command"].startswith("solutions/10_mfu/fno.py ")
    for r in (base, no_syncs, sized):
        assert r["peak_precision"] == "fp32" and r["achieved_flops_per_s"] == pytest.approx(
            r["flops_per_sample"] * r["samples_per_s"])
    table = flops.efficiency_markdown(written["data"]["rows"])
    assert "| 09 mixed precision | skipped |" in table and "no bfloat16 units" in table
    assert (out / "efficiency.png").is_file()
