"""DESIGN.md's rules on imports, checked on every module of our installed packages.

1. No two modules import each other, directly or round a circle (function-level imports count too).
2. Layers: a package imports only itself and the packages of the layers below it (no exceptions);
   nothing imports a script.
"""
import ast
from pathlib import Path

from tests.conftest import REPO

# DESIGN.md's layers, bottom first. Packages in one layer do not import each other.
LAYERS = (
    ("wellfno",),                  # the shared code participants read
    ("benchtools",),               # a results file and its machine: every benchmark writes one
    ("profiling", "affinity"),     # exercises 01-03's tools
    ("coursetools",),              # docs' tables, make results, day-0 check, the Well's metadata
)
PACKAGES = tuple(package for layer in LAYERS for package in layer)


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


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if module.split(".")[0] in layer)


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a package imports another of its own layer or one above."""
    return sorted((importer, imported)
                  for importer, targets in graph.items() for imported in targets
                  if imported.split(".")[0] != importer.split(".")[0]
                  and layer_of(imported) >= layer_of(importer))


def test_the_layer_rule_finds_an_upward_import():
    graph = {"wellfno.data": {"coursetools.wellmeta", "wellfno.cli"}, "wellfno.cli": set()}
    assert wrong_way(graph) == [("wellfno.data", "coursetools.wellmeta")]
    assert wrong_way({"profiling.throughput": {"affinity.bind"}}) == [
        ("profiling.throughput", "affinity.bind")]
    assert wrong_way({"coursetools.results": {"profiling.traces", "benchtools.resultfiles"}}) == []


def test_every_package_is_in_a_layer_and_installed():
    on_disk = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(PACKAGES), "a package that is not in LAYERS (add it, and to DESIGN.md)"
    text = (REPO / "pyproject.toml").read_text()
    assert all(f'"{package}"' in text for package in PACKAGES), "pyproject.toml's packages"


def test_each_layer_imports_only_the_layers_below():
    graph = import_graph()
    assert graph["coursetools.results"] and graph["profiling.throughput"], "the graph was not read"
    assert wrong_way(graph) == [], ("a package imports its own layer or one above (DESIGN.md: "
                                    "Layers): move the shared code down, or the importer up")
