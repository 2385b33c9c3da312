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
import copy
import difflib
import importlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, STEPS, starting_script

EVERYWHERE = "*"
# step: {function: EVERYWHERE | [beginnings of the statements it changes]}, "+new", ...
CHANGES = {
    "05_ddp": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE, "main": EVERYWHERE,
        "+train": EVERYWHERE,
    },
    "06_exact_metrics": {
        "parse_args": EVERYWHERE, "validate": EVERYWHERE,
        "train": ['checkpoint = out / "checkpoint.pt"', "if args.eval_only",
                  'for split in ("train", "valid")',
                  "train_sampler = torch.utils.data.DistributedSampler(", "valid_loader = DataLoader(",
                  "if (args.resume or args.eval_only)", "log(f\"{'Evaluating' if args.eval_only", "log = (lambda *a, **k: None) if args.eval_only",
                  "for epoch in range(", "left_out = ", "if left_out:", "row = over_ranks(",
                  'row["valid_loss"], row["samples_left_out"]', 'log(f"epoch {epoch}',
                  "atomic_torch_save(",
                  "valid_loss = (validate(", 'atomic_write_json(out / "metrics.json"'],
    },
    "07_failures": {
        "parse_args": EVERYWHERE,
        "main": ["try:", "dist.init_process_group(", "with Watchdog(",
                 "raise UserError(f\"rank {env.rank} cannot join"],
        # blocks earlier steps taught, now package functions (MOVED_BLOCKS)
        "train": ["cpus, device = training.bind(", "dataset_dir, dataset_stats = ranks.open_",
                  "splits = fastwell.open_splits(", "loader_options = training.loader_options(",
                  "rollout.print_and_plot("],
    },
    "08_host_syncs": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE, "+synchronize": EVERYWHERE,
        "train": ["row = train_one_epoch(", "return window.finish("],
    },
    "09_mixed_precision": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "+spectral_convs_in_float32": EVERYWHERE,
        "train": ["check_amp(", "spectral_convs_in_float32(", "scaler = ", "amp_dtype = ",
                  "autocast = ",
                  "scaler.load_state_dict(", 'log(f"Training on', "row = train_one_epoch(",
                  "atomic_torch_save(",
                  "peak_memory = memory.peak_memory(", 'atomic_write_json(out / "metrics.json"'],
    },
    "10_mfu": {
        "parse_args": EVERYWHERE,
        "train": ["if args.nvtx", "grid = ", "if args.modes > min(grid)", "scaler, autocast = ",
                  "model = NextFrameFNO.for_dataset(", "example = ", "counted = ",
                  'if device.type == "cuda":  # the count ran',
                  "torch.cuda.reset_peak_memory_stats(",
                  'log(f"Training on', "nvtx = ", "nvtx.__enter__()", "nvtx.__exit__(",
                  "efficiency = ", "print(flops.utilization_line(",
                  'atomic_write_json(out / "metrics.json"'],
    },
    "11_compile": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "train": ["if args.compile", "train_loader = DataLoader(", "train_model = ",
                  'log(f"Training on', "row = train_one_epoch(", 'log(f"epoch {epoch}',
                  "excludes += ", 'atomic_write_json(out / "metrics.json"',
                  # step 10's count (its flop_count.py) from the package copy, wellfno.flops
                  # (tests/test_taught_modules.py)
                  "counted = "],
    },
    "12_checkpointing": {
        "parse_args": EVERYWHERE, "+checkpoint_blocks": EVERYWHERE,
        # blocks earlier steps taught, now package functions (MOVED_BLOCKS)
        "train": ["if args.checkpoint_blocks", "log(memory.check_step_fits(",
                  "cpus, device = training.bind(", "loader_options = training.loader_options(",
                  "options.check_modes(", "nvtx = ",
                  "model_vrmse, persistence_vrmse, (true, pred) = rollout.evaluate_on_dataset("],
    },
    "13_domain_parallel": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "train": ["layout = domain.ProcessGrid.create(", "group = ", "if len(splits[split]) < ",
                  "slab = ", "if args.domain_size", "train_sampler = torch.utils.data.DistributedSampler(",
                  "valid_loader = DataLoader(", "domain.check_layout(", "domain_conv.split_model(",
                  "loss_fn = ", "log(memory.check_step_fits(", "example = ", "counted = ",
                  "global_batch = ", 'log(f"global batch', "left_out = ",
                  'log(f"epoch {epoch}: training samples', "row = train_one_epoch(",
                  "row.update(", 'row["valid_loss"]', 'row["samples_left_out"]',
                  "valid_loss = (domain.validate(", "true, pred = example"],
    },
    "14_long_rollouts": {
        "parse_args": EVERYWHERE, "train_one_epoch": EVERYWHERE,
        "train": ["unrolled.check_arguments(", "domain.split_model(", 'splits["train"] = unrolled.training_split(',
                  "rollout_loss = ", "rollout_loss.set_epoch(", "log(memory.check_step_fits(", "targets = ", "counted = ",
                  "row = train_one_epoch(", "whole = ", 'print(f"whole trajectory',
                  'atomic_write_json(out / "eval.json"', 'atomic_write_json(out / "metrics.json"'],
    },
}
# function -> (the module later steps import it from, the step whose solution taught it)
MOVED = {
    "validate": ("wellfno.ranks", "06_exact_metrics"),
    "synchronize": ("wellfno.device", "08_host_syncs"),
    "spectral_convs_in_float32": ("wellfno.amp", "09_mixed_precision"),
    "checkpoint_blocks": ("wellfno.checkpointing", "12_checkpointing"),
}
# (Taught code a solution keeps in a module beside it: tests/test_taught_modules.py, TAUGHT.)
# Blocks of statements that left the solutions for a package once their step was taught:
# "module.function" -> (the step that taught the block, the solution's function it was in, the
# beginning of its first statement (its first line, or more lines where the first is not unique;
# whitespace aside), how many statements ("body": the body of that statement; a string: up to the
# statement with that first line),
# the first step that calls the package's copy instead). The package function's body is those
# statements (its docstring aside, and a last `return` of what the block made).
MOVED_BLOCKS = {
    "profiling.window.start": ("01_profiling", "main", "prof = trace = None", 2, "02_data_pipeline"),
    "wellfno.options.add_arguments": ("02_data_pipeline", "parse_args", 'p.add_argument("--dataset"',
                                      "args = p.parse_args(argv)", "03_affinity"),
    "wellfno.options.check_arguments": ("02_data_pipeline", "parse_args",
                                        "if args.num_workers < 0", "for name in (", "03_affinity"),
    "profiling.window.finish": ("05_ddp", "train", "if prof:", "body", "08_host_syncs"),
    "affinity.training.bind": ("03_affinity", "main", "cpus = None", 3, "07_failures"),
    "affinity.training.loader_options": ("03_affinity", "main", "if args.pin_memory", 3,
                                         "07_failures"),
    "wellfno.fastwell.open_splits": ("02_data_pipeline", "main", "reader = FastWellDataset", 2,
                                     "07_failures"),
    "wellfno.ranks.open_dataset_rank_0_first": ("05_ddp", "train",
                                                "if env.rank > 0: dist.barrier()", 3,
                                                "07_failures"),
    # solution 13 keeps its own rollout (split across a domain group) before these two statements
    "wellfno.rollout.print_and_plot": ("00_baseline", "main", "for k in range(min(5", 2,
                                       "07_failures"),
    "wellfno.amp.autocast_and_scaler": ("09_mixed_precision", "train", "scaler = ", 3, "10_mfu"),
    "wellfno.options.check_modes": ("10_mfu", "train", "if args.modes > min(grid)", 1,
                                    "12_checkpointing"),
    "profiling.window.nvtx_ranges": ("10_mfu", "train", "nvtx = ", 2, "12_checkpointing"),
    # solution 13 calls it without --domain-size, and domain.evaluate_slab_rollouts with it
    "wellfno.rollout.evaluate_on_dataset": ("00_baseline", "main",
                                            "rollout_data = data.rollout_dataset(", 2,
                                            "12_checkpointing"),
    "wellfno.options.check_run_arguments": ("10_mfu", "parse_args", "if args.nvtx and args.profile", 5,
                                            "14_long_rollouts"),
}
# A moved function that a later step replaces by a package's variant: name -> (that step, what it
# calls instead); the variant's own test below says how it differs from the taught code.
REPLACED = {"validate": ("13_domain_parallel", "domain.validate(")}
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
        if name in REPLACED and list(STEPS).index(step) >= list(STEPS).index(REPLACED[name][0]):
            assert REPLACED[name][1] in source(step), f"{STEPS[step]} does not call {REPLACED[name][1]}"
            continue
        imported = {(n.module, a.name) for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) for a in n.names}
        assert (module, name) in imported, \
            f"{STEPS[step]} neither defines {name} nor imports it from {module}"


