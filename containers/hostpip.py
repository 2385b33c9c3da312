"""This machine's pip settings, for pip inside a container build (containers/build.sh).

    python3 containers/hostpip.py ENVFILE     # prints one podman -v option a line

CI's pip finds its wheels through its configuration (`pip config list`: find-links, file://
indexes, a constraints file, a CA bundle for the network's TLS proxy), none of which the image
has. ENVFILE gets those settings as PIP_* variables (a build step sources it); each local path
they name is mounted read-only under /run/wellfno-host (the same path below it), for the build
only: nothing stays in the image.
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


# Where the host's paths appear in the build step: under a folder of their own, never at their own
# path, since a file mounted over the image's own (the CA bundle at /etc/ssl/certs) cannot be
# replaced by the image's packages (ca-certificates' postinst: "Device or resource busy").
INSIDE = "/run/wellfno-host"


def local_path(part: str) -> Path | None:
    """The local file or folder a pip setting's word names (file:// URLs: the index's folder)."""
    path = Path(part[len("file://"):] if part.startswith("file://") else part)
    if path.is_absolute() and path.exists():
        return path.parent if path.name == "simple" and path.is_dir() else path
    return None


def main(envfile: str) -> None:
    mounts: list[Path] = []
    with open(envfile, "w") as f:
        for name, value in settings().items():
            words = []
            for part in value.split():
                path = local_path(part)
                if path is not None:
                    mounts.append(path)
                    part = part.replace(str(path), INSIDE + str(path), 1)
                words.append(part)
            f.write(f"export PIP_{name.upper().replace('-', '_')}={shlex.quote(' '.join(words))}\n")
    for path in dict.fromkeys(mounts):
        print(f"--volume={path}:{INSIDE}{path}:ro")


if __name__ == "__main__":
    main(sys.argv[1])
