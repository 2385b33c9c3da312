"""Which results files are stale: the code their numbers came from has changed since.

    python -m coursetools.staleness                      # every results file make results writes,
                                                         # and those measured elsewhere (a GPU's)
    python -m coursetools.staleness 14_long_rollouts     # only these targets (coursetools.measure)

Each results file records the commit it was measured on (benchtools.resultfiles.code_stamp). A
target's code is every repository file its commands run: the scripts and `-m` modules named in
its command lines, the ones its tools start themselves (`Target.runs`), `wellfno.grayscott` where
it uses the generated data (`make results` makes it first), and every module of ours those import,
transitively (an AST walk of `import` statements, inside functions too, of our five packages,
and of a script's own modules beside it: solution 13 imports its domain_conv.py). A file is stale
when one of those files differs from the recorded commit in its code, in today's tree (committed
or not), or is new since; or was uncommitted when it was measured; or when the file records no
commit, or one this history lacks.

What counts as a change: the file's syntax tree with its docstrings taken out (`normalized`), so a
comment or a docstring does not force an hour of re-measuring, and any change of code does (even
one that cannot move a number: which can is not decidable here, and a re-measure is the safe side).
Without git, or in a shallow clone, the history cannot be read: `history_unavailable` says why.
"""
from __future__ import annotations

import argparse
import ast
import re
import shlex
import subprocess
from pathlib import Path

from coursetools.measure import ELSEWHERE, TARGETS, Target, pick
from benchtools.resultfiles import read_result
from wellfno.cli import UserError, run_main

PACKAGES = ("wellfno", "profiling", "affinity", "benchtools", "coursetools")
DATA_GENERATOR = "wellfno/grayscott.py"   # `make results` generates {data} with it first


def git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None


def history_unavailable(root: Path) -> str | None:
    """Why this checkout's history cannot say what changed since a commit, or None when it can."""
    inside = git(root, "rev-parse", "--is-inside-work-tree")
    if inside is None:
        return "git is not installed"
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return f"{root.name} is not a git checkout"
    shallow = git(root, "rev-parse", "--is-shallow-repository")
    if shallow is None or shallow.returncode != 0 or shallow.stdout.strip() != "false":
        return ("a shallow clone lacks the commits results files were measured on "
                "(git fetch --unshallow)")
    return None


