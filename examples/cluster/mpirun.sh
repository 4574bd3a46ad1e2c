#!/bin/bash
# Open MPI starts the processes, rt.Ring() reads OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE. MPI says
# nothing about where the process group meets: MASTER_ADDR (rank 0's host: with Open MPI's default mapping by slot,
# the first host; here by default this one) and MASTER_PORT, given to every rank with -x. Run from the repository's
# root; arguments go to train.py:
#
#   examples/cluster/mpirun.sh --out runs/cluster                                   # NP=2 processes here
#   NP=8 MPIRUN_ARGS="-H node1:4,node2:4" MASTER_ADDR=node1 examples/cluster/mpirun.sh --out /shared/runs/cluster
#   sbatch --nodes=2 --ntasks-per-node=4 examples/cluster/mpirun.sh --out /shared/runs/cluster   # in an allocation
#
# Inside an allocation mpirun finds the nodes itself, NP is the job's task count, and the batch script runs on the
# first node: rank 0's. As root Open MPI wants MPIRUN_ARGS="--allow-run-as-root"; more processes than cores,
# "--oversubscribe".
#SBATCH --job-name=ringtrain-mpirun
#SBATCH --time=00:30:00
set -euo pipefail
export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}
export MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of flags
exec mpirun -np "${NP:-${SLURM_NTASKS:-2}}" ${MPIRUN_ARGS:-} -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS -x PATH \
    python examples/cluster/train.py "$@"
