#!/usr/bin/env bash
# Submit the course: the day-0 GPU check first, every other step only after it passed,
# each step with the resources it needs, and print where each job's results will be.
#
#   slurm/submit_all.sh                          every step in STEPS below (not the 2-node one)
#   slurm/submit_all.sh 00 04                    only the steps whose names start with 00 or 04
#   slurm/submit_all.sh --args 00_baseline='--epochs 5 --batch-size 16'
#                                                arguments for one step's program (repeatable)
#   slurm/submit_all.sh --with-2nodes            also the two-node variant
#   slurm/submit_all.sh --dry-run                print the sbatch commands, submit nothing
#   slurm/submit_all.sh -- --time=02:00:00       options after -- go to every sbatch
#
# Site settings come from slurm/site.env (account, partition, data, GPUs, RUN_ROOT).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "error: $*" >&2; exit 2; }

# One line per step, in submission order. Adding a step = a slurm/NN_name.sbatch file + a line.
#   resources: gpu  = 1 task, 1 GPU, CPUS_PER_GPU cores
#              gpus = GPUS_PER_NODE tasks on each of the script's nodes (its `#SBATCH --nodes=N`,
#                     1 if none), all their GPUs (--gpus-per-node), CPUS_PER_GPU cores per task
#              cpu  = no GPU (CPU-only work: the statistics)
#              (on a CPU site, GPU_VENDOR=none, every step keeps the #SBATCH lines of its script)
#   after:     -     = nothing
#              check = 00_gpu_check passed
#              data  = the dataset exists: 00_gpu_check passed, and 00_baseline passed when the
#                      dataset is missing at submission (00_baseline generates it)
STEPS=(
  # script            resources  after
  "00_gpu_check        gpus       -"
  "00_baseline         gpu        check"
  "01_profiling        gpu        data"
  "02_throughput       gpu        data"
  "03_affinity_report  gpus       check"
  "03_affinity_train   gpus       data"
  "04_stats            cpu        data"
  "04_stats_torchrun   cpu        data"
  "04_stats_2nodes     cpu        data"
  "05_ddp              gpus       data"
  "06_exact_metrics    gpus       data"
  "07_failures_2nodes  gpus       data"
  "08_host_syncs       gpu        data"
  "09_mixed_precision  gpu        data"
  "11_compile      gpu        data"
  "13_domain_parallel  gpus       data"
  "14_long_rollouts    gpu        data"
)

with_2nodes=0 dry=0 selected=() extra=() step_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --with-2nodes) with_2nodes=1;;
    --dry-run) dry=1;;
    --args) [ $# -ge 2 ] || die "--args needs STEP='ARGS'"; step_args+=("$2"); shift;;
    --args=*) step_args+=("${1#--args=}");;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    --) shift; extra=("$@"); break;;
    -*) die "unknown option $1 (see slurm/submit_all.sh --help)";;
    *) selected+=("$1");;
  esac
  shift
done

[ -f "$HERE/site.env" ] || die "slurm/site.env not found next to $0"
unset WELLFNO_ROOT
# shellcheck source=site.env
. "$HERE/site.env"
[ "$dry" = 1 ] || command -v sbatch >/dev/null 2>&1 || die "sbatch not found; run this on a Slurm login node (or start the local test cluster: sudo slurm/ci/start_cluster.sh)"
[ -n "${RUN_ROOT:-}" ] || die "RUN_ROOT is empty; set it in slurm/site.env"
case "$GPU_VENDOR" in none|nvidia|amd) ;; *) die "GPU_VENDOR='$GPU_VENDOR' in slurm/site.env; use none, nvidia or amd";; esac
if [ "$GPU_VENDOR" != none ]; then
  case "${GPUS_PER_NODE:-}" in ''|0|*[!0-9]*) die "GPU_VENDOR=$GPU_VENDOR needs GPUS_PER_NODE >= 1 in slurm/site.env";; esac
  case "${CPUS_PER_GPU:-}" in ''|0|*[!0-9]*) die "CPUS_PER_GPU='${CPUS_PER_GPU:-}' in slurm/site.env is not a whole number >= 1";; esac
fi
[ "$dry" = 1 ] || mkdir -p "$RUN_ROOT" || die "cannot create RUN_ROOT=$RUN_ROOT; set RUN_ROOT in slurm/site.env"
read -r -a site_args <<< "${SITE_SBATCH_ARGS:-}"

# Every job script needs its line (so a new step is never submitted without resources).
for s in "$HERE"/[0-9][0-9]_*.sbatch; do
  [ -f "$s" ] || continue
  name="$(basename "$s" .sbatch)"
  printf '%s\n' "${STEPS[@]}" | awk '{print $1}' | grep -qx "$name" \
    || die "slurm/$name.sbatch has no line in STEPS of slurm/submit_all.sh (resources and what it runs after)"
done

matches() {  # matches NAME PATTERN...: NAME starts with one of the patterns (or none given)
  local name="$1"; shift
  [ $# -eq 0 ] && return 0
  local p; for p in "$@"; do case "$name" in "$p"*) return 0;; esac; done
  return 1
}
for a in "${step_args[@]}"; do
  case "$a" in *=*) ;; *) die "--args '$a': write STEP='ARGS', e.g. --args 00_baseline='--epochs 5'";; esac
done

script_nodes() {  # script_nodes FILE -> the number of nodes its `#SBATCH --nodes=N` asks for (1 if none)
  local n
  n="$(sed -n 's/^#SBATCH --nodes=\([0-9][0-9]*\)\([ -].*\)\{0,1\}$/\1/p' "$1" | head -n1)"
  echo "${n:-1}"
}

