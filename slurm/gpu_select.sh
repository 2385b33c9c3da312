#!/usr/bin/env bash
# Per-task GPU plumbing, run by srun in front of the program on GPU sites (slurm/common.sh's
# launch_gpu and launch_ddp):
#     srun --gpus-per-task=1 bash slurm/gpu_select.sh python fno.py ...     one GPU per task
#     srun --gpus-per-node=N bash slurm/gpu_select.sh python fno.py ...     all N, DDP (05)
# Which of the visible GPUs a program drives is wellfno.device.gpu_index_for's rule.
# It never guesses a device:
#  - Whatever Slurm set (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) is
#    kept. HIP honours CUDA_VISIBLE_DEVICES too, so it is never unset.
#  - AMD only: when Slurm set CUDA_ or HIP_VISIBLE_DEVICES to the SAME physical ids as
#    ROCR_VISIBLE_DEVICES (what a gres.conf without Flags=amd_gpu_env does: `man gres.conf`,
#    Flags), HIP would apply those ids a second time to the GPUs ROCR already left visible,
#    and a task given GPU 3 would see none. They are rewritten to 0..n-1: the same GPUs.
#  - Only when Slurm set none of them AND the site asked for it (GPU_SELECT_BY_LOCALID=1 in
#    slurm/site.env) does the task use the GPU numbered like its SLURM_LOCALID.
# On AMD it also creates the node-local cache folders that slurm/common.sh points MIOpen
# and rocFFT at. Then it runs the program.
set -euo pipefail

note() { echo "gpu_select: $*" >&2; }
lid="${SLURM_LOCALID:-0}"
vendor="${GPU_VENDOR:-none}"

if [ "$vendor" = amd ] && [ -n "${ROCR_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a _rocr <<< "$ROCR_VISIBLE_DEVICES"
  positions="$(seq -s, 0 $(( ${#_rocr[@]} - 1 )))"
  for var in CUDA_VISIBLE_DEVICES HIP_VISIBLE_DEVICES; do
    if [ "${!var:-}" = "$ROCR_VISIBLE_DEVICES" ] && [ "$ROCR_VISIBLE_DEVICES" != "$positions" ]; then
      export "$var=$positions"
    fi
  done
fi

if [ -z "${CUDA_VISIBLE_DEVICES:-}${ROCR_VISIBLE_DEVICES:-}${HIP_VISIBLE_DEVICES:-}" ] && [ "$vendor" != none ]; then
  if [ "${GPU_SELECT_BY_LOCALID:-0}" = 1 ]; then
    case "$vendor" in
      nvidia) export CUDA_VISIBLE_DEVICES="$lid" ;;
      amd)    export ROCR_VISIBLE_DEVICES="$lid" ;;
    esac
  elif [ "$lid" = 0 ]; then
    note "Slurm set no CUDA_/ROCR_VISIBLE_DEVICES: every task sees all GPUs of the node (each uses its local rank's; GPU_SELECT_BY_LOCALID=1 in slurm/site.env narrows it)"
  fi
fi

if [ "$vendor" = amd ]; then
  [ -n "${MIOPEN_USER_DB_PATH:-}" ] && mkdir -p "$MIOPEN_USER_DB_PATH"
  [ -n "${MIOPEN_CUSTOM_CACHE_DIR:-}" ] && mkdir -p "$MIOPEN_CUSTOM_CACHE_DIR"
  [ -n "${ROCFFT_RTC_CACHE_PATH:-}" ] && mkdir -p "$(dirname "$ROCFFT_RTC_CACHE_PATH")"
fi
exec "$@"
