"""The day-0 check of a bare GPU machine (tests/device/day0.sh): its two steps written in Python.

    python -m coursetools.day0 site --wheels .device-wheels --target DIR
        # the course's packages (tests/device/wheels.txt) this Python lacks, unpacked from their
        # wheels into DIR (no network, no pip); those it has are its own, left alone
    python -m coursetools.day0 summary --scratch S --out OUT
        # S's results as at most MAX_FILES files in OUT: day0.txt (one verdict, every step, every
        # GPU question answered or NOT ANSWERED (why)), day0.json, and the files it quotes
    python -m coursetools.day0 keep OUT/ladder.json [--commit REV]
        # back here: a GPU machine's ladder into results/gpu/ladder.json, the docs' GPU column
        # (`python -m coursetools.results render`); a CPU's (a dry run's) refused

Why no venv on the machine: its torch lives in a virtual environment, and `python -m venv
--system-site-packages` run from a venv's interpreter gives the new one the *base* interpreter's
site-packages, not that venv's ("A virtual environment is created on top of an existing Python
installation, known as the virtual environment's 'base' Python", https://docs.python.org/3/library/venv.html):
no torch there. Nor pip: a bare image's venv need not have it (uv makes venvs without it), and
its base Python need not have ensurepip (Debian's without python3-venv). So day0.sh runs the
machine's own python3 with PYTHONPATH = DIR (these wheels) and the repository, which every
process it starts (pytest's, torchrun's ranks) inherits. A pure-Python wheel (Root-Is-Purelib,
tag py3-none-any) is a zip of what goes on sys.path: unpacking it is its installation, less the
console scripts the course does not call (https://packaging.python.org/en/latest/specifications/binary-distribution-format/).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from benchtools.resultfiles import read_result, write_result
from wellfno.cli import UserError, atomic_write_json, atomic_write_text, run_main

REPO = Path(__file__).resolve().parents[1]
WHEEL_LIST = REPO / "tests" / "device" / "wheels.txt"
# What comes back from a lent machine: at most 8 files, at most two folders below $OUT
# (the lending tool's limits, as issue 40 gives them); the summary writes only these.
OUT_FILES = ("day0.txt", "day0.json", "gpu_check.txt", "gpu_check.json", "toolchain.txt",
             "compile.log", "day0.log", "ladder.json")
MAX_FILES = 8
LOG_TAIL_LINES = 60  # of each step's log, in day0.log
TIMED_OUT = (124, 137)  # timeout(1)'s exit codes: its TERM, then its KILL (-k)


def canonical(name: str) -> str:
    """A distribution's name as packaging compares them (PEP 503): the_well == the-well."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted(path: Path = WHEEL_LIST) -> dict[str, str]:
    """{canonical name: version} of the list (`name==version` lines; comments, blanks skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonical(name)] = version.strip()
    return out


def installed_version(name: str, path: list[str]) -> str | None:
    found = metadata.distributions(name=name, path=path)
    return next((d.version for d in found), None) if found else None


def _pure(whl: zipfile.ZipFile) -> bool:
    info = next((n for n in whl.namelist() if n.endswith(".dist-info/WHEEL")), None)
    text = whl.read(info).decode() if info else ""
    return "Root-Is-Purelib: true" in text


def unpack(wheel: Path, target: Path) -> None:
    """A pure-Python wheel into `target`, its .dist-info last: a run cut short leaves no metadata
    of a half-unpacked package (so the next run unpacks it again instead of trusting it)."""
    with zipfile.ZipFile(wheel) as whl:
        if not _pure(whl):
            raise UserError(f"{wheel} is not a pure-Python wheel: `make device-wheels` fetches "
                            "py3-none-any ones only; delete it and run that again")
        names = whl.namelist()
        for name in names:
            if name.startswith("/") or ".." in Path(name).parts:
                raise UserError(f"{wheel} holds a path outside its folder ({name}): not a wheel "
                                "pip made; delete it and run `make device-wheels` again")
        for name in sorted(names, key=lambda n: ".dist-info/" in n):
            whl.extract(name, target)


def site(wheels: Path, target: Path, listing: Path = WHEEL_LIST) -> dict:
    """Unpack into `target` every package of `listing` this Python lacks, from `wheels`."""
    target.mkdir(parents=True, exist_ok=True)
    path = [str(target), *sys.path]
    by_name = {}
    for whl in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
        by_name.setdefault(canonical(whl.name.split("-")[0]), whl)
    record = {"machine": {}, "added": {}, "wheels": str(wheels)}
    missing = []
    for name, version in wanted(listing).items():
        have = installed_version(name, path)
        if have is not None:
            record["machine"][name] = have  # the machine's own, whatever its version: not shadowed
        elif name in by_name:
            unpack(by_name[name], target)
            record["added"][name] = by_name[name].name.split("-")[1]
        else:
            missing.append(f"{name}=={version}")
    if missing:
        raise UserError(f"{sys.executable} lacks {', '.join(missing)} and {wheels} has no wheel of "
                        f"{'it' if len(missing) == 1 else 'them'}: run `make device-wheels` where "
                        f"there is a network and bring {wheels}/ with the repository "
                        "(INSTRUCTORS.md, 'Day-0 check')")
    record["problems"] = too_old(path) + import_problems(target)
    return record


# ------------------------------------------------------------------ what the course imports
# The machine's binary packages (scipy, h5py, numpy, matplotlib: compiled, so no pure-Python wheel
# of theirs exists for `make device-wheels` to bring) come from the site. Each one the course
# imports and this Python lacks, or has too old, is one line at the site step, before a later
# step runs into it (issue 48: neuralop's tensorly imports scipy).
LOAD = ("load the site's {pkg} (`module load`, or the site's image or container that has it) "
        "or give PY=<a python that imports it>")


def _distribution_of(module: str) -> str:
    """The distribution that installs top-level `module` (yaml: PyYAML), else its own name."""
    return next(iter(metadata.packages_distributions().get(module, [])), module)


def too_old(path: list[str]) -> list[str]:
    """One line for each package this Python has at a version that a course's package (of
    wheels.txt) does not accept: its declared requirements (Requires-Dist, extras left out) against
    what is installed; one that is not installed is the imports' question, not this one's."""
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pytest's requirement: a machine without it fails at the imports
        return []
    problems = {}
    for name in wanted():
        dist = next(iter(metadata.distributions(name=name, path=path)), None)
        for text in (dist.requires or []) if dist else []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed_version(req.name, path)
            if have is not None and not req.specifier.contains(have, prereleases=True):
                old = any(s.operator in (">=", ">", "~=", "==") and Version(have) < Version(
                    s.version.rstrip(".*")) for s in req.specifier)
                problems.setdefault(canonical(req.name), (
                    f"{sys.executable} has {req.name} {have}, too {'old' if old else 'new'}: "
                    f"{dist.metadata['Name']} {dist.version} needs {req.name}{req.specifier}; "
                    + LOAD.format(pkg=f"{req.name}{req.specifier}")))
    return list(problems.values())


def _importers(err: BaseException, missing: str) -> list[str]:
    """The packages whose import led to `err`, outermost first (the modules run in its traceback),
    less `missing` and the course's own."""
    out = []
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        name = frame.f_globals.get("__name__", "") if frame.f_code.co_name == "<module>" else ""
        top = name.split(".")[0]
        if top and top not in (missing, "coursetools", "importlib") and top not in out:
            out.append(top)
        tb = tb.tb_next
    return out


