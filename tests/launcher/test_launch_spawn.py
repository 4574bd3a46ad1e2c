"""`ringtrain.launch(fn, nprocs)`: in-process spawn with torchrun's environment, results, errors, timeout."""

from __future__ import annotations

import multiprocessing
import os
import time

import _launch_workers
import pytest

import ringtrain
from ringtrain import RingtrainError


@pytest.mark.timeout(120)
def test_returns_every_ranks_result_with_the_torchrun_environment():
    out = ringtrain.launch(_launch_workers.all_reduce_rank, 2, args=(10.0,))
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 30.0 for r in out)
    # detect() sees the same contract as under torchrun: the TorchElastic class, env:// init.
    assert [r["env"][1:] for r in out] == [(0, 0, 2, 2, 0), (1, 1, 2, 2, 0)]
    assert out[0]["pid"] != out[1]["pid"] != os.getpid()


@pytest.mark.timeout(120)
def test_a_rank_that_raises_is_named_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RingtrainError) as info:
        ringtrain.launch(_launch_workers.fail_on_rank_one, 2)
    message = str(info.value)
    assert "rank 1" in message and "ValueError: boom from rank one" in message and "Traceback" in message
    assert "HINT:" in message
    assert time.monotonic() - start < 45  # rank 0 (sleeping 60 s) was stopped, not waited for
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(120)
def test_a_child_that_dies_of_a_python_error_before_fn_is_named_not_the_rank_stopped_for_it(tmp_path):
    claim = _launch_workers.FailsInOneChildsStart(str(tmp_path / "claimed"))
    with pytest.raises(RingtrainError) as info:
        ringtrain.launch(_launch_workers.sleep_a_minute, 2, args=(claim,), start_method="spawn")
    message = str(info.value)
    assert "exited with code 1 before fn recorded any error" in message and "could not start" in message, message
    assert "SIGTERM" not in message and "OOM" not in message, message  # the other rank, stopped by us, is not it
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(60)
def test_a_script_on_stdin_is_refused_before_any_child_starts(tmp_path):
    import subprocess
    import sys

    script = "import ringtrain as rt\ndef f():\n    return 1\nif __name__ == '__main__':\n    rt.launch(f, 2)\n"
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=50,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 1, done.stderr
    assert "a script on stdin cannot be re-run by the workers: save it to a file" in done.stderr, done.stderr
    assert "FileNotFoundError" not in done.stderr and "SIGTERM" not in done.stderr, done.stderr


@pytest.mark.timeout(60)
def test_a_hang_is_killed_at_the_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(RingtrainError) as info:
        ringtrain.launch(_launch_workers.hang, 2, args=(str(tmp_path),), timeout=5)
    assert time.monotonic() - start < 30
    assert "timeout=5" in str(info.value) and "HINT:" in str(info.value)
    # Ranks that got as far as fn wrote their pid (on a loaded machine one may still have
    # been importing torch when it was killed: the check below covers it either way).
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, and reaped
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("nprocs", [0, -1, 1.5, True])
def test_nprocs_must_be_a_positive_integer(nprocs):
    with pytest.raises(RingtrainError, match="nprocs") as info:
        ringtrain.launch(_launch_workers.hang, nprocs)
    assert "HINT:" in str(info.value)


