"""Test hook of the job scripts (WELLFNO_PROBE=DIR, see slurm/common.sh `launch`).

Run by srun in place of the program: records what this task was handed (its command line,
the CPUs it may run on, the GPU variables Slurm and slurm/gpu_select.sh set, threads, caches)
as DIR/<jobname>-<jobid>.<step>-<rank>.json, then exits 0 without running the program.
"""
import json
import os
import sys

KEYS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_PROCID",
        "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_STEP_ID", "SLURM_JOB_NAME",
        "OMP_NUM_THREADS", "GPU_VENDOR", "DEVICE", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR",
        "ROCFFT_RTC_CACHE_PATH", "RUN_DIR", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_GPUS_ON_NODE")


def main() -> int:
    out = os.environ["WELLFNO_PROBE"]
    env = os.environ
    record = {
        "argv": sys.argv[1:],
        "cpus": sorted(os.sched_getaffinity(0)),
        "env": {k: env[k] for k in KEYS if k in env},
        "dirs": {k: os.path.isdir(env[k]) for k in ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR") if k in env},
    }
    if "ROCFFT_RTC_CACHE_PATH" in env:
        record["dirs"]["ROCFFT_RTC_CACHE_PATH(parent)"] = os.path.isdir(os.path.dirname(env["ROCFFT_RTC_CACHE_PATH"]))
    name = (f"{env.get('SLURM_JOB_NAME', 'local')}-{env.get('SLURM_JOB_ID', os.getpid())}."
            f"{env.get('SLURM_STEP_ID', 'x')}-{env.get('SLURM_PROCID', '0')}.json")
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, os.path.join(out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
