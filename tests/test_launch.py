"""wellfno.launch and wellfno.device: every launcher's variables, and bad ones, without a cluster."""
import re
import subprocess

import pytest
import torch

from tests.conftest import REPO
from wellfno import device as devmod
from wellfno.cli import UserError
from wellfno.launch import LaunchEnv, first_host, launch_environment, master_port_from_slurm, tasks_per_node


def test_lone_process_is_rank_0_of_1():
    assert launch_environment({}) == LaunchEnv(0, 1, 0, 1, "single process")


def test_torchrun_variables():
    env = launch_environment({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                              "GROUP_RANK": "1"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (5, 8, 1, 4, 1)
    assert env.launcher == "torchrun" and env.is_distributed


def test_torchrun_wins_over_srun_it_runs_under():
    env = launch_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
                              "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})
    assert (env.rank, env.launcher) == (3, "torchrun")


def test_srun_variables_with_uneven_nodes():
    env = launch_environment({"SLURM_PROCID": "9", "SLURM_STEP_NUM_TASKS": "11", "SLURM_LOCALID": "1",
                              "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2),3"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (9, 11, 1, 3, 2)
    assert env.launcher == "srun" and env.step_gpus is None
    # the node's GPUs for the step come from SLURM_GPUS_ON_NODE; SLURM_STEP_GPUS is per task
    # under --gpus-per-task and --gpu-bind=closest (MEASURED below)
    env = launch_environment({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
                              "SLURM_STEP_GPUS": "1", "SLURM_GPUS_ON_NODE": "4"})
    assert env.step_gpus == 4


def test_batch_shell_is_not_a_rank():
    # sbatch --ntasks=4 sets SLURM_PROCID=0 and SLURM_NTASKS=4 in the batch shell itself; only srun
    # sets SLURM_STEP_NUM_TASKS. A plain `python fno.py` there must run alone, not wait for 3 peers.
    env = launch_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"})
    assert env.world_size == 1 and env.launcher == "single process"


@pytest.mark.parametrize("env, words", [
    ({"RANK": "0"}, "WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "RANK is not"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "rank 2 but world size 2"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "at least 1"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "LOCAL_RANK is not"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "local rank 2"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2(y)"}, "task counts"),
])
def test_bad_launch_environment_is_one_line(env, words):
    with pytest.raises(UserError, match=words) as info:
        launch_environment(env)
    assert "\n" not in str(info.value)


def test_export_rendezvous_for_srun():
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "42",
           "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost"}
    launch = launch_environment(env)
    launch.export_rendezvous(env)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_PORT"] == str(master_port_from_slurm(env))
    assert 20000 <= int(env["MASTER_PORT"]) < 32000
    assert env["MASTER_ADDR"]  # scontrol's first host where it exists, else our parser's


def test_the_launch_outlives_export_rendezvous_while_its_variables_stand(monkeypatch):
    """export_rendezvous writes torchrun's variables for torch's env:// rendezvous; the process's
    launch stays what srun set (per-task GPUs: wellfno.device's srun rules) until someone
    changes the launch variables, after which they are read again."""
    import os

    from wellfno import launch as launch_module

    monkeypatch.setattr(launch_module, "_exported", None, raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # recorded, so that teardown removes what export wrote
        monkeypatch.delenv(name)
    srun = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1",
            "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_ID": "42",
            "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost"}
    for name, value in srun.items():
        monkeypatch.setenv(name, value)
    decided = launch_environment()
    assert decided == LaunchEnv(1, 2, 1, 2, "srun", 0, 2)
    launch_environment(dict(srun)).export_rendezvous(dict(srun))  # not this process's: no effect
    decided.export_rendezvous()
    assert os.environ["RANK"] == "1" and launch_environment() is decided
    assert launch_environment(dict(os.environ)).launcher == "torchrun"  # what a re-read would say
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launch_environment() == LaunchEnv(1, 2, 0, 2, "torchrun")


def test_every_variable_the_launch_reads_is_a_launch_variable():
    """launch_environment keeps its decision while LAUNCH_VARS stand: it may read nothing else."""
    import ast
    import inspect

    from wellfno import launch as launch_module

    tree = ast.parse(inspect.getsource(launch_module.launch_environment))
    names = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and re.fullmatch(r"[A-Z][A-Z_]+", node.value)}
    assert {"RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_GPUS_ON_NODE"} <= names
    assert names <= set(launch_module.LAUNCH_VARS), names - set(launch_module.LAUNCH_VARS)


def test_export_rendezvous_names_a_host_that_does_not_resolve():
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "42",
           "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "nosuchnode[7-8]"}
    words = (r"'nosuchnode7' \(the first node of SLURM_STEP_NODELIST=nosuchnode\[7-8\]\) "
             r"does not resolve")
    with pytest.raises(UserError, match=words) as info:
        launch_environment(env).export_rendezvous(env)
    assert "\n" not in str(info.value)


def test_ports_differ_between_steps_and_jobs():
    ports = {master_port_from_slurm({"SLURM_JOB_ID": str(j), "SLURM_STEP_ID": str(s)}) for j in (1, 2) for s in (0, 1)}
    assert len(ports) == 4


def test_no_rendezvous_port_is_an_ephemeral_one_of_this_kernel():
    """A port in the kernel's ephemeral range may be held by any outgoing connection (gloo's,
    srun's): rank 0's TCPStore then fails with EADDRINUSE. Job 1944's first step got 33608 from
    the old formula and failed so on the test cluster. Checked against this machine's range;
    the torchrun port of slurm/common.sh (7 x job + 6) too."""
    from pathlib import Path

    setting = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not setting.exists():
        pytest.skip("not Linux: no /proc/sys/net/ipv4/ip_local_port_range")
    low, high = map(int, setting.read_text().split())
    steps = [master_port_from_slurm({"SLURM_JOB_ID": str(j), "SLURM_STEP_ID": str(s)})
             for j in range(0, 30000, 7) for s in range(6)]
    # slurm/common.sh's torchrun port, its own arithmetic evaluated by bash for every job id
    (expression,) = re.findall(r"^\s*port=\$\(\((.*)\)\)\s*$",
                               (REPO / "slurm" / "common.sh").read_text(), re.M)
    loop = f"for SLURM_JOB_ID in $(seq 0 29999); do echo $(({expression})); done"
    torchrun = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, check=True)
    ports = steps + [int(p) for p in torchrun.stdout.split()]
    assert len(ports) == len(steps) + 30000
    inside = [p for p in ports if low <= p <= high]
    assert not inside, f"{len(inside)} rendezvous ports in the ephemeral range {low}-{high}"


