#!/usr/bin/env bash
# Stop the local test cluster started by start_cluster.sh: cancels its jobs, stops every
# node's slurmd and slurmctld (and munged if this script's sibling started it), and removes
# the node names start_cluster.sh added to /etc/hosts (only its marked lines).
# Leaves the state folder so a restart keeps job ids increasing.
# SLURM_CI_KEEP_JOBS=1 / SLURM_CI_KEEP_MUNGE=1 / SLURM_CI_KEEP_HOSTS=1: leave those alone
# (start_cluster.sh uses them to restart the daemons after a configuration change).
set -uo pipefail
ROOT="${SLURM_CI_ROOT:-/var/tmp/wellfno-slurm}"
HOSTS_FILE="${SLURM_CI_HOSTS_FILE:-/etc/hosts}"
HOSTS_MARKER="# wellfno slurm/ci test cluster node"
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
# slurmd-<node>.pid: one per node; slurmd.pid: a single-node cluster of an older version of this script.
for pidfile in "$ROOT"/run/slurmd-*.pid "$ROOT/run/slurmd.pid"; do
  [ -f "$pidfile" ] || continue
  name="$(basename "$pidfile" .pid)"
  stop_pidfile "$name" "$pidfile"
done
stop_pidfile slurmctld "$ROOT/run/slurmctld.pid"
if [ "${SLURM_CI_KEEP_MUNGE:-0}" != 1 ] && [ -f /run/munge/munged.pid ]; then
  stop_pidfile munged /run/munge/munged.pid
fi
if [ "${SLURM_CI_KEEP_HOSTS:-0}" != 1 ] && [ -f "$HOSTS_FILE" ] && grep -qF "$HOSTS_MARKER" "$HOSTS_FILE"; then
  # in place (not mv): /etc/hosts may be a bind mount
  kept="$(mktemp)"
  grep -vF "$HOSTS_MARKER" "$HOSTS_FILE" > "$kept"
  cat "$kept" > "$HOSTS_FILE" && echo "removed the test nodes' names from $HOSTS_FILE"
  rm -f "$kept"
fi
exit 0
