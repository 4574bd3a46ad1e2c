"""The API surface: Horovod's names, one process with no launcher, the ``horovod.torch`` alias, the example."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ringtrain.horovod as hvd
from ringtrain.comm import ReduceOp

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ALIAS = os.path.join(ROOT, "src", "ringtrain", "horovod", "_alias")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                 "PMI_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE")

# horovod/torch/__init__.py (0.28.1): every public name a Horovod script may use.
HOROVOD_TORCH_NAMES = """
elastic Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async grouped_allgather
grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_ alltoall alltoall_async
reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize
init shutdown is_initialized start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built
rocm_built ProcessSet global_process_set add_process_set remove_process_set Average Sum Adasum Min Max Product
DistributedOptimizer SyncBatchNorm
""".split()

SINGLE = r"""
import json, torch
import horovod.torch as hvd
assert hvd.DistributedOptimizer.__module__ == "ringtrain.horovod.optimizer", hvd.DistributedOptimizer.__module__
from horovod.torch.elastic import TorchState, ElasticSampler, run
before = hvd.is_initialized()
try:
    hvd.size()
    not_init = "no error"
except ValueError as e:
    not_init = str(e)
hvd.init()
x = torch.arange(6.).reshape(3, 2)
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.fp16)
model(x).sum().backward(); opt.step()
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
sampler = ElasticSampler(list(range(10)), shuffle=False)
sampler.record_batch(0, 4)
sampler.load_state_dict(sampler.state_dict())
out = {
    "before": before, "not_init": not_init, "initialized": hvd.is_initialized(),
    "topology": [hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank(), hvd.cross_size(), hvd.cross_rank()],
    "built": [hvd.mpi_built(), hvd.gloo_built(), hvd.nccl_built(), hvd.cuda_built(), hvd.rocm_built(),
              hvd.ddl_built(), hvd.ccl_built(), hvd.mpi_enabled(), hvd.gloo_enabled(), hvd.is_homogeneous()],
    "allreduce": hvd.allreduce(x, op=hvd.Average).tolist(),
    "scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist(),
    "allgather": hvd.allgather(x).tolist(),
    "broadcast": hvd.broadcast(x, 0).tolist(),
    "alltoall": hvd.alltoall(x).tolist(),
    "reducescatter": hvd.reducescatter(x).tolist(),
    "adasum": hvd.allreduce(x, op=hvd.Adasum).tolist(),
    "join": hvd.join(),
    "objects": [hvd.broadcast_object({"a": 1}), hvd.allgather_object(5)],
    "sampler": list(sampler),
    "version": __import__("horovod").__version__,
}
hvd.barrier()
hvd.shutdown()
out["after"] = hvd.is_initialized()
try:
    hvd.mpi_threads_supported()
except ValueError as e:
    out["mpi_threads"] = str(e)
print(json.dumps(out))
"""


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(extra)
    return env


def test_horovods_public_names_are_all_here():
    missing = [name for name in HOROVOD_TORCH_NAMES if not hasattr(hvd, name)]
    assert not missing
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert hvd.Average is ReduceOp.AVERAGE
    compressed, ctx = hvd.Compression.fp16.compress(torch.ones(3, dtype=torch.float64))
    assert compressed.dtype == torch.float16 and hvd.Compression.fp16.decompress(compressed, ctx).dtype == torch.float64
    ints, ctx = hvd.Compression.fp16.compress(torch.ones(3, dtype=torch.int64))
    assert ints.dtype == torch.int64 and hvd.Compression.none.compress(ints)[0] is ints
    import ringtrain

    bn = hvd.SyncBatchNorm(4, momentum=0.2)  # ringtrain's, which also runs on CPU/Gloo
    assert isinstance(bn, ringtrain.SyncBatchNorm) and bn(torch.randn(3, 4)).shape == (3, 4)


def test_one_process_without_a_launcher_through_the_alias():
    """``python train.py`` with ``import horovod.torch as hvd``: size 1, no group, every call works."""
    done = subprocess.run([sys.executable, "-c", SINGLE], env=clean_env(PYTHONPATH=ALIAS), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["initialized"] is True and out["after"] is False
    assert "Horovod has not been initialized; use hvd.init()." in out["not_init"]
    assert out["topology"] == [1, 0, 1, 0, 1, 0]
    mpi, gloo, nccl, cuda, rocm, ddl, ccl, mpi_on, gloo_on, homogeneous = out["built"]
    assert gloo is torch.distributed.is_gloo_available() and mpi is torch.distributed.is_mpi_available()
    assert cuda is (torch.version.cuda is not None) and (nccl > 0) is (torch.version.cuda is not None and
                                                                      torch.distributed.is_nccl_available())
    assert not (rocm or ddl or ccl or mpi_on or gloo_on) and homogeneous
    x = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    for key in ("allreduce", "scaled", "allgather", "broadcast", "alltoall", "reducescatter", "adasum"):
        assert out[key] == x, key
    assert out["join"] == 0 and out["objects"] == [{"a": 1}, [5]]
    assert out["sampler"] == list(range(4, 10)) and out["version"] == "0.28.1"
    assert "MPI is not enabled" in out["mpi_threads"]


def test_example_runs_unchanged_under_the_launcher():
    """examples/horovod_style.py (``import horovod.torch as hvd``) on 2 processes, with fp16 and accumulation."""
    done = subprocess.run(
        [sys.executable, "-m", "ringtrain", "run", "--nproc-per-node", "2", os.path.join(ROOT, "examples",
         "horovod_style.py"), "--epochs", "4", "--fp16-allreduce", "--batches-per-allreduce", "2"],
        env=clean_env(PYTHONPATH=ALIAS), capture_output=True, text=True, timeout=170, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("epoch")]
    assert len(lines) == 4 and "2 worker(s)" in done.stdout
    assert float(lines[-1].split()[-1]) > 0.8, lines