def taught_block(step: str, function: str, first_line: str, count) -> list[ast.stmt]:
    src = source(step)
    body = definitions(ast.parse(src))[function].body

    def index(line):
        found = [i for i, s in enumerate(body)
                 if " ".join(ast.get_source_segment(src, s).split()).startswith(" ".join(line.split()))]
        assert len(found) == 1, f"{STEPS[step]}: {function} has {len(found)} statements `{line}`"
        return found[0]

    first = index(first_line)
    if count == "body":
        return body[first].body
    return body[first:index(count) if isinstance(count, str) else first + count]


def passed_arguments(step: str, call: str, function: ast.FunctionDef) -> dict[str, ast.expr]:
    """Parameter name -> the expression `step` passes for it at its first `call` (`module.func`)."""
    calls = [node for node in ast.walk(ast.parse(source(step)))
             if isinstance(node, ast.Call) and ast.unparse(node.func) == call]
    assert calls, f"{STEPS[step]} does not call {call}"
    bound = dict(zip([a.arg for a in function.args.args], calls[0].args))
    bound.update({keyword.arg: keyword.value for keyword in calls[0].keywords})
    return bound


class AsParameters(ast.NodeTransformer):
    """Each expression the caller passes (say `args.profile_wait`) becomes its parameter (`wait`):
    the taught block as the package function, called with those arguments, reads it."""

    def __init__(self, bound: dict[str, ast.expr]):
        self.parameter = {ast.dump(expr): name for name, expr in bound.items()}

    def visit(self, node):
        name = self.parameter.get(ast.dump(node)) if isinstance(node, ast.expr) else None
        if name is not None:
            return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node)
        return self.generic_visit(node)