resources() {  # resources KIND NODES -> sbatch options on this site
  [ "$GPU_VENDOR" = none ] && return 0
  local type="${GPU_TYPE:+$GPU_TYPE:}" nodes="$2"
  case "$1" in
    gpu)  echo "--nodes=1 --ntasks=1 --gpus-per-task=${type}1 --cpus-per-task=$CPUS_PER_GPU";;
    # Both --ntasks and --ntasks-per-node: given alone, --ntasks beside a script's
    # `#SBATCH --ntasks-per-node` is only a per-node maximum (`man sbatch`), and --nodes on the
    # command line would override a two-node script's `#SBATCH --nodes=2`: so all three here.
    gpus) echo "--nodes=$nodes --ntasks=$(( nodes * GPUS_PER_NODE )) --ntasks-per-node=$GPUS_PER_NODE --gpus-per-node=${type}$GPUS_PER_NODE --cpus-per-task=$CPUS_PER_GPU";;
    cpu)  ;;
    *) die "unknown resources '$1' in STEPS of slurm/submit_all.sh";;
  esac
}

# need_nodes NAME NODES: a job that asks for more nodes than its partition has would pend
# forever (Reason=PartitionNodeLimit); stop before submitting it, saying what it needs.
need_nodes() {
  local name="$1" nodes="$2" part have
  [ "$nodes" -gt 1 ] || return 0
  part="${SBATCH_PARTITION:-}"
  for a in "${site_args[@]}" "${extra[@]}"; do
    case "$a" in --partition=*|-p*) part="${a#--partition=}"; part="${part#-p}";; esac
  done
  [ -n "$part" ] || part="$(sinfo -h -o '%P' 2>/dev/null | sed -n 's/\*$//p' | head -n1)"
  have="$(sinfo -h -p "$part" -o '%D' 2>/dev/null | awk '{n += $1} END {print n + 0}' || true)"
  [ "$have" -ge "$nodes" ] || die "$name needs $nodes nodes, but partition '${part:-?}' has $have: submit it where $nodes nodes can run it (SITE_PARTITION in slurm/site.env), or leave out --with-2nodes"
}

dataset_ready=0
[ -d "$WELL_DATA/datasets/$DATASET/data" ] && dataset_ready=1

lines=()
for line in "${STEPS[@]}"; do
  read -r name _ _ <<< "$line"
  [ -f "$HERE/$name.sbatch" ] || continue
  case "$name" in *2nodes*) [ "$with_2nodes" = 1 ] || continue;; esac
  matches "$name" "${selected[@]}" || continue
  lines+=("$line")
done
[ ${#lines[@]} -gt 0 ] || die "no step matches ${selected[*]:-anything}; steps: $(printf '%s\n' "${STEPS[@]}" | awk '{printf "%s ", $1}')"
for a in "${step_args[@]}"; do
  hit=0; for line in "${lines[@]}"; do read -r name _ <<< "$line"; matches "$name" "${a%%=*}" && hit=1; done
  [ "$hit" = 1 ] || die "--args ${a%%=*}=...: no submitted step starts with '${a%%=*}'"
done

cd "$WELLFNO_ROOT"
declare -A jobid=()
echo "submitting ${#lines[@]} jobs (GPU_VENDOR=$GPU_VENDOR); results under $RUN_ROOT"
for line in "${lines[@]}"; do
  read -r name kind after <<< "$line"
  s="$HERE/$name.sbatch"
  jname="$(sed -n 's/^#SBATCH --job-name=\([^ ]*\).*/\1/p' "$s" | head -n1)"
  jname="${jname:-$name}"
  deps=()
  case "$after" in
    -) ;;
    check) [ -n "${jobid[00_gpu_check]:-}" ] && deps+=("${jobid[00_gpu_check]}");;
    data) [ -n "${jobid[00_gpu_check]:-}" ] && deps+=("${jobid[00_gpu_check]}")
          [ "$dataset_ready" = 0 ] && [ -n "${jobid[00_baseline]:-}" ] && deps+=("${jobid[00_baseline]}");;
    *) die "unknown 'after' value '$after' for $name in STEPS of slurm/submit_all.sh";;
  esac
  dep_opt=()
  if [ ${#deps[@]} -gt 0 ]; then
    dep_opt=(--dependency="afterok:$(IFS=:; echo "${deps[*]}")" --kill-on-invalid-dep=yes)
  fi
  nodes="$(script_nodes "$s")"
  [ "$dry" = 1 ] || need_nodes "$name" "$nodes"
  read -r -a res <<< "$(resources "$kind" "$nodes")"
  args=()
  for a in "${step_args[@]}"; do
    if matches "$name" "${a%%=*}"; then read -r -a more <<< "${a#*=}"; args+=("${more[@]}"); fi
  done
  cmd=(sbatch --parsable --job-name="$jname" --output="$RUN_ROOT/%x-%j.out"
       "${dep_opt[@]}" "${res[@]}" "${site_args[@]}" "${extra[@]}" "$s" "${args[@]}")
  if [ "$dry" = 1 ]; then
    echo "${cmd[*]}"; jobid[$name]="\$${name}"; continue
  fi
  jid="$("${cmd[@]}")" || die "sbatch $s failed"
  jid="${jid%%;*}"
  jobid[$name]="$jid"
  printf '%-8s %-20s -> %s/  (after: %s)\n' "$jid" "$jname" "$RUN_ROOT/$jname-$jid" "${deps[*]:-nothing}"
done
[ "$dry" = 1 ] || echo "watch with: squeue --me   (a failed step cancels the steps that wait for it)"
