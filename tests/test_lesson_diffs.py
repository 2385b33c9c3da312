"""Each step's diff is its idea and only its idea (issue 42).

A participant reads a step as `diff START SOLUTION`. START is the exercise's starting script,
`exercises/NN_name/start.py`, where the step's solution calls from packages code an earlier step
taught (the previous solution with those blocks already folded, so the fold is not in the lesson);
elsewhere START is the previous step's solution. Three checks:

- every changed line of START -> SOLUTION belongs to the step's idea: the statement it is in (or a
  statement around it, or a function of the idea's name) mentions one of IDEA_NAMES[step], the
  names the idea introduces or rewrites; blank lines, comments and the module docstring aside. At
  most HANDFUL lines may fall outside (a plain `try:` that a new statement needs, say);
- a starting script is the previous solution with the folds and nothing else: every statement it
  changes is a call of a package function that tests/test_drift.py's MOVED_BLOCKS moves at this
  step, or a function MOVED takes out at this step, or an import;
- a step whose solution folds earlier code has a starting script, and only such a step: the lesson
  never mixes an idea with a move.
"""
from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, STEPS, starting_script
from tests.test_cross_steps import options_of
from tests.test_drift import MOVED, MOVED_BLOCKS, definitions, drift
from tests.test_taught_modules import TAUGHT

HANDFUL = 3
# The names each step's idea brings in or rewrites (regular expressions; an option's dashes match
# underscores, so "log_every" covers --log-every).
IDEA_NAMES = {
    "01_profiling": ["profil", "record_function", r"\bprof\b", "schedule", "trace", "summarize",
                     "timeline", "launch_environment", "max_steps", "with_stack"],
    "02_data_pipeline": ["num_workers", "prefetch", "persistent", "pin_memory", "fast_reader",
                         "FastWellDataset", "reader", "non_blocking", "loader_options"],
    "03_affinity": ["bind", "affinity", "report", "worker_init_fn", "cpus"],
    "05_ddp": [r"dist\.", "DistributedDataParallel", "ddp_model", r"\benv\b", "rank", "world_size",
               "backend", "sampler", "global_batch", r"\blog\(", "show", "module",
               "check_gpu_not_shared", "launch_environment", r"torch\.distributed"],
    "06_exact_metrics": ["eval_only", "over_ranks", "left_out", "validate", "all_reduce",
                         "drop_last", "world_size", "sampler", "valid_loss", "total"],
    "07_failures": ["timeout", "Watchdog", "watchdog", "datetime", "init_process_group",
                    "cannot join"],
    "08_host_syncs": ["log_every", "loss_log", "loss_sum", "synchronize", "total_loss",
                      r"\.item\(\)", "detach"],
    "09_mixed_precision": ["amp", "autocast", "scaler", "GradScaler", "float32", "peak_memory",
                           "contextlib"],
    "10_mfu": ["flops", "FLOP", "counted", "flop_count", "nvtx", "layers", "modes", "grid", "efficiency",
               "utilization", "peak_memory", "example", "contextlib"],
    "11_compile": ["compile", "_orig_mod", r"\bfno = ", r"fno\.loss", "untimed", "drop_last",
                   "train_model", "excludes"],
    "12_checkpointing": ["checkpoint"],
    "13_domain_parallel": ["domain", "slab", "layout", "group", "loss_fn", "DomainSpectralConv"],
    "14_long_rollouts": ["rollout", "unrolled", "pushforward", "input_noise", "noise", "whole",
                         "targets", "loss_fn", "_orig_mod", "DistributedDataParallel"],
}
LESSONS = [s for s in STEPS if s != "00_baseline"]


def previous(step: str) -> str:
    return list(STEPS)[list(STEPS).index(step) - 1]


def starter_path(step: str) -> Path:
    return REPO / "exercises" / step / "start.py"