@pytest.mark.parametrize("name", list(MOVED_BLOCKS))
def test_moved_block_is_the_taught_code(name):
    """A block a solution taught, now a package function: the same statements, reading from its
    parameters what the block read from `args` (the caller passes `args.x` for it; issue 42: a
    helper says what it uses), called from then on."""
    taught_in, function, first_line, count, moved_in = MOVED_BLOCKS[name]
    module, func = name.rsplit(".", 1)
    package_file = Path(importlib.import_module(module).__file__)
    definition = definitions(ast.parse(package_file.read_text()))[func]
    bound = passed_arguments(moved_in, f"{module.rsplit('.', 1)[1]}.{func}", definition)
    taught = [AsParameters(bound).visit(copy.deepcopy(s))
              for s in taught_block(taught_in, function, first_line, count)]
    body = definition.body
    if ast.get_docstring(ast.Module(body=body, type_ignores=[])) is not None:
        body = body[1:]
    extra = body[len(taught):]
    assert len(extra) <= 1 and all(isinstance(s, ast.Return) for s in extra), \
        f"{name} does more than {STEPS[taught_in]}'s block"
    assert [ast.dump(s) for s in body[:len(taught)]] == [ast.dump(s) for s in taught], \
        f"{name} is not the block `{first_line}` of {STEPS[taught_in]}'s {function}"
    call = f"{module.rsplit('.', 1)[1]}.{func}("
    for step in list(STEPS)[list(STEPS).index(moved_in):]:
        assert call in source(step), f"{STEPS[step]} neither holds the block nor calls {call}"


