# What every job script shares. Sourced at the top of slurm/NN_*.sbatch:
#     . "${WELLFNO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"
# Provides: site settings (slurm/site.env) with checks, the software environment,
# RUN_DIR (one folder per job), SRUN_CPUS_PER_TASK / OMP_NUM_THREADS, DEVICE,
# and `launch [srun options] -- command` / `launch_gpu ...` (plain run outside Slurm),
# through CONTAINER_EXEC (slurm/site.env) when the programs run inside a container.
# Bad settings end the job with one line `error: ...` and exit status 2.
set -euo pipefail

wf_die() { echo "error: $*" >&2; exit 2; }

# --- site settings -------------------------------------------------------------
_wf_here="${WELLFNO_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
[ -f "$_wf_here/slurm/site.env" ] || wf_die "no slurm/site.env under '$_wf_here'; submit from the repository root or export WELLFNO_ROOT"
WELLFNO_ROOT="$(cd "$_wf_here" && pwd)"
export WELLFNO_ROOT
# shellcheck source=site.env
. "$WELLFNO_ROOT/slurm/site.env"

[ -n "${WELL_DATA:-}" ] || wf_die "WELL_DATA is empty; set it in slurm/site.env to the folder that holds datasets/"
[ -n "${RUN_ROOT:-}" ]  || wf_die "RUN_ROOT is empty; set it in slurm/site.env to where job results go"
[ -n "${DATASET:-}" ]   || wf_die "DATASET is empty; set it in slurm/site.env (e.g. gray_scott_embedded)"
case "${GPU_VENDOR:-}" in none|nvidia|amd) ;;
  *) wf_die "GPU_VENDOR='${GPU_VENDOR:-}' in slurm/site.env; use none, nvidia or amd";; esac
case "${GPUS_PER_NODE:-}" in ''|*[!0-9]*) wf_die "GPUS_PER_NODE='${GPUS_PER_NODE:-}' in slurm/site.env is not a whole number";; esac
if [ "$GPU_VENDOR" != none ] && [ "$GPUS_PER_NODE" -eq 0 ]; then
  wf_die "GPU_VENDOR=$GPU_VENDOR but GPUS_PER_NODE=0 in slurm/site.env; set the number of GPUs per node"
fi
case "${CPUS_PER_GPU:-}" in ''|0|*[!0-9]*) wf_die "CPUS_PER_GPU='${CPUS_PER_GPU:-}' in slurm/site.env is not a whole number >= 1";; esac
case "${GPU_SELECT_BY_LOCALID:-0}" in 0|1) ;; *) wf_die "GPU_SELECT_BY_LOCALID='${GPU_SELECT_BY_LOCALID}' in slurm/site.env; use 0 or 1";; esac
DATASET_DIR="$WELL_DATA/datasets/$DATASET"

# --- software environment ------------------------------------------------------
if [ -n "${SITE_SETUP:-}" ]; then eval "$SITE_SETUP" || wf_die "SITE_SETUP failed: $SITE_SETUP"; fi
if [ -n "${SITE_MODULES:-}" ]; then
  if ! type module >/dev/null 2>&1; then
    for f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
      [ -f "$f" ] && { set +u; . "$f"; set -u; break; }
    done
  fi
  type module >/dev/null 2>&1 || wf_die "SITE_MODULES is set but this node has no 'module' command"
  set +u; module load $SITE_MODULES || wf_die "module load $SITE_MODULES failed"; set -u
fi
if [ -n "${SITE_VENV:-}" ]; then
  [ -f "$SITE_VENV/bin/activate" ] || wf_die "SITE_VENV=$SITE_VENV is not a virtual environment; run 'make venv' or set SITE_VENV= in slurm/site.env"
  set +u; . "$SITE_VENV/bin/activate"; set -u