def import_problems(target: Path, modules: dict[str, str] | None = None) -> list[str]:
    """Import every module of other packages the day-0 check's programs import
    (coursetools.imports) with `target` first on the path, as day0.sh's PYTHONPATH puts it: one
    line for each package missing or broken (the first module that needs it names it)."""
    import os

    from coursetools import imports

    modules = imports.needed() if modules is None else modules
    # In a child whose PYTHONPATH starts with `target`, as the programs will run: this process's
    # own imports (and sys.path) stay as they were.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(target), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    child = subprocess.run([sys.executable, "-c", "import json, sys; from coursetools import day0; "
                            "print(json.dumps(day0.problems_importing(json.loads(sys.argv[1]))))",
                            json.dumps(modules)], env=env, capture_output=True, text=True)
    if child.returncode != 0:
        return [f"{sys.executable} could not check the imports: {child.stderr.strip()[-300:]}"]
    return json.loads(child.stdout)


def problems_importing(modules: dict[str, str]) -> list[str]:
    """import_problems' lines, for the imports of this process's path (its child's)."""
    import importlib

    problems: dict[str, str] = {}
    for module, where in modules.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            missing = (err.name or module).split(".")[0]
            chain = [m for m in _importers(err, missing) if m != missing]
            via = chain[0] if chain else where
            through = f" (through {', '.join(chain[1:])})" if len(chain) > 1 else ""
            pkg = _distribution_of(missing)
            problems.setdefault(missing, (
                f"{sys.executable} lacks {pkg}, which {via} imports{through}: not among the "
                "pure-Python wheels `make device-wheels` brings (tests/device/wheels.txt), so it "
                "comes from the site; " + LOAD.format(pkg=pkg)))
        except Exception as err:  # noqa: BLE001 - a broken or too old binary package: its line
            culprit = (getattr(err, "name", None) or "").split(".")[0] or \
                (_importers(err, "") or [module.split(".")[0]])[-1]
            pkg = _distribution_of(culprit)
            version = installed_version(pkg, sys.path)
            problems.setdefault(culprit, (
                f"{sys.executable} cannot import {module} ({pkg} {version or '?'}): "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; "
                + LOAD.format(pkg=f"{pkg} that works with the rest")))
    return list(problems.values())


