"""Environment detection for every launcher, with patched variables (the one place mocks belong)."""

from __future__ import annotations

import pytest

from ringtrain import RingtrainError
from ringtrain.parallel import environments
from ringtrain.parallel.environments import detect


def test_single_process():
    env = detect({}, [])
    assert (env.name, env.rank, env.world_size, env.is_distributed) == ("single", 0, 1, False)


def test_torchrun():
    env = detect(
        {
            "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x",
        },
        [],
    )
    assert env.name == "torchelastic"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (3, 1, 4, 2, 1)
    assert (env.master_addr, env.master_port, env.init_method) == ("10.1.2.3", 1234, "env://")


def test_slurm_master_from_nodelist():
    env = detect(
        {
            "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "2",
            "SLURM_NODELIST": "gpu[003-006,9],cpu1", "SLURM_JOB_ID": "12345", "SLURM_TASKS_PER_NODE": "2(x4)",
            "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0",
        },
        [],
    )
    assert env.name == "slurm"
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.local_world_size) == (5, 1, 8, 2, 2)
    assert env.master_addr == "gpu003"
    assert env.master_port == 10000 + 12345 % 20000
    assert env.default_init_method() == "tcp://gpu003:22345"


def test_slurm_batch_shell_is_not_a_task():
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash"}, []).name == "single"


def test_openmpi():
    env = detect(
        {
            "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29400",
        },
        [],
    )
    assert env.name == "openmpi"
    assert (env.rank, env.local_rank, env.world_size, env.node_rank) == (2, 0, 4, 1)
    assert env.default_init_method() == "tcp://node0:29400"


def test_openmpi_node_rank_is_not_ompi_comm_world_node_rank():
    # What Open MPI 4.1's `mpirun -np 2` on one host gave rank 1 (tests/cluster/test_mpirun.py runs it for real):
    # OMPI_COMM_WORLD_NODE_RANK is a rank on the node, not the node's index.
    env = detect({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"}, [])
    assert (env.name, env.rank, env.local_rank, env.local_world_size, env.node_rank) == ("openmpi", 1, 1, 2, 0)


def test_mpich_pmi():
    env = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, [])
    assert (env.name, env.rank, env.world_size, env.local_rank) == ("mpich", 1, 2, 1)


def test_horovod_env():
    env = detect(
        {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
         "HOROVOD_CROSS_RANK": "0"},
        [],
    )
    assert (env.name, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("horovod", 1, 2, 1, 2)


@pytest.mark.parametrize("argv", [["--local_rank=1"], ["--local-rank=1"], ["--local_rank", "1"], ["x", "--local-rank", "1"]])
def test_legacy_local_rank_argument(argv):
    env = detect({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}, argv)
    assert (env.name, env.local_rank, env.rank, env.world_size) == ("legacy-launch", 1, 1, 2)


def test_detection_order_torchrun_beats_slurm_and_mpi():
    both = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
            "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert detect(both, []).name == "env"
    assert environments.DETECTION_ORDER[0] is environments.TorchElastic
    assert environments.DETECTION_ORDER[-1] is environments.Single


def test_slurm_beats_pmi():
    # `srun --mpi=pmi2`: each task has PMI_RANK as well, equal to its SLURM_PROCID
    env = detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "PMI_RANK": "1", "PMI_SIZE": "2"},
                 [])
    assert env.name == "slurm" and env.rank == 1


# What the batch shell of a real `sbatch -n2` had (tests/cluster/ submits it): no step id, SLURM_PROCID 0.
BATCH_SHELL = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
               "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "one_node.sbatch"}


def test_mpirun_inside_a_slurm_allocation_is_open_mpi():
    # Before: both ranks of `mpirun -np 2` in an sbatch script were Slurm's rank 0 (their shell's SLURM_PROCID).
    env = detect({**BATCH_SHELL, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                  "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, [])
    assert (env.name, env.rank, env.world_size) == ("openmpi", 1, 2)
    # on another node, under the daemon srun started there: its task's SLURM_PROCID is the node's index
    env = detect({**BATCH_SHELL, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "OMPI_COMM_WORLD_RANK": "3",
                  "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, [])
    assert (env.name, env.rank, env.node_rank) == ("openmpi", 3, 1)


def test_mpiexec_inside_a_slurm_allocation_is_mpich():
    env = detect({**BATCH_SHELL, "PMI_RANK": "1", "PMI_SIZE": "2"}, [])
    assert (env.name, env.rank) == ("mpich", 1)
    env = detect({**BATCH_SHELL, "SLURM_STEPID": "0", "SLURM_PROCID": "1", "PMI_RANK": "3", "PMI_SIZE": "4"}, [])
    assert (env.name, env.rank) == ("mpich", 3)


def test_python_in_a_batch_script_of_several_tasks_is_refused_naming_srun():
    with pytest.raises(RingtrainError, match=r"batch script itself, not as one of srun's tasks: it would be rank 0 "
                                             r"of 2 \(SLURM_NTASKS\)") as e:
        detect(BATCH_SHELL, [])
    assert "srun python train.py" in str(e.value)
    # one task: the batch shell is that task's one process
    env = detect({**BATCH_SHELL, "SLURM_NTASKS": "1"}, [])
    assert (env.name, env.rank, env.world_size) == ("slurm", 0, 1)


@pytest.mark.parametrize(
    "environ, needle",
    [
        ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "rank 2 of world size 2"),
        ({"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ],
)
def test_inconsistent_variables_are_clear_errors(environ, needle):
    with pytest.raises(RingtrainError, match="HINT") as info:
        detect(environ, [])
    assert needle in str(info.value)


# --- env:// by hand (seed 000: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and nothing else) -----

@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost", "::1"])
def test_env_by_hand_on_one_machine_infers_the_local_rank(addr):
    env = detect({"MASTER_ADDR": addr, "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3"}, [])
    assert env.name == "env-by-hand" and env.is_distributed  # never a silent job of one
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.init_method) == (3, 3, 4, 4, "env://")


def test_env_by_hand_across_machines_needs_local_rank():
    with pytest.raises(RingtrainError, match="LOCAL_RANK is not, and MASTER_ADDR=10.0.0.7 is another host") as info:
        detect({"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "RANK": "1"}, [])
    assert "set LOCAL_RANK" in info.value.hint
    with pytest.raises(RingtrainError, match="MASTER_ADDR and MASTER_PORT are"):
        detect({"WORLD_SIZE": "2", "RANK": "1"}, [])
    # with LOCAL_RANK it is torchrun's contract; with --local_rank in argv, the old launcher's
    assert detect({"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "1",
                   "LOCAL_RANK": "0"}, []).name == "env"
    assert detect({"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "1"},
                  ["--local_rank=0"]).name == "legacy-launch"
