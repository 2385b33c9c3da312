"""A module a step's solution folder teaches is the package's copy, which later steps import.

The code an exercise asks participants to write stands in that step's solution folder, where they
look for it (issue 42); the later steps import the same code from a package. TAUGHT lists each such
module with its package copy: every function and constant the taught module defines must have the
same syntax tree as the package's of the same name (docstrings aside, comments are not in the
tree: the teaching copy may explain more), the step's solution imports it from beside itself, and
each later solution calls the package's instead (no second copy to drift).
"""
from __future__ import annotations

import ast
import copy
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO, STEPS, steps_from

# taught module -> (the package module holding the copy, the step that teaches it, the line its
# solution imports it with, {later step: the call it uses instead})
TAUGHT = {
    "solutions/03_affinity/binding.py": (
        "affinity.bind", "03_affinity", "from binding import bind_this_rank, worker_init_fn",
        {"05_ddp": "bind_this_rank(", "06_exact_metrics": "bind_this_rank(",
         # step 03's whole set-up, the binding's call included (affinity.training.bind)
         **{step: "training.bind(" for step in (
             "07_failures", "08_host_syncs", "09_mixed_precision", "10_mfu", "11_compile",
             "12_checkpointing", "13_domain_parallel", "14_long_rollouts")}}),
    "solutions/10_mfu/flop_count.py": (
        "wellfno.flops", "10_mfu", "from flop_count import training_flops_per_sample",
        {"11_compile": "flops.training_flops_per_sample(",
         "12_checkpointing": "flops.training_flops_per_sample(",
         "13_domain_parallel": "flops.training_flops_per_sample(",
         # a K-step rollout's count, built on wellfno.flops.count_flops
         "14_long_rollouts": "unrolled.training_flops_per_sample("}),
    "solutions/13_domain_parallel/domain_conv.py": (
        "wellfno.domain", "13_domain_parallel", "import domain_conv",
        {"14_long_rollouts": "domain.split_model("}),
}


def _without_docstrings(node: ast.AST) -> ast.AST:
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (isinstance(inner, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            inner.body = body[1:] or [ast.Pass()]
    return node


def definitions(src: str) -> dict[str, str]:
    """name -> ast.dump of each top-level function, class and `NAME = ...`, docstrings aside."""
    found = {}
    for node in ast.parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = ast.dump(_without_docstrings(node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = ast.dump(_without_docstrings(node))
    return found


def differences(taught_src: str, package_src: str) -> list[str]:
    """The taught module's definitions that the package lacks or defines otherwise."""
    taught, package = definitions(taught_src), definitions(package_src)
    return [f"{name} is not in the package" if name not in package else f"{name} differs"
            for name, dump in taught.items() if package.get(name) != dump]


def package_source(module: str) -> str:
    return Path(importlib.import_module(module).__file__).read_text()


@pytest.mark.parametrize("path", list(TAUGHT))
def test_taught_module_is_the_package_copy(path):
    module = TAUGHT[path][0]
    taught = (REPO / path).read_text()
    assert definitions(taught), f"{path} defines nothing"
    problems = differences(taught, package_source(module))
    assert not problems, f"{path} against {module}: " + "; ".join(problems) + \
        " (change both, the same way)"


@pytest.mark.parametrize("path", list(TAUGHT))
def test_its_step_imports_it_and_later_steps_use_the_package(path):
    module, step, line, later = TAUGHT[path]
    taught_name = Path(path).stem
    assert Path(path).parent.as_posix() == Path(STEPS[step]).parent.as_posix()
    assert line in (REPO / STEPS[step]).read_text(), f"{STEPS[step]} does not say `{line}`"
    assert set(later) == set(steps_from(step)[1:]), "list every later step's call in TAUGHT"
    for name, call in later.items():
        src = (REPO / STEPS[name]).read_text()
        assert f"from {taught_name} import" not in src and f"import {taught_name}" not in src, \
            f"{STEPS[name]} imports {taught_name}, which stands only beside {STEPS[step]}"
        assert call in src, f"{STEPS[name]} does not call {call} (the package's copy)"


def test_a_changed_copy_is_detected_and_a_reworded_docstring_is_not():
    taught = (REPO / "solutions/10_mfu/flop_count.py").read_text()
    package = package_source("wellfno.flops")
    assert "per = 5 * points * math.log2(points)" in taught
    changed = taught.replace("per = 5 * points * math.log2(points)",
                             "per = 6 * points * math.log2(points)")
    assert differences(changed, package) == ["fft_flops differs"]
    renamed = taught.replace("def count_flops(", "def count_all_flops(")
    assert differences(renamed, package) == ["count_all_flops is not in the package"]
    constant = taught.replace("FFT_OPS = {aten._fft_r2c, aten._fft_c2r, aten._fft_c2c}",
                              "FFT_OPS = {aten._fft_r2c, aten._fft_c2r}")
    assert differences(constant, package) == ["FFT_OPS differs"]
    reworded = taught.replace('"""5 N log2 N per complex transform',
                              '"""Five N log2 N per transform')
    assert reworded != taught and differences(reworded, package) == []