# --------------------------------------------------------------------------- ladder
# The course's ladder, each row the script of the step that adds its idea, against the row it
# builds on: (row, script, options, index of the row it is compared with). The loader options
# (02's) stay on from 02 on, so that each later row adds its own idea only.
NO_SYNCS = ["--log-every", "100000"]  # never read back inside the timed steps (08's idea)
LADDER = (
    ("fno.py", "fno.py", [], None),
    ("02 data pipeline", "solutions/02_data_pipeline/fno.py", ["{loader}"], 0),
    ("08 no host syncs", "solutions/08_host_syncs/fno.py", ["{loader}", "{bind}", *NO_SYNCS], 1),
    ("09 mixed precision (bf16)", "solutions/09_mixed_precision/fno.py",
     ["{loader}", "{bind}", *NO_SYNCS, "--amp", "bf16"], 2),
    ("11 torch.compile", "solutions/11_compile/fno.py",
     ["{loader}", "{bind}", *NO_SYNCS, "--compile"], 2),
)


def _options(options: list[str], workers: int, gpu: bool) -> list[str]:
    loader = ["--num-workers", str(workers), "--fast-reader"] + (["--pin-memory"] if gpu else [])
    out = []
    for o in options:
        out += loader if o == "{loader}" else ["--bind", "none"] if o == "{bind}" else [o]
    return out


def _flops_per_sample(dataset_dir: Path) -> float:
    """FLOPs of one training sample of the scripts' default model (width 32) on this dataset:
    the rows' metrics.json before step 10 have none (solutions/11_compile/benchmark.py counts the
    same way)."""
    import torch

    from wellfno import data, flops
    from wellfno.model import NextFrameFNO

    splits = data.well_datasets(dataset_dir, 1)
    fields = len(data.channel_names(splits["train"]))
    grid = tuple(splits["train"][0]["input_fields"].shape[1:3])
    ones = torch.ones(fields)
    model = NextFrameFNO(fields, 1, dict(mean=0 * ones, std=ones, mean_delta=0 * ones,
                                         std_delta=ones))
    x = torch.zeros(2, fields, *grid)
    return flops.training_flops_per_sample(model, x, x[:, :fields], model.loss)["per_sample"]


def ladder(data_dir: Path, out: Path, steps: int, row_seconds: float, seconds: float,
           device_name: str, workers: int, compile_row: bool, first_rows: int = len(LADDER)
           ) -> dict:
    """Each row's training samples/s (its metrics.json: the run's first step left out), GFLOP/s
    and MFU against the device's cited peak (wellfno.flops.GPU_PEAKS) for its precision; a row
    past its time, or refused, is skipped with the reason."""
    import torch

    from wellfno import data, flops
    from wellfno.device import pick_device

    from coursetools import energy

    device = pick_device(device_name)
    gpu = device.type == "cuda"
    dataset_dir = data.resolve_dataset(str(data_dir), data.EMBEDDED)
    per_sample = _flops_per_sample(dataset_dir)
    peak = flops.device_peak(device)
    counter, energy_source = energy.open_counter(torch, device)  # or None, and why
    deadline = time.monotonic() + seconds
    rows, best = [], []
    for i, (name, script, options, against) in enumerate(LADDER):
        row = {"row": name, "against": None if against is None else LADDER[against][0],
               "speedup_of": "samples/s", "speedup": None, "skipped": None}
        opts = _options(options, workers, gpu)
        row["command"] = " ".join([script, *opts])
        if i >= first_rows:
            row["skipped"] = f"left out (--rows {first_rows})"
        elif name.startswith("11") and not compile_row:
            row["skipped"] = "compile left out (a CPU's Inductor compile takes minutes)"
        allowed = min(row_seconds, deadline - time.monotonic())
        if row["skipped"] is None and allowed < 5:
            row["skipped"] = "no time left"
        metrics = None
        if row["skipped"] is None:
            run_out = out.parent / "runs" / name.split()[0]
            cmd = [sys.executable, str(REPO / script), "--data-dir", str(data_dir), "--out",
                   str(run_out), "--epochs", "1000", "--max-steps", str(steps), "--seed", "0",
                   "--device", device.type, *opts]
            trace = energy.Trace(counter) if counter else contextlib.nullcontext()
            try:
                with trace:
                    rc, stderr, opened = energy.run_watched(cmd, allowed, REPO)
            except subprocess.TimeoutExpired:
                row["skipped"] = f"timed out after {allowed:.0f} s"
            else:
                if rc:
                    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
                    row["skipped"] = (errors or stderr.strip().splitlines()[-1:] or ["?"])[-1]
                    row["failed"] = not errors  # a refusal says why in one line; else a crash
                else:
                    metrics = json.loads((run_out / "metrics.json").read_text())
                    row["energy"] = _row_energy(trace, opened, metrics, energy_source)
        best.append(metrics)
        if metrics is not None:
            amp = "bf16" if "--amp" in opts else "none"
            fps = metrics.get("flops_per_sample") or per_sample
            use = flops.utilization(fps, metrics["samples_per_second"], peak, amp)
            row.update(samples_per_s=metrics["samples_per_second"], flops_per_sample=fps,
                       achieved_flops_per_s=use["achieved_flops_per_s"],
                       peak_flops_per_s=use["peak_flops_per_s"],
                       peak_precision=use["peak_precision"], mfu=use["mfu"],
                       peak_memory_bytes=metrics.get("peak_memory_bytes"),
                       peak_memory_of=metrics.get("peak_memory_of"),
                       compile_seconds=metrics.get("compile_seconds"))
            row.update(joules_per_sample=row["energy"].get("joules_per_sample"),
                       mean_watts=row["energy"].get("mean_watts"))
            if against is not None and best[against] is not None:
                row["speedup"] = (metrics["samples_per_second"]
                                  / best[against]["samples_per_second"])
        else:
            row.update(dict.fromkeys(("samples_per_s", "flops_per_sample", "achieved_flops_per_s",
                                      "peak_flops_per_s", "peak_precision", "mfu",
                                      "peak_memory_bytes", "peak_memory_of", "compile_seconds",
                                      "joules_per_sample", "mean_watts")))
        rows.append(row)
        print(f"{name}: " + (f"skipped: {row['skipped']}" if row["skipped"] else
                             f"{row['samples_per_s']:.1f} samples/s"), flush=True)
    grid = "x".join(map(str, data.well_datasets(dataset_dir, 1)["train"][0]["input_fields"]
                        .shape[1:3]))
    if counter:
        counter.close()
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if gpu else None,
              "peak_device": peak.name, "peak_source": peak.source, "steps": steps,
              "grid": grid, "workers": workers, "rows": rows,
              "energy": {"source": energy_source} if counter else {"not_answered": energy_source}}
    command = shlex.join(["python", "-m", "coursetools.day0", "ladder", *sys.argv[2:]])
    write_result(out, command, result, device)
    print(ladder_markdown(result))
    return result


