#!/usr/bin/env bash
# Submit the whole course, each step after the previous one succeeded
# (--dependency=afterok), and print where each job's results will be.
#
#   slurm/submit_all.sh                    every slurm/NN_*.sbatch in order (not the 2-node one)
#   slurm/submit_all.sh --with-2nodes      also the two-node variant
#   slurm/submit_all.sh 00 04              only the steps whose names start with 00 or 04
#   slurm/submit_all.sh --dry-run          print the sbatch commands, submit nothing
#   slurm/submit_all.sh -- --time=02:00:00 options after -- go to every sbatch
#
# Site settings come from slurm/site.env (account, partition, data, GPUs, RUN_ROOT).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "error: $*" >&2; exit 2; }

with_2nodes=0 dry=0 steps=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --with-2nodes) with_2nodes=1;;
    --dry-run) dry=1;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    --) shift; extra=("$@"); break;;
    -*) die "unknown option $1 (see slurm/submit_all.sh --help)";;
    *) steps+=("$1");;
  esac
  shift
done

[ -f "$HERE/site.env" ] || die "slurm/site.env not found next to $0"
unset WELLFNO_ROOT
# shellcheck source=site.env
. "$HERE/site.env"
[ "$dry" = 1 ] || command -v sbatch >/dev/null 2>&1 || die "sbatch not found; run this on a Slurm login node (or start the local test cluster: sudo slurm/ci/start_cluster.sh)"
[ -n "${RUN_ROOT:-}" ] || die "RUN_ROOT is empty; set it in slurm/site.env"
[ "$dry" = 1 ] || mkdir -p "$RUN_ROOT" || die "cannot create RUN_ROOT=$RUN_ROOT; set RUN_ROOT in slurm/site.env"
read -r -a site_args <<< "${SITE_SBATCH_ARGS:-}"

scripts=()
for s in "$HERE"/[0-9][0-9]_*.sbatch; do
  [ -f "$s" ] || continue
  name="$(basename "$s" .sbatch)"
  case "$name" in *2nodes*) [ "$with_2nodes" = 1 ] || continue;; esac
  if [ ${#steps[@]} -gt 0 ]; then
    keep=0; for p in "${steps[@]}"; do case "$name" in "$p"*) keep=1;; esac; done
    [ "$keep" = 1 ] || continue
  fi
  scripts+=("$s")
done
[ ${#scripts[@]} -gt 0 ] || die "no job scripts match ${steps[*]:-slurm/[0-9][0-9]_*.sbatch}"

cd "$WELLFNO_ROOT"
prev=""
echo "submitting ${#scripts[@]} jobs; results under $RUN_ROOT"
for s in "${scripts[@]}"; do
  name="$(sed -n 's/^#SBATCH --job-name=\([^ ]*\).*/\1/p' "$s" | head -n1)"
  name="${name:-$(basename "$s" .sbatch)}"
  cmd=(sbatch --parsable --job-name="$name" --output="$RUN_ROOT/%x-%j.out"
       ${prev:+--dependency=afterok:$prev --kill-on-invalid-dep=yes}
       "${site_args[@]}" "${extra[@]}" "$s")
  if [ "$dry" = 1 ]; then
    echo "${cmd[*]}"; prev="\$PREV_JOBID"; continue
  fi
  jid="$("${cmd[@]}")" || die "sbatch $s failed"
  jid="${jid%%;*}"
  printf '%-8s %-22s -> %s/  (log %s)\n' "$jid" "$name" "$RUN_ROOT/$name-$jid" "$RUN_ROOT/$name-$jid.out"
  prev="$jid"
done
[ "$dry" = 1 ] || echo "watch with: squeue --me   (a failed step cancels the steps after it)"
