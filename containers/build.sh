#!/usr/bin/env bash
# Build the course's image with podman (podman-hpc and docker take the same Containerfile):
#
#   containers/build.sh                      # CI: localhost/wellfno-course:cpu on the CPU base
#   BASE=nvcr.io/nvidia/pytorch:25.01-py3 IMAGE=wellfno-course:ngc containers/build.sh
#   PODMAN=podman-hpc BASE=nvcr.io/nvidia/pytorch:25.01-py3 containers/build.sh   # NERSC
#
# Without BASE: the CPU base (containers/cpu-base.sh) first, where podman lacks it. The context is
# a copy of what the build installs from (requirements.txt, pyproject.toml, containers/, the
# packages): never the repository's data, runs or venvs, and nothing of it stays in the image.
# Then `wellfno-container-check` in the new image, with the repository mounted.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
IMAGE=${IMAGE:-localhost/wellfno-course:cpu}
# podman-hpc (NERSC) passes build and run through to podman with its own storage and options
PODMAN=${PODMAN:-podman}
command -v "$PODMAN" >/dev/null || { echo "error: $PODMAN not found: apt-get install -y podman runc, or PODMAN=podman-hpc (containers/README.md)" >&2; exit 2; }
if [ -z "${BASE:-}" ]; then  # the CPU base is CI's, made with Debian's podman
  BASE=localhost/wellfno-cpu-base:${TORCH_VERSION:-2.13.0}
  CPU_BASE=$BASE "$here/cpu-base.sh"
fi
ctx=$(mktemp -d /var/tmp/wellfno-context.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
paths=(requirements.txt pyproject.toml containers wellfno benchtools profiling affinity coursetools)
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard -- "${paths[@]}" |
     xargs -0 cp --parents -t "$ctx")
else
  (cd "$repo" && cp -r --parents -t "$ctx" "${paths[@]}")
fi
mapfile -t mounts < <(python3 "$here/hostpip.py" "$ctx/containers/pip.env")
# The context's digest: a build step's cache does not look into what it mounts, this does
# (requirements.txt or the packages changed: the install runs again).
digest=$(cd "$ctx" && find . -type f ! -name pip.env -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
echo "build: $IMAGE on $BASE (context $digest)"
"$PODMAN" build --network host -t "$IMAGE" --build-arg BASE="$BASE" --build-arg CONTEXT="$digest" \
  "${mounts[@]}" \
  -f "$ctx/containers/Containerfile" "$ctx"
"$PODMAN" run --rm --network none -v "$repo:/course" "$IMAGE" wellfno-container-check