def _row_energy(trace, opened: dict, metrics: dict, source: str) -> dict:
    """A row's energy of its timed steps (coursetools.energy), or NOT ANSWERED and why."""
    from coursetools import energy

    if not isinstance(trace, energy.Trace):
        return {"not_answered": source}
    try:
        return energy.timed_energy(trace, opened, metrics["history"])
    except (LookupError, ValueError) as why:
        return {"not_answered": str(why)}


def ladder_markdown(result: dict) -> str:
    """The ladder's table (wellfno.flops.efficiency_markdown), J per sample and mean W of each
    row's timed steps beside it, and where the energy came from, or why it is NOT ANSWERED."""
    from wellfno.flops import efficiency_markdown

    rows = result["rows"]
    table, _, notes = efficiency_markdown(rows).partition("\n\n")
    lines = table.splitlines()
    if "energy" not in result:  # a ladder from before the energy columns
        return efficiency_markdown(rows)
    cells = [" J/sample | mean W |", "---:|---:|"] + [
        " - | - |" if r.get("joules_per_sample") is None else
        f" {r['joules_per_sample']:.3g} | {r['mean_watts']:.0f} |" for r in rows]
    lines = [line + cell for line, cell in zip(lines, cells)]
    why = result["energy"].get("not_answered")
    missing = [f"{r['row']}: {r['energy']['not_answered']}" for r in rows
               if (r.get("energy") or {}).get("not_answered") and not why]
    energy_line = (f"Energy: NOT ANSWERED ({why})." if why else
                   f"Energy of each row's timed steps: {result['energy']['source']}"
                   + (f"; NOT ANSWERED for {'; '.join(missing)}" if missing else "") + ".")
    return "\n".join(lines + [""] + ([notes, ""] if notes else []) + [energy_line])


# --------------------------------------------------------------------------- the GPU ladder in the docs
# A GPU machine's ladder.json, kept in the repository (`keep`): the docs' GPU column
# (coursetools.results renders it beside the CPU's efficiency.json; coursetools.staleness checks
# its commit, coursetools.measure.ELSEWHERE). One file: a later GPU's ladder replaces it.
GPU_LADDER = Path("results") / "gpu" / "ladder.json"
HOW_TO_MEASURE = ("`OUT=DIR bash tests/device/day0.sh` on a GPU machine (on a Slurm cluster, in a "
                  "GPU allocation: `slurm/00_gpu_check.sbatch` checks the node but runs no "
                  "ladder), then `python -m coursetools.day0 keep DIR/ladder.json` and "
                  "`python -m coursetools.results render` (INSTRUCTORS.md, day-0 check)")