def test_a_busy_master_port_is_named(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(RingtrainError, match=str(port)):
            ringtrain.launch(_launch_workers.hang, 1, args=(str(tmp_path),), master_port=port)
    assert list(tmp_path.iterdir()) == []  # nothing was started


@pytest.mark.timeout(120)
def test_fork_start_method_works_too():
    # What a notebook gets by default (its functions cannot be re-imported by "spawn").
    out = ringtrain.launch(_launch_workers.all_reduce_rank, 2, args=(1.0,), start_method="fork")
    assert [(r["rank"], r["sum"]) for r in out] == [(0, 3.0), (1, 3.0)]


@pytest.mark.timeout(120)
def test_spawn_has_mp_spawns_contract_and_ring_needs_no_arguments():
    # Seed 004: mp.spawn(main_worker, nprocs=2, args=(2, args)) with main_worker(local_rank, nprocs, args).
    out = ringtrain.spawn(_launch_workers.main_worker, nprocs=2, args=(2, {"lr": 0.1}))
    assert out == [(0, 2, 2, 1.0, 0.1), (1, 2, 2, 1.0, 0.1)]  # (index, nprocs, ring world, mean, args)


@pytest.mark.timeout(120)
def test_spawn_works_with_a_hand_written_init_process_group():
    # Seed 004 again: init_process_group(init_method='tcp://127.0.0.1:PORT', world_size=nprocs, rank=i).
    from _launch_util import free_port

    out = ringtrain.spawn(_launch_workers.tcp_worker, nprocs=2, args=(2, free_port()))
    assert out == [3.0, 3.0]
    with pytest.raises(RingtrainError, match="join=False"):
        ringtrain.spawn(_launch_workers.tcp_worker, nprocs=2, args=(2, 1), join=False)


_SPAWN_SCRIPT = """
import sys, time
import _launch_workers as w
from _launch_util import free_port

if __name__ == "__main__":
    start = time.monotonic()
    if sys.argv[1] == "mp":
        import torch.multiprocessing as mp
        mp.spawn(w.tcp_worker, nprocs=2, args=(2, free_port()))
    elif sys.argv[1] == "rt-tcp":
        import ringtrain as rt
        assert rt.spawn(w.tcp_worker, nprocs=2, args=(2, free_port())) == [3.0, 3.0]
    else:
        import ringtrain as rt
        assert rt.spawn(w.env_worker_that_destroys, nprocs=2, args=(2,)) == [3.0, 3.0]
    print(f"SECONDS {time.monotonic() - start:.2f}", file=sys.stderr)
"""
_STORE_NOISE = ("client socket has timed out", "TCP client failed to connect", "TCPStore.cpp", "socket.cpp")


@pytest.mark.timeout(240)
def test_spawn_of_a_script_with_its_own_group_ends_as_quietly_and_about_as_fast_as_mp_spawn(tmp_path):
    # pytorch/examples imagenet: init_process_group(init_method="tcp://..."), then destroy_process_group.
    # Nobody listens on rt.spawn's MASTER_PORT then: asking it for a store printed 80-160 lines of C++
    # retries and took seconds at every rank's exit.
    import re
    import subprocess
    import sys

    from _launch_util import child_env

    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "spawn_job.py"
    script.write_text(_SPAWN_SCRIPT)
    seconds = {}
    for how in ("mp", "rt-tcp", "rt-env"):
        done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=200,
                              env=child_env(here))
        assert done.returncode == 0, done.stderr
        noise = [line for line in done.stderr.splitlines() if any(n in line for n in _STORE_NOISE)]
        assert noise == [], f"{how}:\n" + "\n".join(noise[:10])
        seconds[how] = float(re.search(r"SECONDS ([0-9.]+)", done.stderr).group(1))
    # Loose on purpose (a loaded machine starts processes slowly): no wait of rt.spawn's own at exit.
    assert seconds["rt-tcp"] < 2 * seconds["mp"] + 10, seconds


def test_launch_has_no_time_limit_by_default():
    import inspect

    assert inspect.signature(ringtrain.launch).parameters["timeout"].default is None


@pytest.mark.timeout(120)
def test_fork_guard_never_asks_whether_cuda_is_available(monkeypatch):
    # torch.cuda.is_available() initializes the CUDA driver in the parent, which is what
    # breaks forked children on a GPU machine: the guard may only ask is_initialized().
    import torch

    parent, asked = os.getpid(), []

    def is_available() -> bool:  # the CUDA query, replaced: records calls made in this process
        if os.getpid() == parent:
            asked.append(True)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    out = ringtrain.launch(_launch_workers.all_reduce_rank, 2, args=(1.0,), start_method="fork")
    assert [r["sum"] for r in out] == [3.0, 3.0]
    assert asked == [], "launch(start_method='fork') called torch.cuda.is_available() in the parent"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RingtrainError, match="CUDA is already initialized") as info:
        ringtrain.launch(_launch_workers.all_reduce_rank, 2, args=(1.0,), start_method="fork")
    assert "HINT:" in str(info.value) and asked == []
