#!/usr/bin/env bash
# Per-task GPU selection, run by srun in front of the program on GPU sites:
#     srun --gpus-per-task=1 --gpu-bind=closest bash slurm/gpu_select.sh python fno.py ...
# Slurm usually already leaves one GPU per task visible; where a site hands every
# task all of the node's GPUs, pick the SLURM_LOCALID-th one. Then exec the program.
set -euo pipefail
pick() {  # pick "0,1,2,3" localid -> the localid-th entry (wrapping around)
  local IFS=, list=($1); echo "${list[$(( $2 % ${#list[@]} ))]}"
}
lid="${SLURM_LOCALID:-0}"
case "${GPU_VENDOR:-none}" in
  nvidia)
    if [[ "${CUDA_VISIBLE_DEVICES:-}" == *,* ]]; then
      export CUDA_VISIBLE_DEVICES="$(pick "$CUDA_VISIBLE_DEVICES" "$lid")"
    fi ;;
  amd)
    # ROCR_VISIBLE_DEVICES selects among physical GPUs; HIP/CUDA_VISIBLE_DEVICES
    # then index what ROCR left visible, so after narrowing ROCR they must be 0.
    if [[ "${ROCR_VISIBLE_DEVICES:-}" == *,* ]]; then
      export ROCR_VISIBLE_DEVICES="$(pick "$ROCR_VISIBLE_DEVICES" "$lid")"
    elif [ -z "${ROCR_VISIBLE_DEVICES:-}" ] && [ -n "${SLURM_GPUS_PER_NODE:-}${GPUS_PER_NODE:-}" ]; then
      export ROCR_VISIBLE_DEVICES="$lid"
    fi
    export HIP_VISIBLE_DEVICES=0
    unset CUDA_VISIBLE_DEVICES ;;
esac
exec "$@"
