"""The other packages' modules the day-0 check's programs import, found in their code.

    python -m coursetools.imports        # the list, one module a line, and where each comes from

The programs: what tests/device/day0.sh runs (its `-m MODULE` and `path.py` words), the scripts
and modules those start (a string in their code that names a script of the repository, or a
module of ours after "-m": the ladder's rows, step 06's runs, torchrun's wellfno.complex_ddp_check),
and where one runs pytest, the test files it collects (their module-level imports: collection).
Their imports are followed through our own modules, transitively (an AST walk, imports inside
functions too, as coursetools.staleness follows them). Left out: the standard library
(sys.stdlib_module_names), torch (the machine's own: wellfno.toolchain reports it), and an
import inside a `try` whose handler catches ImportError (the program runs without it: hta in
profiling.summarize, psutil in wellfno.memory, scipy.stats in a test).

`coursetools.day0 site` imports each of these on the machine, so that a package the machine
lacks is one line there, before any step runs into it (issue 48).
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

from wellfno.cli import run_main

REPO = Path(__file__).resolve().parents[1]
DAY0_SCRIPT = REPO / "tests" / "device" / "day0.sh"
# the machine's own, never unpacked: wellfno.toolchain's question (its version, its build)
LEFT_TO_THE_MACHINE = ("torch",)
# what catches a failed import: the import is optional where its handler catches one of these
CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _handles_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(k, ast.Name) and k.id in CATCHES_IMPORT_ERROR
                                       for k in kinds):
            return True
    return False


def _statements(tree: ast.AST, module_level: bool):
    """(import statement, optional?) of `tree`; with module_level, those a module runs when it
    is imported (not inside a function or class body)."""
    todo = [(tree, False)]
    while todo:
        node, optional = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, optional
            continue
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                              ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Try):  # the body optional if a handler catches ImportError
            body_optional = optional or _handles_import_error(node)
            todo += [(child, body_optional) for child in node.body]
            todo += [(child, optional) for child in (*node.handlers, *node.orelse,
                                                      *node.finalbody)]
            continue
        todo += [(child, optional) for child in ast.iter_child_nodes(node)]


def module_path(name: str, root: Path, beside: Path | None = None) -> Path | None:
    """The repository's file of module `name` (ours), or None: a package's __init__.py, a module
    file from the root, or a script's own module next to it (`beside`, its folder: sys.path[0])."""
    bases = [root / Path(*name.split("."))]
    if beside is not None and "." not in name:
        bases.insert(0, beside / name)
    for base in bases:
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file() and ".venv" not in candidate.relative_to(root).parts:
                return candidate
    return None


def _is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


def scan(path: Path, root: Path, module_level: bool = False):
    """(our files it imports, other packages' modules it imports, scripts and modules it starts)
    of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    ours, theirs, starts = set(), set(), set()
    for node, optional in _statements(tree, module_level):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.level:  # relative: ours, from the importing file's package
            package = path.parent
            for _ in range(node.level - 1):
                package = package.parent
            base = ".".join(package.relative_to(root).parts)
            module = f"{base}.{node.module}" if node.module else base
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            found = [module_path(".".join(parts[:i]), root, path.parent)
                     for i in range(1, len(parts) + 1)]  # a.b.c runs a/__init__, a/b/__init__
            if any(found):
                ours.update(f for f in found if f)
            elif name == (node.module if isinstance(node, ast.ImportFrom) else name) \
                    and not optional and not _is_stdlib(name) \
                    and name.split(".")[0] not in LEFT_TO_THE_MACHINE and name != "__future__":
                theirs.add(name)  # `from x import y`: x (y may be a name, not a module)
    if not module_level:  # a test file's collection starts nothing
        starts |= started(tree, root)
    return ours, theirs, starts


def started(tree: ast.AST, root: Path) -> set[Path]:
    """The programs a file's code starts: strings naming a script of the repository
    ("solutions/11_compile/fno.py"), and a module of ours after "-m" in a list or tuple."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"[\w./-]+\.py", node.value):
            path = root / node.value
            if path.is_file() and ".venv" not in path.parts:
                out.add(path)
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for before, word in zip(words, words[1:]):
                if before == "-m" and isinstance(word, str):
                    out |= _program(word, root)
    return out


def _program(module: str, root: Path) -> set[Path]:
    """The files `python -m MODULE` runs first: ours, or pytest's test files."""
    if module == "pytest":
        tests = root / "tests"
        return {*tests.rglob("test_*.py"), *tests.rglob("conftest.py")}
    found = module_path(module, root)
    return {found} if found else set()


def day0_programs(root: Path = REPO, script: Path = DAY0_SCRIPT) -> set[Path]:
    """What tests/device/day0.sh runs: its `-m MODULE` and `path.py` words."""
    text = script.read_text()
    out = set()
    for module in re.findall(r"\s-m\s+([\w.]+)", text):
        out |= _program(module, root)
    for word in re.findall(r"(?<![\w/.])([\w/]+\.py)\b", text):
        if (root / word).is_file():
            out.add(root / word)
    return out


def needed(root: Path = REPO, programs: set[Path] | None = None) -> dict[str, str]:
    """{module of another package: the repository file that imports it (the first found)}.

    A program, and what it imports, is read whole (an import inside a function runs when the
    program calls it); pytest's collection runs a test file's module-level statements only, and
    so only those of what it imports, and starts nothing."""
    programs = day0_programs(root) if programs is None else programs
    tests = root / "tests"
    todo = [(p, p.is_relative_to(tests)) for p in sorted(programs)]
    seen, theirs = set(), {}
    while todo:
        path, collected = todo.pop()
        if (path, collected) in seen or (path, False) in seen:
            continue
        seen.add((path, collected))
        ours, imported, starts = scan(path, root, module_level=collected)
        for name in sorted(imported):
            theirs.setdefault(name, path.relative_to(root).as_posix())
        todo += [(p, collected) for p in ours] + [(p, p.is_relative_to(tests)) for p in starts]
    return dict(sorted(theirs.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    for name, where in needed().items():
        print(f"{name}  ({where})")
    return 0


if __name__ == "__main__":
    run_main(main)