def check_gpu_ladder(result: dict, path) -> dict:
    """`result` when it is a ladder measured on a GPU; else one line naming `path` (a dry run's
    ladder.json, measured on a CPU, is never shown as GPU numbers)."""
    data, machine = result["data"], result["machine"]
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or "peak_device" not in data:
        raise UserError(f"{path} is not a ladder (the results file of `python -m coursetools.day0 "
                        "ladder`, ladder.json of the day-0 check)")
    if not (str(data.get("device", "")).startswith("cuda") and data.get("gpu")
            and machine.get("gpu")):
        raise UserError(f"{path} was measured on a CPU (device {data.get('device')!r}, no GPU in "
                        "its machine): a dry run's ladder, not GPU numbers; delete it and keep a "
                        "GPU machine's ladder.json")
    return result


def gpu_ladder(root) -> dict | None:
    """The repository's GPU ladder (GPU_LADDER), None where there is none yet; a CPU's refused."""
    path = Path(root) / GPU_LADDER
    return check_gpu_ladder(read_result(path), GPU_LADDER) if path.exists() else None


def gpu_machine(result: dict) -> str:
    """The GPU, the torch and its CUDA or ROCm version a ladder was measured with."""
    m = result["machine"]
    backend = (f"ROCm {m['hip']}" if m.get("hip") else f"CUDA {m['cuda']}" if m.get("cuda")
               else "CUDA/ROCm version not recorded")
    return f"{result['data'].get('gpu') or m.get('gpu')}, torch {m.get('torch', '?')}, {backend}"


def measured_commit(result: dict) -> str:
    commit = result.get("commit")
    if not commit:
        return f"at an unrecorded commit ({result.get('commit_note') or 'it records none'})"
    dirty = result.get("uncommitted") or []
    return f"at commit {commit[:7]}" + (f" with uncommitted changes to {', '.join(dirty)}"
                                        if dirty else "")


def ladder_row_text(row: dict) -> str:
    """One ladder row: samples/s, its speed-up against the row it builds on, MFU (or why not)."""
    if row["skipped"]:
        return f"{row['row']} skipped ({row['skipped']})"
    text = f"{row['row']} {row['samples_per_s']:.0f} samples/s"
    if row.get("speedup") is not None:
        text += f" ({row['speedup']:.2f}× {row['against']})"
    text += ("" if row.get("mfu") is None else
             f", MFU {100 * row['mfu']:.2f} % of {row['peak_precision']}")
    return text + ("" if row.get("joules_per_sample") is None else
                   f", {row['joules_per_sample']:.3g} J/sample at {row['mean_watts']:.0f} W")


def keep(file: Path, root: Path, commit: str | None = None) -> Path:
    """A GPU machine's ladder.json into ROOT/GPU_LADDER (a CPU's refused). A file measured
    outside a git checkout records no commit: --commit names the one whose tree ran."""
    result = check_gpu_ladder(read_result(file), file)
    if commit:
        if result.get("commit"):
            raise UserError(f"{file} records its commit ({result['commit'][:7]}): --commit is "
                            "only for a file measured outside a git checkout")
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet",
                               f"{commit}^{{commit}}"], capture_output=True, text=True)
        if done.returncode:
            raise UserError(f"--commit {commit} is not a commit of {root}'s history")
        result.update(commit=done.stdout.strip(), clean=None,
                      commit_note=f"measured outside a git checkout; commit given by "
                                  f"`keep --commit {commit}`")
    elif not result.get("commit"):
        print(f"warning: {file} records no commit (measured outside a git checkout): its "
              "numbers count as stale; give --commit REV, the commit whose tree ran there",
              file=sys.stderr)
    target = root / GPU_LADDER
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(target, result)
    return target


# --------------------------------------------------------------------------- summary
def read_steps(path: Path) -> list[dict]:
    """day0.sh's record: one `name<TAB>exit code<TAB>seconds<TAB>budget<TAB>note` line a step."""
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, rc, took, budget, *note = line.split("\t")
        step = {"name": name, "seconds": int(took), "budget": int(budget),
                "note": note[0] if note else ""}
        if rc == "skipped":
            step.update(outcome="not answered", why="no time left")
        elif rc == "blocked":  # not run: an earlier step failed in a way every later one would
            step.update(outcome="skipped", why=step["note"], note="")
        elif int(rc) == 0:
            step.update(outcome="ok")
        elif int(rc) in TIMED_OUT and int(took) >= int(budget) - 1:
            step.update(outcome="not answered", why=f"timed out after {budget} s")
        else:
            step.update(outcome="failed", why=f"exit {rc}")
        steps.append(step)
    return steps


def _q(question: str, outcome: str, text: str) -> dict:
    return {"question": question, "outcome": outcome, "text": text}