fi
PYTHON="${PYTHON:-python}"
# --- a container (CONTAINER_EXEC in slurm/site.env) -----------------------------
# Every program of the job runs as `srun [options] [gpu_select.sh] CONTAINER_EXEC program`:
# srun and slurm/gpu_select.sh stay on the host, so the rank variables and the GPU selection
# are Slurm's as without a container; the runtime hands them to the program (podman's
# --env-host, Apptainer's default). The python is the image's, found on the image's PATH.
_wf_cexec=()
if [ -n "${CONTAINER_EXEC:-}" ]; then
  # expanded here, when every setting is known (site.env writes it in single quotes)
  eval "_wf_cexec=($CONTAINER_EXEC)" 2>/dev/null \
    || wf_die "CONTAINER_EXEC in slurm/site.env is not a command line: $CONTAINER_EXEC"
  [ ${#_wf_cexec[@]} -gt 0 ] || wf_die "CONTAINER_EXEC in slurm/site.env is blank; leave it empty for no container"
  command -v "${_wf_cexec[0]}" >/dev/null 2>&1 \
    || wf_die "CONTAINER_EXEC: '${_wf_cexec[0]}' not found on $(hostname -s); load it in SITE_MODULES or SITE_SETUP (slurm/site.env)"
  [ -z "${SITE_VENV:-}" ] || wf_die "SITE_VENV=$SITE_VENV and CONTAINER_EXEC are both set; the container's python never sees a host venv: set SITE_VENV= (or PYTHON= a python inside the image) in slurm/site.env"
  # A venv the job was submitted from (sbatch exports the environment) must not leak in:
  # podman's --env-host would carry VIRTUAL_ENV and its bin/ on PATH into the image.
  if [ -n "${VIRTUAL_ENV:-}" ]; then
    PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$VIRTUAL_ENV/bin" | paste -sd: -)"
    export PATH
    unset VIRTUAL_ENV
  fi
  # The course's packages come from the bound repository, whatever the image installed (an
  # editable install of another copy, e.g. at /course, or none): participants' edits are seen.
  export PYTHONPATH="$WELLFNO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
  # a token the start-of-job check looks for inside: the job's environment arrived
  WELLFNO_CONTAINER_MARK="${SLURM_JOB_ID:-local}-$$-$RANDOM"
  export WELLFNO_CONTAINER_MARK
else
  command -v "$PYTHON" >/dev/null 2>&1 || wf_die "'$PYTHON' not found after loading the environment; check SITE_MODULES/SITE_VENV in slurm/site.env"
fi
cd "$WELLFNO_ROOT"

# --- CPUs and threads ----------------------------------------------------------
# srun >= 22.05 no longer inherits --cpus-per-task from the allocation.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
  export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"
fi
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}"

# --- GPUs ----------------------------------------------------------------------
# Two ways a GPU step hands out GPUs (slurm/README.md, "GPU binding"), both through
# slurm/gpu_select.sh, which keeps what Slurm set and only fixes what HIP would misread:
#  launch_gpu: one GPU per task (srun --gpus-per-task=1, which Slurm binds per task: every
#              task sees exactly one GPU of the job, `man srun`). Steps whose tasks do not talk.
#  launch_ddp: every task sees all the job's GPUs on its node (srun --gpus-per-node) and drives
#              its local rank's (wellfno.device.gpu_index_for), so NCCL/RCCL keeps its
#              peer-to-peer paths (NVLink, xGMI) between them. The data-parallel steps (05).
GPU_SRUN_FLAGS=()
GPU_WRAP=()
DEVICE=cpu
if [ "$GPU_VENDOR" != none ]; then
  GPU_SRUN_FLAGS=(--gpus-per-task="${GPU_TYPE:+$GPU_TYPE:}1")
  [ -n "${GPU_BIND:-}" ] && GPU_SRUN_FLAGS+=(--gpu-bind="$GPU_BIND")
  GPU_WRAP=(bash "$WELLFNO_ROOT/slurm/gpu_select.sh")
  DEVICE=cuda    # ROCm builds of torch report AMD GPUs as 'cuda' too
fi
if [ "$GPU_VENDOR" = amd ]; then
  # MIOpen keeps its tuning database (sqlite) and compiled kernels under $HOME by default,
  # and sqlite's locking fails on Lustre; rocFFT keeps its runtime-compiled kernels only in
  # memory unless ROCFFT_RTC_CACHE_PATH names a file. Both go to node-local storage, one
  # folder per job (the same path on every node; slurm/gpu_select.sh creates it per node).
  # Variables: MIOpen "System performance database and user database" and "persistent program
  # cache" (https://rocm.docs.amd.com/projects/MIOpen/en/latest/install/build-source.html),
  # rocFFT (https://rocm.docs.amd.com/projects/rocFFT/en/latest/how-to/runtime-compilation.html).
  _wf_cache="$LOCAL_TMP/wellfno-${USER:-$(id -un)}-${SLURM_JOB_ID:-$$}"
  export MIOPEN_USER_DB_PATH="${MIOPEN_USER_DB_PATH:-$_wf_cache/miopen}"
  export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_CUSTOM_CACHE_DIR:-$MIOPEN_USER_DB_PATH}"
  export ROCFFT_RTC_CACHE_PATH="${ROCFFT_RTC_CACHE_PATH:-$_wf_cache/rocfft_rtc_cache.db}"