def test_first_host_of_slurm_node_lists():
    assert first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert first_host("node001") == "node001"
    assert first_host("a1,b[2-3]") == "a1"
    assert first_host("r[1-2]-n[04-05]") == "r1-n04"
    assert first_host("nid[001234,001240-001250]") == "nid001234"


def test_tasks_per_node():
    assert tasks_per_node("4(x2),3") == [4, 4, 3]
    assert tasks_per_node("8") == [8]


# --------------------------------------------------------------------------- device and backend
# What Slurm 22.05 set for each task, measured on the test cluster (4 stand-in GPUs, 0,1 by core 0
# and 2,3 by core 1; two 1-CPU tasks on cores 0 and 1, `srun -n2 -c1 ...` in a --gpus-per-node=4
# job unless said); tests/test_slurm_gpus.py runs the real programs under the same modes.
# mode -> [(SLURM_STEP_GPUS, CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE) of task 0, of task 1]
MEASURED = {
    "--gpus-per-task=1": [("0", "0", "4"), ("1", "1", "4")],
    "--gpus-per-task=1 (no job)": [("0", "0", "2"), ("1", "1", "2")],        # srun makes the job
    "--gpus-per-node=4": [("0,1,2,3", "0,1,2,3", "4")] * 2,
    "--gpu-bind=closest": [("0,1", "0,1", "4"), ("2,3", "2,3", "4")],
    # a 2-GPU step whose GPUs both sit by core 0: "Bind request gpu:closest does not specify any
    # devices within the allocation for task 1. Binding to the first device" (slurmstepd)
    "--gpus-per-node=2 --gpu-bind=closest": [("0,1", "0,1", "2"), ("0", "0", "2")],
}


def srun_task(task: int, step_gpus: str, visible: str, on_node: str) -> dict:
    return {"SLURM_PROCID": str(task), "SLURM_LOCALID": str(task), "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_STEP_GPUS": step_gpus,
            "CUDA_VISIBLE_DEVICES": visible, "SLURM_GPUS_ON_NODE": on_node}


def node_gpu(env: dict) -> int:
    """The node GPU a task drives: gpu_index_for on what the task sees, then what that index is."""
    launch = launch_environment(env)
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    index = devmod.gpu_index_for(launch.local_rank, launch.local_world_size, len(visible),
                                 launch.step_gpus, launch.launcher)
    return int(visible[index])


@pytest.mark.parametrize("mode", [m for m in MEASURED if "--gpus-per-node=2" not in m])
def test_every_measured_slurm_mode_gives_each_rank_its_own_gpu(mode):
    gpus = [node_gpu(srun_task(t, *MEASURED[mode][t])) for t in range(2)]
    assert len(set(gpus)) == 2, (mode, gpus)
    if mode == "--gpu-bind=closest":
        assert gpus == [0, 3]   # task 1 (core 1) on a GPU by core 1


def test_a_binding_that_leaves_two_ranks_on_one_gpu_is_left_to_the_identity_check():
    # Both see GPU 0 among theirs: nothing in the variables says so; check_gpu_not_shared finds it.
    mode = MEASURED["--gpus-per-node=2 --gpu-bind=closest"]
    assert [node_gpu(srun_task(t, *mode[t])) for t in range(2)] == [0, 0]