def _ladder_answer(question: str, result: dict | None) -> dict:
    rows = ((result or {}).get("data") or {}).get("rows") or []
    done = [r for r in rows if not r["skipped"]]
    if any(r.get("failed") for r in rows):
        return _q(question, "failed", "; ".join(f"{r['row']}: {r['skipped']}" for r in rows
                                                if r.get("failed")))
    if not done:
        return _q(question, "not answered", "; ".join(f"{r['row']}: {r['skipped']}" for r in rows)
                  or "no ladder.json")
    mfu = lambda r: "" if r["mfu"] is None else f", MFU {100 * r['mfu']:.2f}%"  # noqa: E731
    joules = lambda r: ("" if r.get("joules_per_sample") is None  # noqa: E731
                        else f", {r['joules_per_sample']:.3g} J/sample")
    return _q(question, "ok", "; ".join(
        f"{r['row']} {r['samples_per_s']:.0f} samples/s{mfu(r)}{joules(r)}" if not r["skipped"]
        else f"{r['row']} skipped ({r['skipped']})" for r in rows))


def questions(steps: dict[str, dict], report: dict | None, gpus: int,
              ladder_result: dict | None = None, dry_run: bool = False) -> list[dict]:
    """Each GPU question of the day: answered (its answer), failed, or NOT ANSWERED (why)."""
    from coursetools import gpucheck

    node = (report or {}).get("node") or {}
    tasks = (report or {}).get("tasks") or []
    asked = [
        ("task", "matmul and FFT on each GPU against float64"),
        ("node", "training steps of the course's model on the GPU (samples/s, utilization)"),
        ("node", "complex gradients under DDP over NCCL/RCCL"),
        ("node", "NCCL/RCCL transport between the GPUs"),
        ("node", "step 06 --amp bf16 against float32 on the GPU"),
        ("node", "step 06 --compile against float32 on the GPU"),
        ("node", "pytest -m gpu"),
        ("compile", "solution 11 --compile on the GPU (the compiled model, its spectral "
                    "convolutions run eagerly)"),
        ("ladder", "the course's ladder on the GPU (samples/s, MFU, J/sample; ladder.json)"),
    ]
    out = []
    for step_name, question in asked:
        step = steps.get(step_name)
        if not gpus and not dry_run and step_name == "task":
            # a GPU machine whose torch sees no GPU: that is the answer, and it is wrong
            out.append(_q(question, "failed", "torch sees no GPU: a CPU build of torch, or a "
                                              "driver it cannot use; load the site's GPU build"))
        elif not gpus:
            out.append(_q(question, "not answered", "no GPU: torch sees none"))
        elif step is None:
            out.append(_q(question, "not answered", "its step did not run"))
        elif step_name == "node" and step["outcome"] == "not answered" and node:
            # cut off by its time: node.json holds what it answered (gpucheck writes it after
            # each answer), the rest is NOT ANSWERED for the step's reason
            out.append(_node_answer(question, node, gpucheck, cut_off=step["why"]))
        elif step["outcome"] == "skipped":
            out.append(_q(question, "not answered", f"its step was skipped: {step['why']}"))
        elif step["outcome"] != "ok":
            out.append(_q(question, step["outcome"], step["why"]))
        elif step_name == "ladder":
            out.append(_ladder_answer(question, ladder_result))
        elif step_name == "compile":
            out.append(_q(question, "ok", f"compiled and trained 3 steps ({step['seconds']} s)"))
        elif step_name == "task":
            bad = [f"rank {t['rank']} GPU {g['index']}" for t in tasks for g in t["gpus"]
                   if not (g["matmul_ok"] and g["fft_ok"])]
            out.append(_q(question, "failed" if bad else "ok",
                          f"wrong on {', '.join(bad)}" if bad else "right on every GPU"))
        else:
            out.append(_node_answer(question, node, gpucheck))
    for (step_name, _), q in zip(asked, out):
        q["step"] = step_name
    return out


# each node question's part of node.json (gpucheck.NODE_PARTS), by its first word
_NODE_PART = {"training": "training", "complex": "complex_ddp", "NCCL/RCCL": "transport",
              "step": "step_06", "pytest": "pytest_gpu"}


