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
- The launch is decided once, from what the launcher set. `export_rendezvous` then writes RANK,
  WORLD_SIZE and LOCAL_RANK for torch's env:// rendezvous; read again, those would turn an srun
  task into a torchrun worker, losing what only srun says (each task sees its own GPUs under
  --gpus-per-task=1 and --gpu-bind=closest, Slurm bound its CPUs). So every later
  `launch_environment()` of the process returns the decision export_rendezvous was given, for
  as long as the launch variables are as it left them (affinity.bind's GPU and CPUs, the
  placement report, the profiler's rank all agree with the rank's choice at start-up).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from wellfno.cli import UserError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# Every variable launch_environment reads: the decision is a function of these alone.
LAUNCH_VARS = TORCHRUN_VARS + ("GROUP_RANK", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",
                               "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
                               "SLURM_TASKS_PER_NODE", "SLURM_GPUS_ON_NODE")


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
            where = "MASTER_ADDR in the environment"
            if env.get("MASTER_ADDR", "") == "":
                nodelist = slurm_nodelist(env)
                env["MASTER_ADDR"] = master_address_from_slurm(env)
                where = f"the first node of {nodelist}"
            env.setdefault("MASTER_PORT", str(master_port_from_slurm(env)))
            # An unresolvable host would make every rank retry until the timeout, then fail with
            # torch's "cannot be retrieved (gai error)": say which host, at once.
            check_resolvable(env["MASTER_ADDR"], where)
        else:
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", "29500")
        env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = map(str, (self.rank, self.world_size, self.local_rank))
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        if env is os.environ:  # this process's: later readers get this decision, not a re-read
            global _exported
            _exported = (self, _launch_variables(env))


# The launch export_rendezvous was given, and the launch variables as it left os.environ
# (launch_environment returns it while they stay so; the module docstring says why).
_exported: tuple[LaunchEnv, dict[str, str | None]] | None = None


def _launch_variables(env: Mapping[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in LAUNCH_VARS}


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
    if env is os.environ and _exported is not None and _exported[1] == _launch_variables(env):
        return _exported[0]  # what the launcher set, before export_rendezvous rewrote RANK...
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
# The rank-0 host and port every rank of an srun step meets at (torch's env:// rendezvous: rank 0
# listens on MASTER_PORT, the others connect to MASTER_ADDR:MASTER_PORT). Under torchrun, torchrun's
# own rendezvous sets them (slurm/common.sh launch_torchrun: --rdzv-endpoint on the first node).

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


def slurm_nodelist(env: Mapping[str, str]) -> str:
    """'SLURM_STEP_NODELIST=n[1-2]': the step's nodes (srun), else the job's, as Slurm has them."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return f"{name}={env[name]}"
    raise UserError("srun started this task but SLURM_JOB_NODELIST is not set: "
                    "launch with srun inside a job")


def master_address_from_slurm(env: Mapping[str, str] | None = None) -> str:
    """The step's first node hosts the rendezvous (scontrol's expansion, else our parser)."""
    env = os.environ if env is None else env
    nodelist = slurm_nodelist(env).split("=", 1)[1]
    if shutil.which("scontrol"):
        try:
            hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                                   text=True, timeout=30, check=True).stdout.split()
            if hosts:
                return hosts[0]
        except (subprocess.SubprocessError, OSError):
            pass  # fall back to parsing the list ourselves
    return first_host(nodelist)


def check_resolvable(host: str, where: str) -> None:
    """A UserError naming `host` when this node cannot resolve it (nor could the other ranks)."""
    try:
        socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UserError(f"the rendezvous host {host!r} ({where}) does not resolve on this node "
                        f"({reason}): the ranks cannot meet there; check the node's name "
                        f"resolution (getent hosts {host}) or set MASTER_ADDR to an address every "
                        f"node reaches") from None


def master_port_from_slurm(env: Mapping[str, str] | None = None) -> int:
    """One port per job step, so two jobs (or two steps of one job) sharing a node do not meet.

    Consecutive steps of a job get consecutive ports (a step never reuses the port of the one
    that just ended, whose socket may linger in TIME_WAIT), and jobs 1 apart are 7 ports apart.
    All below 32768, where Linux's ephemeral ports begin (net.ipv4.ip_local_port_range, 32768-60999
    by default: https://docs.kernel.org/networking/ip-sysctl.html): any outgoing connection on
    the node (gloo's between ranks, srun's) may hold one of those, and rank 0's store then fails
    with EADDRINUSE (seen on the test cluster with ports up to 39999).
    """
    env = os.environ if env is None else env
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    step = int(env.get("SLURM_STEP_ID", "0") or 0) if str(env.get("SLURM_STEP_ID", "0")).isdigit() else 0
    return FIRST_PORT + (job * 7 + step) % PORTS


# The rendezvous ports of Slurm steps: 20000-31999 (master_port_from_slurm; slurm/common.sh
# computes torchrun's the same way)
FIRST_PORT, PORTS = 20000, 12000


# --------------------------------------------------------------------------- rendezvous check
def check_rendezvous(timeout: float = 60.0) -> int:
    """Join every rank of this launch (gloo), and have rank 0 print where each rank runs.

        srun -N 2 --ntasks-per-node 2 python -m wellfno.launch      # inside an allocation
        torchrun --nnodes 2 --nproc-per-node 2 ... -m wellfno.launch

    The first thing to run on new nodes: it shows the rendezvous (host:port), the world, and
    the ranks by node, and fails in one line when the ranks cannot meet within `timeout` s.
    """
    import datetime

    import torch.distributed as dist

    env = launch_environment()
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID", "-")
    if not env.is_distributed:
        print(f"rendezvous: one process on {node}: nothing to meet (start it with srun or "
              f"torchrun)")
        return 0
    env.export_rendezvous()
    endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        everyone: list = [None] * env.world_size
        dist.all_gather_object(everyone, (env.rank, env.local_rank, node, job, endpoint))
    except Exception as err:  # noqa: BLE001 - a rank that never arrived, a closed port
        raise UserError(f"rank {env.rank} on {node} cannot meet the other ranks at {endpoint} "
                        f"within {timeout:.0f} s ({err.__class__.__name__}: "
                        f"{(str(err).splitlines() or [''])[0][:200]})") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    jobs = {j for _, _, _, j, _ in everyone}
    if jobs != {job}:
        raise UserError(f"rank {env.rank} met ranks of other jobs {sorted(jobs - {job})} at "
                        f"{endpoint}")
    if env.rank == 0:
        by_node: dict[str, list[str]] = {}
        for rank, local_rank, where, _, _ in everyone:
            by_node.setdefault(where, []).append(f"{rank}(local {local_rank})")
        nodes = "; ".join(f"{n}: ranks {', '.join(r)}" for n, r in by_node.items())
        print(f"rendezvous {endpoint} ({env.launcher}, job {job}): {env.world_size} ranks met on "
              f"{len(by_node)} node(s): {nodes}", flush=True)
    return 0


if __name__ == "__main__":
    import argparse

    from wellfno.cli import run_main

    parser = argparse.ArgumentParser(description="Check that the ranks of this launch meet: "
                                                 "rank 0 prints where each rank runs.")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for every rank")
    run_main(lambda: check_rendezvous(parser.parse_args().timeout))
