"""wellfno.launch and wellfno.device: every launcher's variables, and bad ones, without a cluster."""
import pytest
import torch

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
    assert launch_environment({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_GPUS": "4,5"}).step_gpus == 2


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
    assert 20000 <= int(env["MASTER_PORT"]) < 40000
    assert env["MASTER_ADDR"]  # scontrol's first host where it exists, else our parser's


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
def test_gpu_index_for_each_slurm_mode():
    assert devmod.gpu_index_for(3, 4, visible=1) == 0   # --gpus-per-task=1: each task sees its own
    assert devmod.gpu_index_for(1, 2, visible=1, launcher="srun", step_gpus=2) == 0
    with pytest.raises(UserError, match="2 ranks on this node but only 1 GPUs"):   # torchrun never narrows
        devmod.gpu_index_for(1, 2, visible=1, launcher="torchrun")
    with pytest.raises(UserError, match="2 ranks on this node but only 1 GPUs"):   # srun, one GPU for the step
        devmod.gpu_index_for(1, 2, visible=1, launcher="srun", step_gpus=1)
    assert devmod.gpu_index_for(3, 4, visible=4) == 3   # all GPUs visible to every task
    assert devmod.gpu_index_for(0, 4, visible=8) == 0   # second node's local rank 0 -> its GPU 0
    with pytest.raises(UserError, match="5 ranks on this node but only 4 GPUs"):
        devmod.gpu_index_for(1, 5, visible=4)
    with pytest.raises(UserError, match="sees no GPU"):
        devmod.gpu_index_for(0, 1, visible=0)
    # srun --gpus-per-node=8 --gpu-bind=closest on LUMI-G: each task sees its NUMA node's 2 GCDs
    assert [devmod.gpu_index_for(r, 8, visible=2, step_gpus=8) for r in range(8)] == [0, 1] * 4
    with pytest.raises(UserError, match="8 ranks on this node but only 2 GPUs"):
        devmod.gpu_index_for(3, 8, visible=2, step_gpus=2)   # a 2-GPU step: oversubscribed, not closest
    with pytest.raises(UserError, match="8 ranks on this node but only 2 GPUs"):
        devmod.gpu_index_for(3, 8, visible=2)                # nothing says Slurm split the GPUs


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