def _node_answer(question: str, node: dict, gpucheck, cut_off: str | None = None) -> dict:
    if not node:
        return _q(question, "failed", "no node results")
    if _NODE_PART[question.split()[0]] in gpucheck.missing_parts(node):  # cut off before it
        return _q(question, "not answered", f"the node step {cut_off} before it" if cut_off
                  else gpucheck.CUT_OFF)
    if question.startswith("training"):
        tr, ut = node["training"], node["utilization"]
        util = f", utilization mean {ut['mean_percent']:.0f}%" if ut.get("available") else ""
        return _q(question, "ok", f"{tr['samples_per_second']:.0f} samples/s at batch "
                                  f"{tr['batch']}, {tr['grid']}x{tr['grid']}{util}")
    if question.startswith("complex"):
        check = node.get("complex_ddp") or {}
        line = gpucheck.complex_ddp_line(node)
        if check.get("needs_gpus") or check.get("timed_out"):
            return _q(question, "not answered", check["why"])
        ok = not check.get("ran") or check.get("summary", {}).get("real_weights", {}).get("ok")
        return _q(question, "ok" if ok else "failed", line)
    if question.startswith("NCCL"):
        found = node.get("transport") or {}
        if found.get("needs_gpus") or found.get("timed_out"):
            return _q(question, "not answered", found["why"])
        return _q(question, "ok", gpucheck.transport_line(found))
    if question.startswith("step 06"):
        name = "bf16" if "bf16" in question else "compile"
        run = ((node.get("step_06") or {}).get("runs") or {}).get(name)
        if run is None:
            return _q(question, "not answered", (node.get("step_06") or {}).get("why", "not run"))
        if run.get("timed_out"):
            return _q(question, "not answered", run["why"])
        if run.get("not_supported"):
            return _q(question, "ok", f"not supported here, as the script says: {run['why']}")
        if "max_relative_loss_difference" not in run:
            return _q(question, "failed", run.get("why", "?"))
        return _q(question, "ok" if run["ok"] else "failed",
                  f"loss within {run['max_relative_loss_difference']:.1e} of float32 "
                  f"(tolerance {run['tolerance']:g})")
    tests = node.get("pytest_gpu") or {}
    if tests.get("timed_out"):
        return _q(question, "not answered" if tests.get("ok") else "failed", tests["summary"])
    if not tests.get("ran"):
        return _q(question, "not answered", tests.get("summary", "not run"))
    return _q(question, "ok" if tests.get("ok") else "failed", tests.get("summary", ""))


