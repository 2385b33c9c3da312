"""DESIGN.md's rules on imports, checked on every module of wellfno/, profiling/ and affinity/.

1. No two modules import each other, directly or round a circle (function-level imports count too).
2. Layers: wellfno (bottom) imports neither profiling nor affinity; nothing imports a script.
"""
import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("wellfno", "profiling", "affinity")
# (importer, imported): why the exception stands. Keep this empty if you can.
# Two tools that live in wellfno borrow from the tool layer: the day-0 check reports each task's placement
# and GPU PCI address with affinity's code, and `results runtimes` reads step 01's trace with profiling's.
# To remove these, move gpucheck and the runtimes command up into a tool package.
LAYER_EXCEPTIONS = {
    ("wellfno.gpucheck", "affinity.report"): "placement line of each task",
    ("wellfno.gpucheck", "affinity.bind"): "visible_gpu_pci",
    ("wellfno.results", "profiling.summarize"): "runtimes: step 01's parts",
    ("wellfno.results", "profiling.traces"): "runtimes: step 01's trace",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO / package).glob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Our modules that `path` imports anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    graph = import_graph()
    assert len(graph) > 20 and graph["wellfno.data"], "the import graph was not read"
    assert cycles(graph) == [], "modules that import each other (DESIGN.md: Layers)"


def test_wellfno_imports_no_tool_package():
    wrong = sorted((importer, imported) for importer, targets in import_graph().items() if importer.startswith("wellfno")
                   for imported in targets if imported.split(".")[0] in ("profiling", "affinity")
                   and (importer, imported) not in LAYER_EXCEPTIONS)
    assert wrong == [], "wellfno is the bottom layer: move the shared code down, or the importer up"
