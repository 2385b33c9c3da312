#!/usr/bin/env bash
# Install a single-node Slurm (Debian's slurm-wlm) and munge for the local
# test cluster. Idempotent: returns at once when everything is already there.
# Needs root (or sudo) and apt-get; used by .ci/run and by developers by hand.
set -euo pipefail

need=()
for cmd in slurmctld slurmd sbatch srun sinfo sacct scontrol munged munge; do
  command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "slurm/ci/install.sh: Slurm and munge already installed (slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null || echo '?'))"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing ${need[*]} and no apt-get here; install slurm-wlm and munge with your package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "error: installing slurm-wlm needs root; run: sudo $0" >&2; exit 1
  fi
fi

echo "slurm/ci/install.sh: installing slurm-wlm and munge (missing: ${need[*]})"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# slurm-wlm: slurmctld + slurmd + client tools; munge: authentication daemon;
# hwloc-nox / procps: topology and ps for slurmd; no slurmdbd (sacct reads the
# job completion text file configured by start_cluster.sh).
$SUDO apt-get install -y -qq --no-install-recommends \
  slurm-wlm slurm-client slurmctld slurmd munge procps hostname >/dev/null 2>&1 \
  || $SUDO apt-get install -y --no-install-recommends slurm-wlm slurm-client slurmctld slurmd munge procps hostname
echo "slurm/ci/install.sh: installed slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm)"