def _tail(path: Path, lines: int) -> str:
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def summary(scratch: Path, out: Path, gpus: int, dry_run: bool) -> int:
    """OUT's files from SCRATCH; the exit status: the number of failed steps and questions."""
    steps_list = read_steps(scratch / "steps.tsv")
    steps = {s["name"]: s for s in steps_list}
    report_file = scratch / "gpu" / "gpu_check.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else None
    node, rep = steps.get("node"), steps.get("report")
    if (node and node["outcome"] == "not answered" and rep and rep["outcome"] == "failed"
            and report and all(p.startswith("no node results") for p in report["problems"])):
        # the report failed only for want of the node step's results, and that step ran out of
        # its time: its questions are NOT ANSWERED, not failed
        rep.update(outcome="not answered", why=f"the node step {node['why']}")
    ladder_file = scratch / "ladder" / "ladder.json"
    ladder_result = json.loads(ladder_file.read_text()) if ladder_file.is_file() else None
    asked = questions(steps, report, gpus, ladder_result, dry_run)
    failed_steps = [s for s in steps_list if s["outcome"] == "failed"]
    # a wrong answer of a step that finished (a failed step's questions are that one failure)
    failed = [q for q in asked if q["outcome"] == "failed"
              and (steps.get(q["step"]) or {}).get("outcome") == "ok"]
    unanswered = [q for q in asked if q["outcome"] == "not answered"]
    skipped = [s for s in steps_list if s["outcome"] == "skipped"]
    if failed_steps or failed:
        verdict = (f"FAIL: {len(failed_steps)} step(s) failed, {len(failed)} question(s) "
                   "answered wrong" + (f", {len(skipped)} skipped ({skipped[0]['why']})"
                                       if skipped else ""))
    elif unanswered:
        whys = "; ".join(sorted({q["text"] for q in unanswered}))
        verdict = f"INCOMPLETE: {len(unanswered)} question(s) NOT ANSWERED ({whys})"
    else:
        verdict = "PASS"
    lines = [f"day-0 check: {verdict}" + ("   (dry run)" if dry_run else "")]
    site = steps.get("site")
    if site and site["outcome"] == "failed":  # what the machine lacks, and what to load
        lines += ["", "the site step:", *(f"  {line}" for line in _tail(
            scratch / "logs" / "site.log", LOG_TAIL_LINES).splitlines()
            if line.startswith("error: "))]
    lines += ["", "steps:"]
    for s in steps_list:
        state = {"ok": "ok", "failed": f"FAILED ({s.get('why')})",
                 "not answered": f"NOT ANSWERED ({s.get('why')})",
                 "skipped": f"SKIPPED ({s.get('why')})"}[s["outcome"]]
        note = f"; {s['note']}" if s["note"] else ""
        took = "" if s["outcome"] == "skipped" else f", {s['seconds']} s of {s['budget']}"
        lines.append(f"  {s['name']}: {state}{took}{note}")
    lines += ["", "GPU questions:"]
    for q in asked:
        state = {"ok": "", "failed": "FAILED: ", "not answered": "NOT ANSWERED "}[q["outcome"]]
        text = f"({q['text']})" if q["outcome"] == "not answered" else q["text"]
        lines.append(f"  {q['question']}: {state}{text}")
    if ladder_result:
        from benchtools.resultfiles import caption

        got = ladder_result["data"]
        lines += ["", f"the ladder (ladder.json; {caption(ladder_result)}; grid {got['grid']}, "
                      f"peak {got['peak_device']}):", ladder_markdown(got)]
    gpu_text = scratch / "gpu" / "gpu_check.txt"
    if gpu_text.is_file():
        lines += ["", "the day-0 report (gpu_check.txt):", gpu_text.read_text().rstrip()]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    copies = {"gpu_check.txt": gpu_text, "gpu_check.json": report_file,
              "toolchain.txt": scratch / "logs" / "toolchain.log",
              "ladder.json": scratch / "ladder" / "ladder.json"}
    for name, src in copies.items():
        if src.is_file():
            shutil.copyfile(src, out / name)
    compile_log = _tail(scratch / "logs" / "compile.log", 200)
    if compile_log:
        atomic_write_text(out / "compile.log", compile_log + "\n")
    atomic_write_text(out / "day0.log", "".join(
        f"===== {s['name']} (last {LOG_TAIL_LINES} lines of {scratch / 'logs' / s['name']}.log)\n"
        f"{_tail(scratch / 'logs' / (s['name'] + '.log'), LOG_TAIL_LINES)}\n" for s in steps_list))
    atomic_write_json(out / "day0.json", {"verdict": verdict, "dry_run": dry_run, "gpus": gpus,
                                          "steps": steps_list, "questions": asked})
    atomic_write_text(out / "day0.txt", text)
    print(text, end="")
    return min(len(failed_steps) + len(failed), 100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("site", help="unpack the course's packages this Python lacks")
    s.add_argument("--wheels", required=True, help="folder of wheels (make device-wheels)")
    s.add_argument("--target", required=True, help="folder to unpack them into (on PYTHONPATH)")
    s.add_argument("--record", help="write what came from where here (JSON)")
    lad = sub.add_parser("ladder", help="the course's ladder: samples/s and MFU of each step")
    lad.add_argument("--data-dir", required=True, help="folder that holds datasets/")
    lad.add_argument("--out", required=True, help="the results file (JSON) to write")
    lad.add_argument("--steps", type=int, default=40, help="training steps per row")
    lad.add_argument("--row-seconds", type=float, default=60, help="time limit of each row")
    lad.add_argument("--seconds", type=float, default=150, help="time limit of the whole ladder")
    lad.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    lad.add_argument("--num-workers", type=int, default=4, help="DataLoader workers, 02 on")
    lad.add_argument("--no-compile", action="store_true", help="leave out the compiled row")
    lad.add_argument("--rows", type=int, default=len(LADDER),
                     help=f"only the first ROWS rows (of {len(LADDER)}; a dry run's few)")
    k = sub.add_parser("keep", help=f"a GPU machine's ladder.json into {GPU_LADDER} (the docs' "
                                    "GPU column; a CPU's refused)")
    k.add_argument("file", help="the ladder.json the day-0 check wrote (OUT/ladder.json)")
    k.add_argument("--commit", help="the commit whose tree ran there, for a file that records "
                                    "none (measured outside a git checkout)")
    k.add_argument("--root", default=".", help="repository root (default: here)")
    m = sub.add_parser("summary", help="SCRATCH's results as OUT's few files")
    m.add_argument("--scratch", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--gpus", type=int, required=True, help="GPUs torch sees")
    m.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "site":
        wheels, target = Path(args.wheels), Path(args.target)
        if wheels.exists() and not wheels.is_dir():
            raise UserError(f"--wheels {wheels} is a file; give the folder that "
                            "`make device-wheels` made")
        if target.exists() and not target.is_dir():
            raise UserError(f"--target {target} is a file; give a folder")
        record = site(wheels, target)
        if args.record:
            atomic_write_json(args.record, record)
        for line in record["problems"]:  # each package on its own line; day0.sh skips the rest
            print(f"error: {line}", file=sys.stderr)
        if record["problems"]:
            return 2
        added = ", ".join(f"{n} {v}" for n, v in record["added"].items()) or "none"
        print(f"the course's packages: {len(record['machine'])} the machine's own, "
              f"{len(record['added'])} unpacked from {wheels} ({added})")
        return 0
    if args.cmd == "ladder":
        if min(args.steps, args.row_seconds, args.seconds, args.rows) < 1 or args.num_workers < 0:
            raise UserError("--steps, --row-seconds, --seconds and --rows must be at least 1, "
                            "--num-workers at least 0")
        ladder(Path(args.data_dir), Path(args.out), args.steps, args.row_seconds, args.seconds,
               args.device, args.num_workers, not args.no_compile, args.rows)
        return 0
    if args.cmd == "keep":
        root = Path(args.root).resolve()
        if not (root / "fno.py").is_file():
            raise UserError(f"{root} is not the repository root (no fno.py there): use --root")
        kept = keep(Path(args.file), root, args.commit)
        print(f"kept {kept.relative_to(root)}: now `python -m coursetools.results render`")
        return 0
    scratch, out = Path(args.scratch), Path(args.out)
    if not scratch.is_dir():
        raise UserError(f"--scratch {scratch} is not a folder; run tests/device/day0.sh")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")
    return summary(scratch, out, args.gpus, args.dry_run)


if __name__ == "__main__":
    run_main(main)
