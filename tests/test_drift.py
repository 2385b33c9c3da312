"""Drift between steps: what a solution does not change on purpose is the previous step's, exactly.

Each solution is the previous one plus one idea, and every step is a full copy, so a fix made in
one copy can silently miss the next (solution 06 once lost two of solution 05's fixes). CHANGES
lists, per step, what its solution changes on purpose; everything else must have the same syntax
tree as in the previous step's solution:

- a function or class not named in the step's entry is identical to the previous step's;
- a function named with a list of statement beginnings may change only those statements (its
  other statements, at every depth, are identical): how the big functions `main` and `train` are
  checked; one named with "*" may change anywhere (small functions the idea rewrites);
- "+name" is new in the step; MOVED says where a function that leaves a solution went (then the
  package's copy is the taught code: the same syntax tree as in the step that taught it).
"""
from __future__ import annotations

import ast
import difflib
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO, STEPS

EVERYWHERE = "*"
# step: {function: EVERYWHERE | [beginnings of the statements it changes]}, "+new", ...
CHANGES = {
    "05_ddp": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE, "main": EVERYWHERE,
        "+train": EVERYWHERE,
    },
    "06_exact_metrics": {
        "parse_args": EVERYWHERE, "validate": EVERYWHERE,
        "main": ["try:", "dist.init_process_group(", "with Watchdog(",
                 "raise UserError(f\"rank {env.rank} cannot join"],
        "train": ['checkpoint = out / "checkpoint.pt"', "if args.eval_only",
                  'for split in ("train", "valid")',
                  "train_sampler = DistributedSampler(", "valid_loader = DataLoader(",
                  "if (args.resume or args.eval_only)", "log(f\"{'Evaluating' if args.eval_only",
                  "for epoch in range(", "left_out = ", "if left_out:", "row = over_ranks(",
                  'row["valid_loss"], row["samples_left_out"]', 'log(f"epoch {epoch}',
                  "atomic_torch_save(",
                  "valid_loss = (validate(", 'atomic_write_json(out / "metrics.json"'],
    },
    "07_host_syncs": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE, "+synchronize": EVERYWHERE,
        "train": ["row = train_one_epoch("],
    },
    "08_mixed_precision": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "+spectral_convs_in_float32": EVERYWHERE, "+ComplexGradsAsReal": EVERYWHERE,
        "train": ["check_amp(", "spectral_convs_in_float32(", "scaler = ", "amp_dtype = ",
                  "autocast = ",
                  "scaler.load_state_dict(", 'log(f"Training on', "row = train_one_epoch(",
                  "atomic_torch_save(",
                  'if device.type == "cuda":  # what low precision saves',
                  'atomic_write_json(out / "metrics.json"'],
    },
    "09_compile_mfu": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "train": ["if args.compile", "if args.nvtx", "grid = ", "if args.modes > min(grid)",
                  "train_loader = DataLoader(",
                  "model = NextFrameFNO.for_dataset(", "example = ", "counted = ",
                  'if device.type == "cuda":  # the count ran',
                  "torch.cuda.reset_peak_memory_stats(",
                  "train_model = ", 'log(f"Training on', "nvtx = ", "nvtx.__enter__()",
                  "nvtx.__exit__(",
                  "row = train_one_epoch(", 'log(f"epoch {epoch}', "excludes += ", "efficiency = ",
                  "mfu = ",
                  'print(f"{efficiency', 'atomic_write_json(out / "metrics.json"'],
    },
    "10_checkpointing": {
        "parse_args": EVERYWHERE,
        "train": ["if args.checkpoint_blocks", "log(memory.check_step_fits("],
    },
    "11_domain_parallel": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE, "+validate": EVERYWHERE,
        "train": ["layout = domain.ProcessGrid.create(", "groups = ", "if len(splits[split]) < ",
                  "slab = ", "if args.domain_size", "train_sampler = DistributedSampler(",
                  "valid_loader = DataLoader(", "domain.check_layout(", "domain.split_model(",
                  "loss_fn = ", "log(memory.check_step_fits(", "example = ", "counted = ",
                  "global_batch = ", 'log(f"global batch', "left_out = ",
                  'log(f"epoch {epoch}: training samples', "row = train_one_epoch(",
                  "row.update(", 'row["valid_loss"]', 'row["samples_left_out"]',
                  "valid_loss = (validate(", "true, pred = example"],
    },
}
# function -> (the module later steps import it from, the step whose solution taught it)
MOVED = {
    "validate": ("wellfno.ranks", "06_exact_metrics"),
    "spectral_convs_in_float32": ("wellfno.amp", "08_mixed_precision"),
    "ComplexGradsAsReal": ("wellfno.amp", "08_mixed_precision"),
}
# APIs newer than the oldest torch the course supports (requirements.txt, INSTRUCTORS.md).
TOO_NEW = {"torch.amp.is_autocast_available": "torch 2.4 (wellfno.amp.autocast_available works on "
                                              "any)"}
CHECKED = list(CHANGES)  # the steps after 04 (03 -> 05 -> ... -> 09)


