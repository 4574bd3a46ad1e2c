"""The device and backend rule, for every combination of visible GPUs and local processes.

CUDA is asked through ``devices.Gpus`` (what ``visible_gpus()`` returns), so these decisions
run on a CPU machine exactly as they would on a GPU one.
"""

from __future__ import annotations

import pytest
import torch

import ringtrain as rt
from ringtrain.parallel import devices
from ringtrain.parallel.devices import Gpus


def gpus(*uuids: str) -> Gpus:
    return Gpus(len(uuids), lambda: tuple(uuids))


@pytest.mark.parametrize("visible,local_world,local_rank,expected", [
    (0, 1, 0, "cpu"),        # a laptop
    (0, 4, 3, "cpu"),        # make test / make demo on a CPU machine
    (1, 1, 0, "cuda:0"),     # one GPU, python train.py
    (8, 8, 5, "cuda:5"),     # ringtrain run --nproc-per-node gpu on an 8-GPU node
    (8, 4, 3, "cuda:3"),     # fewer processes than GPUs
])
def test_auto_device(visible, local_world, local_rank, expected):
    seen = gpus(*[f"GPU-{i}" for i in range(visible)])
    assert devices.choose_device("auto", local_rank, local_world, seen) == torch.device(expected)


def test_each_process_with_a_gpu_of_its_own_uses_it_as_cuda0():
    # srun --gpus-per-task=1: each of 4 tasks sees one GPU, a different one
    peers = [("GPU-a",), ("GPU-b",), ("GPU-c",), ("GPU-d",)]
    assert devices.needs_peers("auto", 4, gpus("GPU-c"))
    assert devices.choose_device("auto", 2, 4, gpus("GPU-c"), peers) == torch.device("cuda", 0)


def test_processes_sharing_one_gpu_are_refused_with_the_ways_out():
    # make demo (2 processes) on a one-GPU machine: both would claim cuda:0
    with pytest.raises(rt.RingtrainError, match="2 processes on this node share 1 GPU") as info:
        devices.choose_device("auto", 1, 2, gpus("GPU-a"), [("GPU-a",), ("GPU-a",)])
    assert "device='cpu'" in info.value.hint and "--nproc-per-node gpu" in info.value.hint
    with pytest.raises(rt.RingtrainError, match="share"):
        devices.choose_device("cuda", 0, 2, gpus("GPU-a"))  # nobody said the GPUs differ


def test_cpu_is_always_allowed_and_cuda_needs_a_gpu():
    assert devices.choose_device("cpu", 1, 2, gpus("GPU-a")) == torch.device("cpu")
    assert not devices.needs_peers("cpu", 2, gpus("GPU-a"))
    with pytest.raises(rt.RingtrainError, match="sees no CUDA device"):
        devices.choose_device("cuda", 0, 1, gpus())
    with pytest.raises(rt.RingtrainError, match="device='tpu'"):
        devices.choose_device("tpu", 0, 1, gpus())


@pytest.mark.parametrize("device,requested,expected", [
    ("cpu", None, "gloo"),
    ("cuda", None, "cpu:gloo,cuda:nccl"),  # metrics, objects and checks are CPU tensors: Gloo beside NCCL
    ("cuda", "nccl", "cpu:gloo,cuda:nccl"),
    ("cuda", "gloo", "gloo"),
    ("cpu", "gloo", "gloo"),
])
def test_backend_string_for_each_device_kind(device, requested, expected):
    assert devices.choose_backend(torch.device(device), requested, available=lambda name: True) == expected


def test_backends_that_cannot_work_are_refused():
    with pytest.raises(rt.RingtrainError, match="no CUDA device"):
        devices.choose_backend(torch.device("cpu"), "nccl", available=lambda name: True)
    with pytest.raises(rt.RingtrainError, match="does not include it"):
        devices.choose_backend(torch.device("cpu"), "mpi", available=lambda name: name != "mpi")
    with pytest.raises(rt.RingtrainError, match="not a torch.distributed backend"):
        devices.choose_backend(torch.device("cpu"), "ucc")
    # NCCL missing from the build (a CPU wheel): CUDA devices fall back to Gloo
    assert devices.choose_backend(torch.device("cuda", 0), None, available=lambda name: name == "gloo") == "gloo"


@pytest.mark.parametrize("visible,local_world,local_rank,asked,expected", [
    (2, 1, 0, "cuda:1", "cuda:1"),  # python train.py --device cuda:1 (one process picks its GPU)
    (8, 8, 5, "cuda:5", "cuda:5"),  # nanoGPT: device = f"cuda:{ddp_local_rank}", one process per GPU
])
def test_a_scripts_own_cuda_index_is_taken_where_it_is_this_process_gpu(visible, local_world, local_rank, asked,
                                                                          expected):
    seen = gpus(*[f"GPU-{i}" for i in range(visible)])
    assert devices.choose_device(asked, local_rank, local_world, seen) == torch.device(expected)


@pytest.mark.parametrize("visible,local_world,local_rank,asked,says", [
    (8, 8, 5, "cuda:0", "another process's GPU"),  # every rank on cuda:0
    (1, 1, 0, "cuda:3", "not visible"),
    (0, 1, 0, "cuda:0", "sees no CUDA device"),
    (0, 2, 0, "mps", "Apple's GPU is one device"),
    (0, 1, 0, "cuda:x", "Ring got device"),
])
def test_a_device_that_cannot_be_this_process_own_is_refused_with_a_hint(visible, local_world, local_rank, asked,
                                                                           says):
    seen = gpus(*[f"GPU-{i}" for i in range(visible)])
    with pytest.raises(rt.RingtrainError, match="HINT") as refused:
        devices.choose_device(asked, local_rank, local_world, seen)
    assert says in str(refused.value)


def test_mps_in_one_process_where_torch_has_no_mps_is_named():
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(rt.RingtrainError, match="no Apple GPU"):
        devices.choose_device("mps", 0, 1, gpus())
