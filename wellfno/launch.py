"""Who am I in a parallel launch? Rank, world size, local rank and rendezvous from torchrun or srun.

One module for every script that can run as many processes (exercise 04's statistics, the
data-parallel training of exercise 05, the affinity tools):

    env = launch_environment()      # LaunchEnv(rank=3, world_size=8, local_rank=3, ...)
    if env.world_size > 1:
        env.export_rendezvous()     # MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for init_method="env://"

Rules, and why:
- torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) win: torchrun may itself run
  under srun, and then SLURM_PROCID counts torchrun agents, not ranks.
- srun is recognised by SLURM_STEP_NUM_TASKS, which only srun sets. A batch script's own shell
  also has SLURM_PROCID=0 and SLURM_NTASKS=N; taking those would make a plain `python fno.py` in an
  sbatch script wait forever for N-1 ranks that were never started.
- An incomplete or inconsistent environment (RANK without WORLD_SIZE, rank >= world size, a
  non-integer) is a one-line UserError, never a hang.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from wellfno.cli import UserError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None  # ranks on this node; None where the launcher does not say
    launcher: str                 # "torchrun", "srun" or "single process"
    node_rank: int = 0
    # GPUs Slurm allocated on this node (SLURM_GPUS_ON_NODE), if it says. Not SLURM_STEP_GPUS: under
    # --gpus-per-task and --gpu-bind=closest Slurm sets that per task, to the task's own GPUs.
    step_gpus: int | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def export_rendezvous(self, env: MutableMapping[str, str] | None = None) -> None:
        """Set what torch.distributed's env:// rendezvous reads (torchrun has set them already)."""
        env = os.environ if env is None else env
        if self.launcher == "srun":
            env.setdefault("MASTER_ADDR", master_address_from_slurm(env))
            env.setdefault("MASTER_PORT", str(master_port_from_slurm(env)))
        else:
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", "29500")
        env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = map(str, (self.rank, self.world_size, self.local_rank))
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = env[name]
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{name}={value!r} is not an integer: check how the job was launched") from None
    if number < minimum:
        raise UserError(f"{name}={number} must be at least {minimum}: check how the job was launched")
    return number


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed per-node task counts: '4(x2),3' -> [4, 4, 3]."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise UserError(f"cannot read the task counts {spec!r} from Slurm")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def launch_environment(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """This process's place in the launch; a lone process is rank 0 of 1."""
    env = os.environ if env is None else env
    present = [name for name in ("RANK", "WORLD_SIZE") if env.get(name, "") != ""]
    if present:
        if len(present) == 1:
            missing = "WORLD_SIZE" if present == ["RANK"] else "RANK"
            raise UserError(f"{present[0]} is set but {missing} is not: launch with torchrun or srun, "
                            f"or unset {present[0]} to run as one process")
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", minimum=1)
        local_rank = _int(env, "LOCAL_RANK") if env.get("LOCAL_RANK", "") != "" else (rank if world == 1 else 0)
        if env.get("LOCAL_RANK", "") == "" and world > 1:
            raise UserError("RANK and WORLD_SIZE are set but LOCAL_RANK is not: launch with torchrun, "
                            "or set LOCAL_RANK (the rank's index on its node)")
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE", "") != "" else None
        launcher, node_rank = "torchrun", _int(env, "GROUP_RANK") if env.get("GROUP_RANK", "") else 0
        step_gpus = None
    elif env.get("SLURM_STEP_NUM_TASKS", "") != "" and env.get("SLURM_PROCID", "") != "":
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", minimum=1)
        local_rank = _int(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID", "") != "" else 0
        node_rank = _int(env, "SLURM_NODEID") if env.get("SLURM_NODEID", "") != "" else 0
        local_world = None
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        if spec:
            counts = tasks_per_node(spec)
            local_world = counts[node_rank] if node_rank < len(counts) else counts[0]
        launcher = "srun"
        step_gpus = _int(env, "SLURM_GPUS_ON_NODE") if env.get("SLURM_GPUS_ON_NODE", "") else None
    else:
        return LaunchEnv(0, 1, 0, 1, "single process")
    if rank >= world:
        raise UserError(f"rank {rank} but world size {world}: the launcher's variables disagree")
    if local_world is not None and local_rank >= local_world:
        raise UserError(f"local rank {local_rank} but {local_world} ranks on this node: "
                        f"the launcher's variables disagree")
    return LaunchEnv(rank, world, local_rank, local_world, launcher, node_rank, step_gpus)


# --------------------------------------------------------------------------- Slurm rendezvous
def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: 'gpu[07-09,12],cpu1' -> 'gpu07'; 'r[1-2]-n[04-05]' -> 'r1-n04'."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first entry ends at the first comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    # in every bracket group keep the first range's start
    return re.sub(r"\[([^\]\-,]+)[^\]]*\]", r"\1", nodelist[:end])


def master_address_from_slurm(env: Mapping[str, str] | None = None) -> str:
    """The step's first node hosts the rendezvous (scontrol's expansion, else our parser)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise UserError("srun started this task but SLURM_JOB_NODELIST is not set: launch with srun inside a job")
    if shutil.which("scontrol"):
        try:
            hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                   text=True, timeout=30, check=True).stdout.split()
            if hosts:
                return hosts[0]
        except (subprocess.SubprocessError, OSError):
            pass  # fall back to parsing the list ourselves
    return first_host(nodelist)


def master_port_from_slurm(env: Mapping[str, str] | None = None) -> int:
    """One port per job step, so two jobs (or two steps of one job) sharing a node do not meet."""
    env = os.environ if env is None else env
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    step = int(env.get("SLURM_STEP_ID", "0") or 0) if str(env.get("SLURM_STEP_ID", "0")).isdigit() else 0
    return 20000 + (job * 7 + step) % 20000