# --------------------------------------------------------------------------- what a target runs
def module_file(name: str, root: Path) -> str | None:
    """Our module's file, repository-relative, or None (not ours, or no such module)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if (root / candidate).is_file():
            return candidate.as_posix()
    return None


def scripts_of(command: str, root: Path) -> set[str]:
    """The repository's files a command line runs: its .py words that are files here, and the
    modules of ours after -m (a quoted word is split too: compare_scripts takes whole scripts'
    command lines as words)."""
    line = re.sub(r"\{(\w+)\}", lambda m: "python" if m.group(1) == "py" else m.group(1),
                  command)
    found, words = set(), shlex.split(line)
    for word in list(words):
        if " " in word:
            words += shlex.split(word)
    for before, word in zip(["", *words], words):
        if before == "-m":
            module = module_file(word, root)
            if module:
                found.add(module)
        elif word.endswith(".py") and (root / word).is_file():
            found.add(Path(word).as_posix())
    return found


def imports_of(path: str, root: Path) -> set[str]:
    """Our modules `path` imports anywhere in it, and the packages' __init__ they run."""
    tree = ast.parse((root / path).read_text(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the importing file's package
                package = Path(path).parent.parts[:len(Path(path).parent.parts) - node.level + 1]
                module = ".".join([*package, *([module] if module else [])])
            names.add(module)
            # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg
            names.update(f"{module}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        beside = Path(path).parent / f"{name}.py"  # a script's own module next to it (sys.path[0])
        if "." not in name and name not in PACKAGES and (root / beside).is_file():
            found.add(beside.as_posix())
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
            module = module_file(".".join(parts[:i]), root)
            if module:
                found.add(module)
    return found


def dependencies(target: Target, root: Path) -> list[str]:
    """Every repository file whose code `target`'s numbers came from (module docstring)."""
    pending = set()
    for command in (*target.commands, *target.runs):
        pending |= scripts_of(command, root)
        if "{data}" in command:
            pending.add(DATA_GENERATOR)
    seen: set[str] = set()
    while pending:
        path = pending.pop()
        if path not in seen:
            seen.add(path)
            pending |= imports_of(path, root) - seen
    return sorted(seen)


# --------------------------------------------------------------------------- what changed since
def normalized(source: str) -> str:
    """The code of a Python file without its comments and docstrings (the syntax tree's dump);
    a file that does not parse, as it is."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def changed_since(commit: str, files: list[str], root: Path) -> list[str]:
    """Which of `files` differ in code between `commit` and today's tree (committed or not), or
    are new since; each with why."""
    listed = git(root, "ls-tree", "-r", "--name-only", commit, "--", *files)
    differ = git(root, "diff", "--name-only", commit, "--", *files)
    for done in (listed, differ):
        if done is None or done.returncode:
            raise UserError(f"git could not compare {commit[:7]} with today's files: "
                            f"{done.stderr.strip() if done else 'git is not installed'}")
    then, textually = set(listed.stdout.split("\n")), set(differ.stdout.split("\n"))
    changed = []
    for path in files:
        if path not in then:
            changed.append(f"{path} (new since)")
        elif path in textually:
            old = git(root, "show", f"{commit}:{path}")
            if old is None or old.returncode or \
                    normalized(old.stdout) != normalized((root / path).read_text()):
                changed.append(path)
    return changed


def stale_reasons(target: Target, root: Path) -> list[str]:
    """Why `target`'s results file no longer shows today's code (empty: it does)."""
    result = read_result(root / target.file)
    commit = result.get("commit")
    if not commit:
        return [result.get("commit_note") or "it records no commit (measured before results files "
                                              "were stamped)"]
    known = git(root, "cat-file", "-e", f"{commit}^{{commit}}")
    if known is None or known.returncode:
        return [f"its commit {commit[:7]} is not in this checkout's history (a rebased or "
                "unpushed commit)"]
    files = dependencies(target, root)
    reasons = []
    dirty = sorted(set(result.get("uncommitted") or ()) & set(files))
    if dirty:
        reasons.append(f"it was measured with uncommitted changes to {', '.join(dirty)}")
    changed = changed_since(commit, files, root)
    if changed:
        reasons.append(f"since {commit[:7]} the code of {', '.join(changed)} changed")
    return reasons


def stale_files(root: Path, targets=(*TARGETS, *ELSEWHERE)) -> list[str]:
    """One line for each results file that is stale: which, why, and the command to re-measure
    it. A target whose file is not there yet is not checked (nothing quotes it)."""
    lines = []
    for target in targets:
        if (root / target.file).is_file():
            reasons = stale_reasons(target, root)
            if reasons:
                how = target.measured_by or f"`make results ONLY={target.name}`"
                lines.append(f"{target.file} is stale: {'; '.join(reasons)}: re-measure it with "
                             f"{how}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="results targets to check (default: all)")
    p.add_argument("--root", default=".", help="repository root (default: here)")
    p.add_argument("--list", action="store_true", help="also list each target's files")
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    targets = pick(args.names, elsewhere=True)
    if not (root / "fno.py").is_file():
        raise UserError(f"{root} is not the repository root (no fno.py there): use --root")
    why = history_unavailable(root)
    if why:
        raise UserError(f"cannot tell which results files are stale: {why}")
    if args.list:
        for target in targets:
            print(f"{target.name}: {' '.join(dependencies(target, root))}")
    lines = stale_files(root, targets)
    for line in lines:
        print(line)
    print(f"{len(lines)} of {sum((root / t.file).is_file() for t in targets)} results file(s) "
          "stale")
    return 1 if lines else 0


if __name__ == "__main__":
    run_main(main)
