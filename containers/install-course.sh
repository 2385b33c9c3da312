#!/usr/bin/env bash
# What the course adds to a site's PyTorch image (containers/Containerfile and course.def run it at
# build time, from a copy of the repository's requirements and packages at SRC):
#   - a venv at VENV (/opt/wellfno-venv) that sees the image's own Python's packages, its torch
#     above all (make venv does the same with a site's module: the Makefile's venv step);
#   - requirements.txt in that venv, and the course's packages, editable, pointing at REPO
#     (/course), where the repository is bind-mounted at run time: a participant's edits are seen
#     inside, and nothing of the repository stays in the image;
#   - containers/container-check.py as `wellfno-container-check`, in the image (it must run when
#     the repository is not mounted, to say so).
# torch is never installed: the image's is the site's GPU build. A requirement that would install
# or replace it stops the build, one `error:` line (pip's --dry-run --report says what it would do).
set -euo pipefail
SRC=${SRC:-/tmp/wellfno-src}
REPO=${REPO:-/course}
VENV=${VENV:-/opt/wellfno-venv}
PYTHON=${PYTHON:-python3}
REQUIREMENTS=${REQUIREMENTS:-$SRC/requirements.txt}
# The oldest torch the course supports (wellfno/cli.py's OLDEST_TORCH, the Makefile's OLDEST_TORCH).
OLDEST_TORCH=${OLDEST_TORCH:-2.5}

die() { echo "error: $*" >&2; exit 2; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found in the base image: build on a PyTorch image (BASE=nvcr.io/nvidia/pytorch:..., rocm/pytorch:..., or containers/cpu-base.sh's)"
torch_version=$("$PYTHON" -W ignore -c "import torch; print(torch.__version__)" 2>/dev/null) ||
  die "the base image's $PYTHON ($(command -v "$PYTHON")) cannot import torch: build on a PyTorch image (BASE=nvcr.io/nvidia/pytorch:..., rocm/pytorch:..., or containers/cpu-base.sh's), or PYTHON=the image's Python that has it"
torch_file=$("$PYTHON" -W ignore -c "import torch; print(torch.__file__)")
"$PYTHON" - "$torch_version" "$OLDEST_TORCH" <<'EOF' || die "the base image's torch $torch_version is older than $OLDEST_TORCH, the oldest this course supports: build on a newer PyTorch image (BASE=...)"
import sys
have = tuple(int(p) for p in sys.argv[1].split("+")[0].split(".")[:2])
sys.exit(have < tuple(int(p) for p in sys.argv[2].split(".")))
EOF

# The venv: --system-site-packages where torch is the base interpreter's (NGC, the CPU base); a
# torch that lives in a venv (the image's python3 is a venv's) through coursetools.sitevenv, as
# `make venv` does (the Makefile says why).
if "$PYTHON" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then
  (cd "$SRC" && "$PYTHON" -m coursetools.sitevenv "$VENV") || exit 2
else
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PY=$VENV/bin/python
[ "$("$PY" -W ignore -c "import torch; print(torch.__file__)")" = "$torch_file" ] ||
  die "the venv $VENV does not see the base image's torch ($torch_file)"

# What pip would do, before it does it: torch in the report's install list means pip would install
# torch, or replace the image's: stop, and name the requirement that asks for it.
report=$(mktemp)
"$PY" -m pip install -q --dry-run --report "$report" -r "$REQUIREMENTS" ||
  die "pip cannot resolve $REQUIREMENTS on this image (its log above)"
"$PY" - "$report" "$torch_version" <<'EOF' || exit 2
import json, re, sys
items = json.load(open(sys.argv[1]))["install"]
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
new = {canon(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
for name in ("torch", "pytorch-triton", "pytorch-triton-rocm"):  # torch's own companion builds
    if name in new:
        why = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items
                     if any(re.match(rf"{name}\b", r, re.I) for r in i["metadata"].get("requires_dist", [])))
        print(f"error: pip would install {name} {new[name]} over the base image's torch {sys.argv[2]}"
              f" (asked for by {', '.join(why) or 'the requirements themselves'}): build on a PyTorch"
              f" image whose torch satisfies it (BASE=...), or pin that package to a version that"
              f" accepts torch {sys.argv[2]}; never let pip replace the site's torch build",
              file=sys.stderr)
        sys.exit(2)
EOF
rm -f "$report"
"$PY" -m pip install -q --no-cache-dir -r "$REQUIREMENTS"
# The Makefile's reason: neuraloperator requires wandb, imports it only where installed, and that
# import costs every process 0.8 s; the course logs nothing to it.
"$PY" -m pip uninstall -q -y wandb
# The packages, editable at REPO: built from SRC (a copy at REPO at build time), found at REPO at
# run time, where the repository is mounted.
"$PY" -m pip install -q --no-cache-dir --no-deps -e "$REPO"
[ "$("$PY" -W ignore -c "import torch; print(torch.__version__, torch.__file__)")" = "$torch_version $torch_file" ] ||
  die "the install changed the base image's torch $torch_version ($torch_file): a requirement replaced it"
install -m 755 "$SRC/containers/container-check.py" "$VENV/bin/wellfno-container-check"
sed -i "1s|.*|#!$PY|" "$VENV/bin/wellfno-container-check"
# The Makefile's venv step, done: `make` inside the image uses this venv (WELLFNO_CONTAINER_VENV).
touch "$VENV/.installed"
echo "course venv $VENV: torch $torch_version (the base image's), $(wc -l < <("$PY" -m pip freeze)) packages"
