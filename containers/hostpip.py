"""This machine's pip settings, for pip inside a container build (containers/build.sh).

    python3 containers/hostpip.py ENVFILE     # prints one podman -v option a line

CI's pip finds its wheels through its configuration (`pip config list`: find-links, file://
indexes, a constraints file, a CA bundle for the network's TLS proxy), none of which the image
has. ENVFILE gets those settings as PIP_* variables (a build step sources it); each local path
they name is mounted read-only at the same path, for that step only: nothing stays in the image.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

KEYS = ("find-links", "index-url", "extra-index-url", "cert", "constraint", "trusted-host",
        "default-timeout", "no-index")


def settings() -> dict[str, str]:
    """pip config list's values, the environment's (:env:) over the files' (global., user.)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    found: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if name in KEYS:
            rank = 2 if scope == ":env:" else 1
            if rank >= found.get(name, (0, ""))[0]:
                found[name] = (rank, value.strip().strip("'\""))
    return {name: value for name, (_, value) in found.items()}


def local_paths(value: str) -> list[Path]:
    paths = []
    for part in value.split():
        path = Path(part[len("file://"):] if part.startswith("file://") else part)
        if path.is_absolute() and path.exists():
            paths.append(path.parent if path.name == "simple" and path.is_dir() else path)
    return paths


def main(envfile: str) -> None:
    found = settings()
    mounts: list[Path] = []
    with open(envfile, "w") as f:
        for name, value in found.items():
            f.write(f"export PIP_{name.upper().replace('-', '_')}={shlex.quote(value)}\n")
            mounts += local_paths(value)
    for path in dict.fromkeys(mounts):
        print(f"--volume={path}:{path}:ro")


if __name__ == "__main__":
    main(sys.argv[1])
