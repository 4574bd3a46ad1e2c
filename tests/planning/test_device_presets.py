"""Devices, sizes and the step-time model (planning/devices.py, planning/cost.py)."""

from __future__ import annotations

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.planning import cost
from ringtrain.planning.devices import GiB, device_of, parse_bytes
from ringtrain.planning.layouts import Layout


def test_sizes_parse_in_binary_and_decimal_units():
    assert parse_bytes("80GiB") == 80 * GiB
    assert parse_bytes("40 GB") == 40 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(1024) == 1024
    with pytest.raises(RingtrainError, match="not a size"):
        parse_bytes("lots")


def test_a_device_by_name_by_peak_and_with_overrides():
    assert device_of("a100").tflops_bf16 == 312
    assert device_of("400").tflops_bf16 == 400
    assert device_of("h100", "40GiB", inter_gbps=25).memory == 40 * GiB
    assert device_of("h100", None, inter_gbps=25).inter_gbps == 25
    with pytest.raises(RingtrainError, match="does not know"):
        device_of("tpu9")


def test_ddp_hides_its_all_reduce_behind_backward_and_tp_hides_nothing():
    h100 = device_of("h100")
    flops = int(h100.peak(True) * cost.EFFICIENCY)  # one second of computation
    ddp = cost.step_time(Layout("ddp", dp_replicate=8), flops, flops, {"dp_replicate": int(1000e9)}, h100, True, 8)
    assert ddp.compute_s == pytest.approx(1.0)
    assert ddp.exposed_s == pytest.approx(ddp.comm_s - 2 / 3)  # 2.8 s of traffic, 2/3 s hidden
    tp = cost.step_time(Layout("single", tp=8), flops, flops, {"tp": int(100e9)}, h100, True, 8)
    assert tp.exposed_s == pytest.approx(tp.comm_s)
    assert 0 < ddp.mfu < tp.mfu < cost.EFFICIENCY


def test_a_group_across_nodes_uses_the_slower_link():
    h100 = device_of("h100")
    sent = {"dp_shard": int(10e9)}
    one_node = cost.step_time(Layout("fsdp", dp_shard=8), 0, 0, sent, h100, True, 8)
    two_nodes = cost.step_time(Layout("fsdp", dp_shard=8), 0, 0, sent, h100, True, 4)
    assert two_nodes.comm_s == pytest.approx(one_node.comm_s * h100.intra_gbps / h100.inter_gbps)