fi

# _wf_run [srun options...] -- command: srun in a Slurm job, else the command once.
_wf_run() {
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  [ "${1:-}" = "--" ] || wf_die "launch: missing '--' before the command"
  shift
  if [ -n "${SLURM_JOB_ID:-}" ] && command -v srun >/dev/null 2>&1; then
    srun "${opts[@]}" "$@"
  else
    "$@"
  fi
}
# _wf_container_check: one srun step, one task per node, inside the container: the job's
# environment arrived, the repository (as the working directory), WELL_DATA and RUN_DIR are
# there at the same paths, python is found and imports the course's packages from the repository. Each failure is one `error:` line naming the fix
# (exit 2). Sets _wf_python_is to the python's path inside.
_wf_container_check() {
  local has_data=0 out rc=0
  [ -d "$WELL_DATA/datasets" ] && has_data=1     # 00_baseline may still have to generate it
  # POSIX sh and its built-ins only: the image may have no bash, its PATH may be wrong.
  # Exit 3 = a check failed and said so.
  local check='mark=$1 root=$2 data=$3 has_data=$4 run=$5 py=$6 bad=0
say() { echo "error: $*" >&2; bad=1; }
[ "${WELLFNO_CONTAINER_MARK:-}" = "$mark" ] || say "the job'"'"'s environment does not reach the container (WELLFNO_CONTAINER_MARK is not set inside): podman and podman-hpc need --env-host in CONTAINER_EXEC; for Apptainer leave out --cleanenv/--containall (slurm/site.env)"
if [ ! -f "$root/slurm/common.sh" ]; then
  say "the repository $root is not visible inside the container: bind it at the same path in CONTAINER_EXEC (apptainer --bind $root; podman -v $root:$root)"
elif [ "$(pwd -P)" != "$(cd "$root" && pwd -P)" ]; then
  say "the container starts in $(pwd), not in the repository $root: add -w $root (podman) or --pwd $root (apptainer) to CONTAINER_EXEC"
fi
[ "$has_data" = 0 ] || [ -d "$data/datasets" ] || say "WELL_DATA=$data is not visible inside the container: bind it at the same path in CONTAINER_EXEC (apptainer --bind $data; podman -v $data:$data)"
{ [ -d "$run" ] && [ -w "$run" ]; } || say "the run folder $run is not writable inside the container: bind RUN_ROOT at the same path in CONTAINER_EXEC (apptainer --bind ${run%/*}; podman -v ${run%/*}:${run%/*})"
p=$(command -v "$py" 2>/dev/null) || say "$py not found inside the container (PATH=$PATH): podman needs --env PATH=<the image PATH> in CONTAINER_EXEC (on podman 4.x --env-host replaces it), or set PYTHON= in slurm/site.env to the image python"
if [ "$bad" = 0 ]; then
  # from / : `python -c` would find the package in the working directory, a script run does not
  w=$(cd / && "$p" -c "import os, wellfno; print(os.path.dirname(os.path.realpath(wellfno.__file__)))" 2>/dev/null) || w=""
  [ "$w" = "$(cd "$root" && pwd -P)/wellfno" ] || say "$p inside the container imports the course package wellfno from ${w:-nowhere}, not from the repository $root: the job sets PYTHONPATH=$root, which must reach it (an image that sets its own PYTHONPATH wins under Apptainer: add --env PYTHONPATH=$root to CONTAINER_EXEC)"
fi
[ "$bad" = 0 ] || exit 3
echo "python=$p"'
  out="$(_wf_run --ntasks="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 -- \
          "${_wf_cexec[@]}" /bin/sh -c "$check" wellfno-container-check "$WELLFNO_CONTAINER_MARK" \
          "$WELLFNO_ROOT" "$WELL_DATA" "$has_data" "$RUN_DIR" "$PYTHON")" || rc=$?
  if [ "$rc" -eq 3 ]; then exit 2; fi
  [ "$rc" -eq 0 ] || wf_die "the container did not run the check (exit $rc): see the message above; check the runtime and the image in CONTAINER_EXEC (slurm/site.env)"
  _wf_python_is="$(printf '%s\n' "$out" | sed -n 's/^python=//p' | head -n1)"
  [ -n "$_wf_python_is" ] || wf_die "the container's check printed no python path (its output: ${out:-nothing}); check CONTAINER_EXEC in slurm/site.env"
}