def test_domain_validate_is_ranks_validate_with_the_loss_as_an_argument():
    """Solution 13's loss-taking validate lives in wellfno.domain: step 06's, but for the loss."""
    import wellfno.domain
    import wellfno.ranks

    def stripped(module, loss_is_argument):
        node = definitions(ast.parse(Path(module.__file__).read_text()))["validate"]
        node.body = node.body[1:] if ast.get_docstring(node) else node.body
        if loss_is_argument:
            assert node.args.args[-1].arg == "loss_fn"
            node.args.args.pop()
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "loss_fn":
                    call.func = ast.Attribute(value=ast.Name(id="model", ctx=ast.Load()),
                                              attr="loss", ctx=ast.Load())
        return ast.dump(node)

    assert stripped(wellfno.domain, True) == stripped(wellfno.ranks, False)


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
    good = source("06_exact_metrics")
    bad = good.replace("sort_by = traces.key_averages_sort_key(device)",
                       'sort_by = "self_device_time_total" if device.type == "cuda" else '
                       '"self_cpu_time_total"')
    bad = bad.replace("log(memory.check_step_fits(", "print(memory.check_step_fits(")
    assert bad.count("print(memory.check_step_fits(") == 1 and "self_device_time_total" in bad
    problems = drift(source("05_ddp"), bad, CHANGES["06_exact_metrics"])
    assert len(problems) == 2, problems
    assert any("sort_by" in p for p in problems) and any("check_step_fits" in p for p in problems), problems


# --------------------------------------------------------------------------- the size of a lesson
# Issue 20: a step's lesson is its diff against the step before, read side by side on a laptop.
# One screen: the lesson's changed lines, `diff START SOLUTION | grep -c '^[<>]'` (pytorch/examples'
# DDP series: 12-59; ours are the profiler, DDP, exact metrics and domain parallelism at 75-80).
DIFF_BUDGET = 80
LENGTH_LIMIT = 390  # lines of a solution (DESIGN.md: why not 350 since issue 42)
# The idea each solution's docstring names in its first line (what --help prints).
IDEAS = {
    "01_profiling": "torch.profiler", "02_data_pipeline": "input pipeline",
    "03_affinity": "pinned near the rank's GPU", "05_ddp": "DistributedDataParallel",
    "06_exact_metrics": "metrics exact",
    "07_failures": "failures that end every rank", "08_host_syncs": "no host sync",
    "09_mixed_precision": "mixed precision", "10_mfu": "MFU", "11_compile": "torch.compile",
    "12_checkpointing": "activation checkpointing", "13_domain_parallel": "domain parallelism",
    "14_long_rollouts": "long rollouts",
}


def changed_lines(before: Path, after: Path) -> int:
    """`diff before after | grep -c '^[<>]'`, with GNU diff where there is one."""
    diff = shutil.which("diff")
    if diff:
        out = subprocess.run([diff, str(before), str(after)], capture_output=True, text=True).stdout
        return sum(1 for line in out.splitlines() if line[:1] in "<>")
    a, b = before.read_text().splitlines(), after.read_text().splitlines()
    return sum(1 for line in difflib.ndiff(a, b) if line[:2] in ("- ", "+ "))


@pytest.mark.parametrize("step", [s for s in STEPS if s != "00_baseline"])
def test_each_lesson_fits_on_a_screen(step):
    """The lesson is `diff START SOLUTION` (START: the exercise's starting script, else the previous
    solution); tests/test_lesson_diffs.py checks that its lines are the idea's."""
    start = starting_script(step)
    changed = changed_lines(start, REPO / STEPS[step])
    assert changed <= DIFF_BUDGET, (
        f"diff {start.relative_to(REPO)} {STEPS[step]} changes {changed} lines, more than "
        f"{DIFF_BUDGET}: a lesson a participant reads on one screen")


@pytest.mark.parametrize("step", [s for s in STEPS if s != "00_baseline"])
def test_each_solution_within_the_length_limit(step):
    lines = len(source(step).splitlines())
    assert lines <= LENGTH_LIMIT, (
        f"{STEPS[step]} has {lines} lines, more than {LENGTH_LIMIT}: move a block an earlier step "
        "taught into a package (MOVED_BLOCKS) where the pair's diff has room")


@pytest.mark.parametrize("step", [s for s in STEPS if s != "00_baseline"])
def test_docstring_first_line_names_the_step_and_its_idea(step):
    first = (ast.get_docstring(ast.parse(source(step))) or "\n").splitlines()[0]
    before = list(STEPS)[list(STEPS).index(step) - 1]
    number = step.split("_")[0]
    previous = "fno.py" if before == "00_baseline" else f"solution {before.split('_')[0]}"
    assert first.startswith(f"Solution {number}: {previous} "), first
    assert IDEAS[step] in first, f"{STEPS[step]}'s first line does not name its idea: {first}"
