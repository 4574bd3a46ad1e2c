"""The launcher's rendezvous port: loopback-only for one machine, busy ports named. No workers."""

from __future__ import annotations

import socket

import pytest

from ringtrain import RingtrainError
from ringtrain.launcher.ports import bind_listener, host_store, is_loopback


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("10.0.0.1")


def test_a_single_machine_job_listens_on_loopback_only():
    with bind_listener("127.0.0.1", 0) as listener:
        assert listener.getsockname()[0] == "127.0.0.1"


def test_a_busy_port_is_named_with_a_hint():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(RingtrainError, match=str(port)) as info:
            bind_listener("127.0.0.1", port)
    assert "HINT:" in str(info.value)


def test_host_store_serves_clients_and_later_stores_on_the_port_share_it():
    from datetime import timedelta

    from torch.distributed import TCPStore

    store, port = host_store("127.0.0.1", 0, timeout=10)
    # What torchrun's static rendezvous does next in the same process: multi_tenant reuse.
    again = TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10), multi_tenant=True)
    client = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
    again.set("k", "v")
    assert client.get("k") == b"v" and store.get("k") == b"v"