# --------------------------------------------------------------------------- lines of the idea
def _statements_around(src: str) -> dict[int, list[tuple[str, ast.stmt, int, int]]]:
    """line -> the statements around it, outermost first: (header text, node, first, last line).
    A compound statement's header is its lines before its first body; a simple one is all of it."""
    lines, around = src.splitlines(), {}

    def visit(node, chain):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt):
                visit(child, chain)
                continue
            first = min([child.lineno] + [d.lineno for d in getattr(child, "decorator_list", [])])
            bodies = [b for b in (getattr(child, f, None) for f in ("body", "orelse", "finalbody",
                                                                     "handlers"))
                      if isinstance(b, list) and b]
            header_end = min(b[0].lineno for b in bodies) - 1 if bodies else child.end_lineno
            link = ("\n".join(lines[first - 1:header_end]), child, first, child.end_lineno)
            for n in range(first, child.end_lineno + 1):
                around[n] = chain + [link]
            visit(child, chain + [link])

    visit(ast.parse(src), [])
    return around


def lines_outside_the_idea(before: str, after: str, names: list[str]) -> list[str]:
    """The changed lines of `diff before after` that do not belong to the idea `names` describe."""
    pattern = re.compile("|".join(names))

    def matches(text):
        return bool(pattern.search(text) or pattern.search(text.replace("-", "_")))

    sources = {"<": before.splitlines(), ">": after.splitlines()}
    around = {"<": _statements_around(before), ">": _statements_around(after)}
    docstring = {}
    for side, src in (("<", before), (">", after)):
        head = ast.parse(src).body[0]
        docstring[side] = (range(head.lineno, head.end_lineno + 1)
                           if isinstance(head, ast.Expr) else range(0))
    hunks = [(tag, [("<", i + 1) for i in range(i1, i2)], [(">", j + 1) for j in range(j1, j2)])
             for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
                 a=sources["<"], b=sources[">"], autojunk=False).get_opcodes() if tag != "equal"]
    changed = {line for _, left, right in hunks for line in left + right}

    def neutral(side, n):
        text = sources[side][n - 1].strip()
        return not text or text.startswith("#") or n in docstring[side]

    def of_the_idea(side, n):
        if neutral(side, n):
            return True
        chain = around[side].get(n, [])
        if not chain:
            return matches(sources[side][n - 1])
        for i, (header, node, first, last) in enumerate(chain):
            inner = i == len(chain) - 1
            wholly_changed = all((side, k) in changed for k in range(first, last + 1))
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not inner \
                    and not wholly_changed:
                if matches(node.name):  # a function of the idea's (06's validate): all of it
                    return True
                continue  # train(): the statement inside it decides
            if matches(header):
                return True
            if inner and wholly_changed and matches("\n".join(sources[side][first - 1:last])):
                return True  # a new `try:` or `for` around the idea's statements
        return False

    outside = []
    for tag, left, right in hunks:
        idea = {line: of_the_idea(*line) for line in left + right}
        code = [line for line in left + right if not neutral(*line)]
        if tag == "replace" and (any(idea[x] for x in code if x[0] == "<")
                                 != any(idea[x] for x in code if x[0] == ">")):
            idea = dict.fromkeys(idea, True)  # one side rewrites an idea's statement: both are
        outside += [f"{side} {n}: {sources[side][n - 1].strip()}"
                    for (side, n), of_idea in idea.items() if not of_idea]
    return outside


@pytest.mark.parametrize("step", LESSONS)
def test_each_lesson_diff_is_its_idea(step):
    start = starting_script(step)
    outside = lines_outside_the_idea(start.read_text(), (REPO / STEPS[step]).read_text(),
                                     IDEA_NAMES[step])
    assert len(outside) <= HANDFUL, (
        f"diff {start.relative_to(REPO)} {STEPS[step]}: {len(outside)} changed lines outside the "
        f"step's idea (at most {HANDFUL}): move them to a commit of their own (a fold into a "
        f"package belongs in exercises/{step}/start.py), or name the idea in IDEA_NAMES:\n  "
        + "\n  ".join(outside))