# --- one run folder per job ----------------------------------------------------
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then  # a job array: one folder for all its tasks
  RUN_DIR="$RUN_ROOT/${SLURM_JOB_NAME:-job}-$SLURM_ARRAY_JOB_ID"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
  RUN_DIR="$RUN_ROOT/${SLURM_JOB_NAME:-job}-$SLURM_JOB_ID"
else
  RUN_DIR="$RUN_ROOT/${WF_STEP:-$(basename "$0" .sbatch)}-$(date +%Y%m%d-%H%M%S)"
fi
_wf_task="${SLURM_ARRAY_TASK_ID:+-task$SLURM_ARRAY_TASK_ID}"  # each array task's own log names
mkdir -p "$RUN_DIR" || wf_die "cannot create run folder $RUN_DIR; check RUN_ROOT in slurm/site.env"
export RUN_DIR DATASET_DIR DEVICE
# Link the job's Slurm log into the run folder so everything is in one place.
if [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol >/dev/null 2>&1; then
  _wf_out="$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -n1)" || true
  _wf_err="$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdErr=//p' | head -n1)" || true
  [ -n "${_wf_out:-}" ] && [ -e "$_wf_out" ] && ln -sfn "$_wf_out" "$RUN_DIR/slurm${_wf_task}.out"
  [ -n "${_wf_err:-}" ] && [ "$_wf_err" != "${_wf_out:-}" ] && [ -e "$_wf_err" ] && ln -sfn "$_wf_err" "$RUN_DIR/slurm${_wf_task}.err"
fi
_wf_python_is="$(command -v "$PYTHON" || true)"
if [ ${#_wf_cexec[@]} -gt 0 ]; then _wf_container_check; _wf_python_is="$_wf_python_is (in the container)"; fi
{
  echo "job ${SLURM_JOB_NAME:-local} ${SLURM_JOB_ID:-} on $(hostname -s) at $(date -Is)"
  echo "nodes=${SLURM_JOB_NUM_NODES:-1} ntasks=${SLURM_NTASKS:-1} cpus_per_task=${SLURM_CPUS_PER_TASK:-} gpu_vendor=$GPU_VENDOR device=$DEVICE job_gpus=${SLURM_JOB_GPUS:--}${CONTAINER_EXEC:+ container=yes}"
  echo "data=$DATASET_DIR run_dir=$RUN_DIR python=$_wf_python_is"
} | tee "$RUN_DIR/job${_wf_task}.txt"

# --- launching -----------------------------------------------------------------
# launch [srun options...] -- command [args...]
# Inside a Slurm job: srun with those options. Outside (a laptop): runs the command once.
# WELLFNO_PROBE=DIR (tests): instead of the program, each task writes what it was given
# (devices, CPUs, environment, command line) to DIR/<step>-<rank>.json (slurm/ci/probe_task.py).
_wf_probe=()
if [ -n "${WELLFNO_PROBE:-}" ]; then
  mkdir -p "$WELLFNO_PROBE"
  _wf_probe=("$PYTHON" "$WELLFNO_ROOT/slurm/ci/probe_task.py")
fi
launch() {
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  _wf_run "${opts[@]}" -- "${_wf_cexec[@]}" "${_wf_probe[@]}" "$@"
}
# in_container command [args...]: a command of the batch shell itself (no srun), in the
# container when there is one, e.g. a summary that needs the course's python packages.
in_container() {
  "${_wf_cexec[@]}" "$@"
}
# launch_gpu: launch with one GPU per task on GPU sites, plain launch on CPU sites.
# A GPU site's job that was submitted without GPUs stops here with the command that works.
_wf_need_gpu() {
  if [ "$GPU_VENDOR" != none ] && [ -n "${SLURM_JOB_ID:-}" ] \
     && [ -z "${SLURM_JOB_GPUS:-}${SLURM_GPUS_ON_NODE:-}${CUDA_VISIBLE_DEVICES:-}${ROCR_VISIBLE_DEVICES:-}" ]; then
    wf_die "GPU_VENDOR=$GPU_VENDOR but job ${SLURM_JOB_ID} has no GPU; submit it with slurm/submit_all.sh ${SLURM_JOB_NAME:-STEP} (it asks for one GPU per task and CPUS_PER_GPU cores each)"
  fi
}
launch_gpu() {
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  _wf_need_gpu
  _wf_run "${GPU_SRUN_FLAGS[@]}" "${opts[@]}" -- "${GPU_WRAP[@]}" "${_wf_cexec[@]}" "${_wf_probe[@]}" "$@"
}
# launch_ddp [srun options...] -- command: data-parallel training, one task per GPU, every task
# seeing all the job's GPUs on its node. Per-task binding (--gpus-per-task, --gpu-bind=per_task
# or closest) would hide a node's other GPUs from each rank, and NCCL/RCCL then cannot open
# peer-to-peer (CUDA/HIP IPC) between the ranks' GPUs and falls back to copies through host
# memory (NVIDIA/nccl#1066; https://support.schedmd.com/show_bug.cgi?id=17793). Sources and
# the choice: slurm/README.md, "GPU binding". A job submitted with --gpus-per-task exports
# SLURM_GPUS_PER_TASK, which srun would apply again (measured on Slurm 22.05): not here.
# GPU_BIND (site.env) is for launch_gpu's steps only. On CPU sites: plain launch.
launch_ddp() {
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  if [ "$GPU_VENDOR" = none ]; then
    launch "${opts[@]}" -- "$@"
    return
  fi
  _wf_need_gpu
  local per_node=()
  [ -n "${SLURM_GPUS_ON_NODE:-}" ] && per_node=(--gpus-per-node="${GPU_TYPE:+$GPU_TYPE:}$SLURM_GPUS_ON_NODE")
  ( unset SLURM_GPUS_PER_TASK SLURM_GPU_BIND
    _wf_run "${per_node[@]}" "${opts[@]}" -- "${GPU_WRAP[@]}" "${_wf_cexec[@]}" "${_wf_probe[@]}" "$@" )
}
# launch_torchrun [srun options...] -- script.py [args...]
# One torchrun per node (srun --ntasks-per-node=1), SLURM_NTASKS_PER_NODE workers
# each, rendezvous at the job's first node. The workers get RANK/WORLD_SIZE/
# LOCAL_RANK from torchrun; the SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID of the
# single srun task are removed so a program that also reads those cannot mistake
# every worker for rank 0 of 1.
launch_torchrun() {
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  local nnodes="${SLURM_JOB_NUM_NODES:-1}"
  local nproc="${SLURM_NTASKS_PER_NODE:-}"
  nproc="${nproc%%(*}"                                   # "2(x2)" -> "2"
  [ -n "$nproc" ] || nproc=$(( ${SLURM_NTASKS:-1} / nnodes ))
  local cpt=$(( ${SLURM_CPUS_PER_TASK:-1} * nproc ))
  local master port
  if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    master="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
  else
    master=localhost
  fi
  # the last of the job's 7 ports (wellfno/launch.py master_port_from_slurm: steps 0-5 take the
  # others), below the kernel's ephemeral ports (32768 on), which another connection may hold
  port=$(( 20000 + (7 * ${SLURM_JOB_ID:-$$} + 6) % 12000 ))
  echo "torchrun: nnodes=$nnodes nproc_per_node=$nproc rendezvous=$master:$port" >&2
  launch --ntasks="$nnodes" --ntasks-per-node=1 --cpus-per-task="$cpt" "${opts[@]}" -- \
    env -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID -u SLURM_NPROCS \
    OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}" \
    "$PYTHON" -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node="$nproc" \
      --rdzv-backend=c10d --rdzv-endpoint="$master:$port" --rdzv-id="${SLURM_JOB_ID:-local}" \
      "$@"
}

# requeue_on_time_limit: with `#SBATCH --signal=B:USR1@<seconds>` and
# `#SBATCH --requeue`, requeue this job when Slurm signals the coming time limit;
# the requeued job keeps its id, so it finds RUN_DIR and its checkpoint again.
# Run the program with `run_requeueable command...` so the batch shell can act.
requeue_on_time_limit() {
  trap '_wf_requeue' USR1
}
_wf_requeue() {
  echo "time limit near: requeueing job ${SLURM_JOB_ID:-?} to continue from $RUN_DIR" >&2
  [ -n "${SLURM_JOB_ID:-}" ] && scontrol requeue "$SLURM_JOB_ID"
}
run_requeueable() {
  "$@" &
  local pid=$! rc=0
  while :; do
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break     # wait was only interrupted by the signal
  done
  return "$rc"
}

# need_file PATH: stop with one line if a program of the course is not there (yet).
need_file() {
  [ -f "$WELLFNO_ROOT/$1" ] || wf_die "$1 not found in $WELLFNO_ROOT; update your checkout of the course"
}
# need_dataset: stop with one line if DATASET_DIR has no data.
need_dataset() {
  [ -d "$DATASET_DIR/data" ] || wf_die "no dataset at $DATASET_DIR; run slurm/00_baseline.sbatch first (it generates $DATASET) or set WELL_DATA/DATASET in slurm/site.env"
}
