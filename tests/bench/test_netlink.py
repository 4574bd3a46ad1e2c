"""netlink.py: RATE[,DELAY] parsing, a namespace that is always removed, and a shaped loopback that
really limits a Gloo all-reduce — real namespaces, real tc, real ranks (root, ip and tc needed:
those tests skip with the reason otherwise)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

import ringtrain
from ringtrain.bench import netlink
from ringtrain.bench import comm
from ringtrain.errors import RingtrainError

NEEDS_LINK = pytest.mark.skipif(netlink.link_available() is not None, reason=str(netlink.link_available()))


def _namespaces() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


@pytest.mark.parametrize("text, rate_bps, delay_s", [
    ("1gbit", 1e9, 0.0), ("100mbit", 1e8, 0.0), ("10gbit,0.2ms", 1e10, 2e-4), ("2.5Gbit, 5ms", 2.5e9, 5e-3),
    ("125mbps", 1e9, 0.0), ("500kbit,300us", 5e5, 3e-4),
])
def test_rates_and_delays_in_tcs_units(text, rate_bps, delay_s):
    spec = netlink.parse_link(text)
    assert spec.rate_bps == pytest.approx(rate_bps) and spec.delay_s == pytest.approx(delay_s)


@pytest.mark.parametrize("text, needle", [
    ("", "RATE[,DELAY]"), ("1gb", "not a rate"), ("0mbit", "not a rate"), ("fast", "not a rate"),
    ("1gbit,5", "not a delay"), ("1gbit,0ms", "not a delay"), ("1gbit,20s", "not a delay"),
    ("1gbit,1ms,2ms", "RATE[,DELAY]"), ("-1gbit", "not a rate"),
])
def test_bad_values_are_errors_with_a_hint(text, needle):
    with pytest.raises(RingtrainError, match="HINT") as e:
        netlink.parse_link(text)
    assert needle in e.value.message


def test_without_root_or_iproute2_the_error_names_what_is_missing(monkeypatch):
    # Environment detection is the one thing mocked: this machine may well be root with iproute2.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RingtrainError, match="not root") as e:
        with netlink.shaped_link("1gbit"):
            pass
    assert "run as root" in e.value.hint
    monkeypatch.setattr(netlink.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/" + tool)
    with pytest.raises(RingtrainError, match="tc not found") as e:
        with netlink.shaped_link("1gbit"):
            pass
    assert "iproute2" in e.value.hint


@NEEDS_LINK
@pytest.mark.timeout(60)
def test_the_namespace_exists_inside_and_is_gone_after_even_when_the_body_raises():
    before = _namespaces()
    with netlink.shaped_link("1gbit") as link:
        assert link.name.startswith(f"ringtrain-{os.getpid()}-") and link.name in _namespaces()
        assert link.argv(["true"]) == ["ip", "netns", "exec", link.name, "true"]
        assert subprocess.run(link.argv(["true"])).returncode == 0
    assert link.name not in _namespaces()
    with pytest.raises(ZeroDivisionError):
        with netlink.shaped_link("100mbit") as link:
            1 / 0
    assert link.name not in _namespaces() and _namespaces() <= before


@NEEDS_LINK
@pytest.mark.timeout(60)
def test_sigterm_still_removes_the_namespace():
    code = ("import sys; from ringtrain.bench import netlink\n"
            "with netlink.shaped_link('1gbit') as link:\n"
            "    print(link.name, flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip()
    assert name in _namespaces()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert name not in _namespaces()


@NEEDS_LINK
@pytest.mark.timeout(60)
def test_a_dead_creators_namespace_is_removed_a_live_ones_kept():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"ringtrain-{dead.pid}-0", f"ringtrain-{os.getppid()}-99"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with netlink.shaped_link("1gbit"):
            assert stale not in _namespaces() and live in _namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@NEEDS_LINK
@pytest.mark.timeout(60)
def test_entered_is_a_separate_network_for_this_thread_only():
    with netlink.shaped_link("1gbit") as link:
        with link.entered():
            inner = socket.create_server(("127.0.0.1", 0))
            port = inner.getsockname()[1]
            seen = []
            other = threading.Thread(target=lambda: seen.append(socket.socket().connect_ex(("127.0.0.1", port))))
            other.start()  # a thread started here is inside too
            other.join()
            assert seen == [0]
        with pytest.raises(ConnectionRefusedError):  # outside, nothing listens on that port
            socket.create_connection(("127.0.0.1", port), timeout=5)
        inner.close()


@NEEDS_LINK
@pytest.mark.timeout(90)
def test_a_shaped_link_limits_an_all_reduce_per_direction():
    size = 4 * 2**20
    plain = ringtrain.launch(comm.worker, 2, args=([size], 1, 0.3, 1), timeout=60)[0][0]
    with netlink.inside("100mbit") as link:
        shaped = ringtrain.launch(comm.worker, 2, args=([size], 1, 0.3, 1), timeout=60)[0][0]
        sent = sorted(link.counters().values())
    # Both directions at once, each at the full rate: a full-duplex link, not a shared half-duplex one
    # (that would give ~0.05 Gbit/s). HTB's burst lets it run a little over the rate.
    assert 0.085 <= shaped["busbw_gbit_s"] <= 0.11, shaped
    assert plain["busbw_gbit_s"] > 5 * shaped["busbw_gbit_s"], (plain, shaped)
    # The two directions went through two different classes, each carrying the message's share.
    assert len(sent) >= 2 and sent[-2] >= shaped["iters"] * size / 2, sent


@pytest.mark.skipif(netlink.link_problem() is not None, reason=str(netlink.link_problem()))
@pytest.mark.timeout(60)
def test_a_delay_needs_netem_and_says_so_when_the_kernel_lacks_it():
    if netlink.link_available(delay=True) is None:
        pytest.skip("this kernel has netem: the delay works")
    with pytest.raises(RingtrainError, match="netem") as e:
        with netlink.shaped_link("1gbit", "1ms"):
            pass
    assert "modprobe sch_netem" in e.value.hint