def test_the_count_finds_a_fold_and_an_unrelated_edit():
    """Without its starting script, step 12's diff shows the folds of step 10 and the rollout; an
    unrelated rename in an otherwise untouched solution shows as lines outside the idea."""
    before, after = (REPO / STEPS["11_compile"]).read_text(), (REPO / STEPS["12_checkpointing"]).read_text()
    assert len(lines_outside_the_idea(before, after, IDEA_NAMES["12_checkpointing"])) > 10
    renamed = after.replace("history", "epochs_so_far")
    assert after.count("history") >= 4
    outside = lines_outside_the_idea(after, renamed, IDEA_NAMES["12_checkpointing"])
    assert len(outside) >= after.count("history") // 2 > HANDFUL, outside
    assert not lines_outside_the_idea(after, after, IDEA_NAMES["12_checkpointing"])


# --------------------------------------------------------------------------- the starting scripts
def folds_at(step: str) -> tuple[list[str], list[str]]:
    """The package calls MOVED_BLOCKS starts at `step`, and the functions MOVED takes out there."""
    calls = [f"{name.rsplit('.', 2)[-2]}.{name.rsplit('.', 1)[1]}("
             for name, (*_, moved_in) in MOVED_BLOCKS.items() if moved_in == step]
    # a module beside a solution (tests/test_taught_modules.py): the next step calls the package's
    calls += [later[step] for _, taught_in, _, later in TAUGHT.values()
              if step in later and list(STEPS).index(step) == list(STEPS).index(taught_in) + 1]
    prev = definitions(ast.parse((REPO / STEPS[previous(step)]).read_text()))
    now = definitions(ast.parse((REPO / STEPS[step]).read_text()))
    functions = [name for name in MOVED if name in prev and name not in now]
    return calls, functions


@pytest.mark.parametrize("step", LESSONS)
def test_a_step_that_folds_code_has_a_starting_script(step):
    calls, functions = folds_at(step)
    if calls or functions:
        assert starter_path(step).is_file(), (
            f"solution {step[:2]} folds {', '.join(calls + functions)} into packages: write "
            f"exercises/{step}/start.py, solution {previous(step)[:2]} with that fold alone")
    else:
        assert not starter_path(step).is_file(), (
            f"exercises/{step}/start.py: solution {step[:2]} folds nothing, so its exercise starts "
            f"from {STEPS[previous(step)]}")


STARTERS = [s for s in LESSONS if starter_path(s).is_file()]


@pytest.mark.parametrize("step", STARTERS)
def test_a_starting_script_is_the_previous_solution_with_its_folds_only(step):
    calls, functions = folds_at(step)
    prev_src, start_src = (REPO / STEPS[previous(step)]).read_text(), starter_path(step).read_text()
    starter = definitions(ast.parse(start_src))
    # every statement the starter changes must be one of the fold's calls
    allowed = {}
    for name, node in starter.items():
        segment = ast.get_source_segment(start_src, node)
        allowed[name] = [line.split("  #")[0].strip() for line in segment.splitlines()
                         if any(call in line for call in calls)]
    problems = drift(prev_src, start_src, allowed)
    assert not problems, f"exercises/{step}/start.py against {STEPS[previous(step)]}: {problems}"
    for name in functions:
        assert name not in starter, f"exercises/{step}/start.py still defines {name}"
    for call in calls:
        assert call in start_src, f"exercises/{step}/start.py does not call {call}"
    # the module level: imports and the docstring only
    top = lambda src: [ast.dump(n) for n in ast.parse(src).body  # noqa: E731
                       if not isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                             ast.ClassDef, ast.Expr))]
    assert top(prev_src) == top(start_src)


@pytest.mark.parametrize("step", STARTERS)
def test_a_starting_script_has_the_previous_solutions_options(step, capsys):
    assert options_of(starter_path(step), capsys) == options_of(REPO / STEPS[previous(step)], capsys)


def test_each_exercise_readme_names_its_starting_script():
    for step in STARTERS:
        readme = (REPO / "exercises" / step / "README.md").read_text()
        assert f"exercises/{step}/start.py" in readme, f"exercises/{step}/README.md"
