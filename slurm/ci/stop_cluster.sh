#!/usr/bin/env bash
# Stop the local test cluster started by start_cluster.sh: cancels its jobs,
# stops slurmd and slurmctld (and munged if this script's sibling started it).
# Leaves the state folder so a restart keeps job ids increasing.
set -uo pipefail
ROOT="${SLURM_CI_ROOT:-/var/tmp/wellfno-slurm}"
[ "$(id -u)" -eq 0 ] || { echo "error: run: sudo $0" >&2; exit 1; }

stop_pidfile() {  # name pidfile
  local pid
  [ -f "$2" ] || return 0
  pid="$(cat "$2" 2>/dev/null)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || { echo "stopped $1 ($pid)"; return 0; }; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null; echo "killed $1 ($pid)"
}

if [ "${SLURM_CI_KEEP_JOBS:-0}" != 1 ] && command -v scancel >/dev/null 2>&1 && [ -f "$ROOT/run/slurmctld.pid" ]; then
  timeout 10 scancel --user=root >/dev/null 2>&1 || true
fi
stop_pidfile slurmd "$ROOT/run/slurmd.pid"
stop_pidfile slurmctld "$ROOT/run/slurmctld.pid"
if [ "${SLURM_CI_KEEP_MUNGE:-0}" != 1 ] && [ -f /run/munge/munged.pid ]; then
  stop_pidfile munged /run/munge/munged.pid
fi
exit 0