def definitions(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _header(node: ast.stmt) -> str:
    """A compound statement without its bodies (for an if: the test; a for: target and iterable)."""
    bodies = ("body", "orelse", "handlers", "finalbody")
    shown = []
    for key, value in ast.iter_fields(node):
        if key in bodies:
            continue
        if isinstance(value, list):
            value = [ast.dump(x) if isinstance(x, ast.AST) else x for x in value]
        shown.append((key, ast.dump(value) if isinstance(value, ast.AST) else value))
    return type(node).__name__ + repr(shown)


def _bodies(node: ast.stmt) -> list[list[ast.stmt]]:
    found = [getattr(node, k, None) for k in ("body", "orelse", "finalbody")]
    found += [h.body for h in getattr(node, "handlers", [])]
    return [b for b in found if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]


def changed_statements(old: list[ast.stmt], new: list[ast.stmt], old_src: str,
                       new_src: str) -> list[str]:
    """First lines of the statements that differ between two bodies, at the innermost depth.

    A compound statement (if, for, with, try) whose header is unchanged is looked into rather than
    reported whole; a statement replaced by others is reported as its replacements; one removed
    with nothing in its place as "removed: ...".
    """
    def first_line(src, node):
        return ast.get_source_segment(src, node).splitlines()[0].strip()

    found = []
    matcher = difflib.SequenceMatcher(a=[ast.dump(s) for s in old], b=[ast.dump(s) for s in new],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "delete":
            found += [f"removed: {first_line(old_src, s)}" for s in old[i1:i2]]
            continue
        candidates = [x for x in old[i1:i2] if _bodies(x)]
        for y in new[j1:j2]:
            same = next((x for x in candidates if type(x) is type(y) and _header(x) == _header(y)
                         and len(_bodies(x)) == len(_bodies(y))), None)
            if same is None:
                found.append(first_line(new_src, y))
                continue
            candidates.remove(same)
            for body_x, body_y in zip(_bodies(same), _bodies(y)):
                found += changed_statements(body_x, body_y, old_src, new_src)
    return found


def drift(old_src: str, new_src: str, changes: dict) -> list[str]:
    """What `new_src` changes against `old_src` that `changes` (one CHANGES entry) does not list."""
    old, new = definitions(ast.parse(old_src)), definitions(ast.parse(new_src))
    problems = []
    for name, node in new.items():
        allowed = changes.get(name, changes.get(f"+{name}") if name not in old else None)
        if name not in old:
            if allowed is None:
                problems.append(f"{name} is new but not listed as '+{name}'")
            continue
        if ast.dump(node) == ast.dump(old[name]) or allowed == EVERYWHERE:
            continue
        if allowed is None:
            problems.append(f"{name} differs from the previous step's and is not listed as changed")
            continue
        for line in changed_statements(old[name].body, node.body, old_src, new_src):
            if not any(line.startswith(begin) for begin in allowed):
                problems.append(f"{name}: `{line}` changed, not in the step's list")
    for name in old.keys() - new.keys():
        if name not in MOVED:
            problems.append(f"{name} disappeared: list it in MOVED with the module it moved to")
    return problems


def source(step: str) -> str:
    return (REPO / STEPS[step]).read_text()


@pytest.mark.parametrize("step", CHECKED)
def test_each_solution_changes_only_what_its_step_lists(step):
    before = list(STEPS)[list(STEPS).index(step) - 1]
    problems = drift(source(before), source(step), CHANGES[step])
    assert not problems, f"{STEPS[step]} against {STEPS[before]}: " + "; ".join(problems)


@pytest.mark.parametrize("name", list(MOVED))
def test_moved_code_is_the_taught_code(name):
    module, taught_in = MOVED[name]
    taught = definitions(ast.parse(source(taught_in)))[name]
    package_file = Path(importlib.import_module(module).__file__)
    moved = definitions(ast.parse(package_file.read_text()))[name]
    assert ast.dump(moved) == ast.dump(taught), f"{module}.{name} is not {STEPS[taught_in]}'s {name}"
    later = list(STEPS)[list(STEPS).index(taught_in) + 1:]
    for step in later:
        tree = ast.parse(source(step))
        if name in definitions(tree):
            continue  # not moved yet in this step
        imported = {(n.module, a.name) for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) for a in n.names}
        assert (module, name) in imported, \
            f"{STEPS[step]} neither defines {name} nor imports it from {module}"


@pytest.mark.parametrize("step", list(STEPS))
def test_docstring_names_its_own_solution_only(step):
    """The first line is what --help prints; a usage block copied from another step misleads."""
    doc = ast.get_docstring(ast.parse(source(step))) or ""
    assert doc.splitlines() and doc.splitlines()[0].strip(), f"{STEPS[step]} has no docstring first line"
    for other in STEPS:
        if other != step and other != "00_baseline":
            assert f"solutions/{other}/" not in doc, f"{STEPS[step]}'s docstring shows solutions/{other}/"


@pytest.mark.parametrize("step", list(STEPS))
def test_no_api_newer_than_the_oldest_torch(step):
    text = source(step)
    for api, since in TOO_NEW.items():
        assert api not in text, f"{STEPS[step]} calls {api}, which exists only from {since}"


def test_the_drift_check_catches_solution_06s_old_regressions():
    """The regressions solution 06 once had (issue 18): a hard-coded profiler sort key instead of
    traces.key_averages_sort_key, and the memory line printed by every rank instead of rank 0."""
    good = source("09_compile_mfu")
    bad = good.replace("sort_by = traces.key_averages_sort_key(device)",
                       'sort_by = "self_device_time_total" if device.type == "cuda" else '
                       '"self_cpu_time_total"')
    bad = bad.replace("log(memory.check_step_fits(", "print(memory.check_step_fits(")
    assert bad.count("print(memory.check_step_fits(") == 1 and "self_device_time_total" in bad
    problems = drift(source("08_mixed_precision"), bad, CHANGES["09_compile_mfu"])
    assert len(problems) == 2, problems
    assert any("sort_by" in p for p in problems) and any("check_step_fits" in p for p in problems), problems