def test_torchrun_workers_take_their_local_rank_and_never_share():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert node_gpu({**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == 1
    with pytest.raises(UserError, match="2 ranks on this node but only 1 GPUs visible"):
        node_gpu({**env, "CUDA_VISIBLE_DEVICES": "0"})   # torchrun never narrows: one GPU for two
    with pytest.raises(UserError, match="5 ranks on this node but only 4 GPUs"):
        devmod.gpu_index_for(1, 5, visible=4, launcher="torchrun")


def test_gpu_index_for_edges():
    assert devmod.gpu_index_for(0, 4, visible=8) == 0   # second node's local rank 0 -> its GPU 0
    with pytest.raises(UserError, match="sees no GPU"):
        devmod.gpu_index_for(0, 1, visible=0)
    # LUMI-G, srun --gpus-per-node=8 --gpu-bind=closest: each task sees its NUMA node's 2 GCDs
    assert [devmod.gpu_index_for(r, 8, visible=2, step_gpus=8) for r in range(8)] == [0, 1] * 4
    with pytest.raises(UserError, match="8 ranks on this node but only 2 GPUs"):
        devmod.gpu_index_for(3, 8, visible=2, step_gpus=2)   # a 2-GPU allocation: oversubscribed
    with pytest.raises(UserError, match="8 ranks on this node but only 2 GPUs"):
        devmod.gpu_index_for(3, 8, visible=2)                # nothing says Slurm split the GPUs


class FakeGroup:
    """torch.distributed as check_gpu_not_shared sees it: this rank, and what every rank sent."""

    def __init__(self, rank, gathered):
        self.rank, self.gathered = rank, gathered

    def is_initialized(self):
        return True

    def get_world_size(self):
        return len(self.gathered)

    def get_rank(self):
        return self.rank

    def all_gather_object(self, out, mine):
        assert mine == self.gathered[self.rank]
        out[:] = self.gathered


def test_two_ranks_on_one_physical_gpu_stop_with_one_line(monkeypatch):
    import torch.distributed as dist
    from types import SimpleNamespace

    pci = {0: (0, 0x07, 0), 1: (0, 0x0F, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(
        uuid="", pci_domain_id=pci[i][0], pci_bus_id=pci[i][1], pci_device_id=pci[i][2]))
    monkeypatch.setattr(devmod.socket, "gethostname", lambda: "n1")
    shared = [("n1", "0000:07:00.0"), ("n2", "0000:07:00.0"), ("n1", "0000:07:00.0")]
    for name in ("is_initialized", "get_world_size", "get_rank", "all_gather_object"):
        monkeypatch.setattr(dist, name, getattr(FakeGroup(0, shared), name))
    with pytest.raises(UserError) as err:
        devmod.check_gpu_not_shared(torch.device("cuda", 0))
    assert str(err.value).startswith("ranks 0 and 2 both drive GPU 0000:07:00.0 on n1: give each "
                                     "rank its own GPU with srun --ntasks-per-node=N")
    for name in ("get_rank", "all_gather_object"):   # the other ranks exit 2 without a word
        monkeypatch.setattr(dist, name, getattr(FakeGroup(2, shared), name))
    with pytest.raises(SystemExit) as stop:
        devmod.check_gpu_not_shared(torch.device("cuda", 0))
    assert stop.value.code == 2
    # same bus address on two nodes, or two GPUs of one node: nothing to say
    for gathered in ([("n1", "0000:07:00.0"), ("n2", "0000:07:00.0")],
                     [("n1", "0000:07:00.0"), ("n1", "0000:0f:00.0")]):
        for name in ("get_world_size", "get_rank", "all_gather_object"):
            monkeypatch.setattr(dist, name, getattr(FakeGroup(0, gathered), name))
        devmod.check_gpu_not_shared(torch.device("cuda", 0))
    devmod.check_gpu_not_shared(torch.device("cpu"))   # gloo on CPUs: no GPU to share


def test_auto_backend_on_cpu_is_gloo():
    assert devmod.pick_backend("auto", 0) == ("gloo", torch.device("cpu"))


def test_statistics_stay_on_gloo_even_with_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert devmod.pick_backend("auto", 100, 128, prefer_gpu=False)[0] == "gloo"
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert devmod.pick_backend("auto", 2, 4) == ("nccl", torch.device("cuda", 2)) and chosen == [2]


def test_nccl_without_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(UserError, match="needs a GPU"):
        devmod.pick_backend("nccl", 0)
    with pytest.raises(UserError, match="sees no GPU"):
        devmod.pick_device("cuda")
    assert devmod.pick_device("auto") == torch.device("cpu")


def test_only_wellfno_launch_reads_the_launchers_rank():
    """SLURM_PROCID (srun's rank) is read in one place, wellfno.launch, with its rules (torchrun
    under srun, a batch script's own shell): every other reader asks launch_environment()."""
    readers = []
    for folder in ("wellfno", "profiling", "affinity", "benchtools", "coursetools", "solutions",
                   "exercises"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path != REPO / "wellfno" / "launch.py" and "SLURM_PROCID" in path.read_text():
                readers.append(str(path.relative_to(REPO)))
    for script in ("fno.py", "stats.py"):
        if "SLURM_PROCID" in (REPO / script).read_text():
            readers.append(script)
    assert not readers, f"read the rank with wellfno.launch.launch_environment(): {readers}"

