#!/usr/bin/env bash
# The CPU base image CI builds the course image on (a site uses its own PyTorch image instead:
# containers/README.md). No container registry is reachable from CI, so nothing is pulled:
#   1. localhost/wellfno-debian:bookworm, a Debian rootfs made by debootstrap and `podman import`ed;
#   2. localhost/wellfno-cpu-base:$TORCH_VERSION, that plus Python and CPU torch in the *system*
#      Python, as a site's PyTorch image has it (NGC and rocm/pytorch: torch in the image's Python).
# Each is built only where podman lacks it (FORCE=1 rebuilds). Root, Debian's podman, debootstrap
# and runc (apt-get install podman debootstrap runc); containers/build.sh calls this.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
DEBIAN_IMAGE=${DEBIAN_IMAGE:-localhost/wellfno-debian:bookworm}
CPU_BASE=${CPU_BASE:-localhost/wellfno-cpu-base:$TORCH_VERSION}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

have() { [ -z "${FORCE:-}" ] && podman image exists "$1"; }

if ! have "$DEBIAN_IMAGE"; then
  command -v debootstrap >/dev/null || { echo "error: debootstrap not found: apt-get install -y debootstrap (or DEBIAN_IMAGE=an image podman has)" >&2; exit 2; }
  root=$(mktemp -d /var/tmp/wellfno-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "cpu-base: debootstrap bookworm into $root"
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" > "$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; echo "error: debootstrap failed (log: $root.log)" >&2; exit 2; }
  rm -f "$root.log"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import - "$DEBIAN_IMAGE"
  rm -rf "$root"; trap - EXIT
fi

if ! have "$CPU_BASE"; then
  # pip inside the build sees what this machine's pip sees (containers/hostpip.py: on CI, the CPU
  # torch wheel lies in its find-links folder, and PyPI's TLS goes through the network's proxy,
  # whose CA bundle the image lacks); elsewhere torch's CPU wheel comes from TORCH_INDEX.
  ctx=$(mktemp -d /var/tmp/wellfno-base.XXXXXX)
  trap 'rm -rf "$ctx"' EXIT
  cp "$here/cpu-base.Containerfile" "$ctx/"
  mapfile -t mounts < <(python3 "$here/hostpip.py" "$ctx/pip.env")
  # PyTorch's own CPU index only where this machine's pip has no wheels of its own (CI's has)
  torch_index=${TORCH_INDEX-$(grep -q -E '^export PIP_(FIND_LINKS|INDEX_URL)=' "$ctx/pip.env" ||
                               echo https://download.pytorch.org/whl/cpu)}
  echo "cpu-base: $CPU_BASE from $DEBIAN_IMAGE (python3, torch==$TORCH_VERSION CPU)"
  podman build --network host -t "$CPU_BASE" "${mounts[@]}" \
    --build-arg BASE="$DEBIAN_IMAGE" --build-arg TORCH_VERSION="$TORCH_VERSION" \
    --build-arg TORCH_INDEX="$torch_index" \
    -f "$ctx/cpu-base.Containerfile" "$ctx"
fi
