"""liveness/activity.py: "is the main thread waiting for other ranks" is a mark the code sets, not a file path;
and an Activity belongs to whoever made it (issue 29, item 5)."""

from __future__ import annotations

import threading
import time
import types

import torch.distributed as dist

from ringtrain.liveness.activity import Activity, blocked_in, waits_for_peers


@waits_for_peers(lambda frame: f"waiting for {frame.f_locals['what']}")
def _marked_wait(what: str, seconds: float) -> None:
    time.sleep(seconds)


def _seen_from_a_thread(block, *, backward_syncs: bool = False, activity: Activity | None = None) -> str | None:
    """Run ``block`` on the main thread; what ``blocked_in`` sees from another thread meanwhile."""
    seen: list = []

    def look() -> None:
        time.sleep(0.15)
        seen.append(blocked_in(activity, backward_syncs))

    watcher = threading.Thread(target=look)
    watcher.start()
    block()
    watcher.join()
    return seen[0]


def test_a_marked_function_is_a_wait_for_peers_and_names_itself():
    assert _seen_from_a_thread(lambda: _marked_wait("the others", 0.4)) == "waiting for the others"


def test_a_ring_collective_names_itself_over_the_mark():
    activity = Activity()

    def ring_collective() -> None:
        with activity.calling("all_reduce(op=mean, float32[1])"):
            _marked_wait("x", 0.4)

    assert _seen_from_a_thread(ring_collective, activity=activity) == "all_reduce(op=mean, float32[1]) #1"
    with activity.working_alone():  # the rest of a sharded save is this rank's own
        assert _seen_from_a_thread(lambda: _marked_wait("x", 0.4), activity=activity) is None


def test_a_file_path_decides_nothing():
    """Code in a file whose path looks like ringtrain's collectives (or torch's) is not a wait unless marked."""
    source = "import time\ndef wait():\n    time.sleep(0.4)\n"
    fake = types.ModuleType("not_a_collective")
    exec(compile(source, "/site-packages/ringtrain/comm/handles.py", "exec"), fake.__dict__)
    assert _seen_from_a_thread(fake.wait) is None
    torch_like = types.ModuleType("mine")
    exec(compile(source, "/site-packages/torch/distributed/distributed_c10d.py", "exec"), torch_like.__dict__)
    assert _seen_from_a_thread(torch_like.wait) is None


def test_the_engine_is_told_by_its_module():
    """A frame of torch.distributed (by module name: torch's API) is a collective of the engine's."""
    engine = types.ModuleType("torch.distributed.fake_collective")
    exec(compile("import time\ndef barrier():\n    time.sleep(0.4)\n", "<engine>", "exec"), engine.__dict__)
    assert _seen_from_a_thread(engine.barrier) == "barrier"
    autograd = types.ModuleType("torch.autograd.fake")
    exec(compile("import time\ndef backward():\n    time.sleep(0.4)\n", "<autograd>", "exec"), autograd.__dict__)
    assert _seen_from_a_thread(autograd.backward, backward_syncs=True) == "backward (gradient all-reduce)"
    assert _seen_from_a_thread(autograd.backward, backward_syncs=False) is None
    assert dist.barrier.__module__.startswith("torch.distributed")  # the rule's premise, on this torch


def test_activities_are_their_owners_own():
    a, b = Activity(), Activity()
    a.enter("backward")
    a.step = 7
    assert (b.phase, b.step) == ("", 0)
    with a.calling("barrier"):
        assert a.current == "barrier #1" and b.current is None


def test_a_backward_that_runs_the_users_own_code_is_computing_not_waiting():
    """Issue 37, item 6: inside a backward (DDP's: where the gradient all-reduce waits), a frame of the user's code
    — a backward hook, a custom Function's backward — is this rank's own computation, not a wait for its peers; a
    backward with nothing of the user's inside it (DDP's C++ waiting at its end) still is."""
    import torch

    def stuck_in_backward(grad):
        time.sleep(0.4)  # the user's hook computes (or sleeps): it waits for no peer
        return grad

    def backward_with(hook) -> None:
        x = torch.ones(3, requires_grad=True)
        if hook is not None:
            x.register_hook(hook)
        (x * 2).sum().backward()

    assert _seen_from_a_thread(lambda: backward_with(stuck_in_backward), backward_syncs=True) is None

    engine = types.ModuleType("torch.distributed.fake_collective")
    exec(compile("import time\ndef all_reduce():\n    time.sleep(0.4)\n", "<engine>", "exec"), engine.__dict__)

    def waits_in_its_hook(grad):
        engine.all_reduce()  # the user's hook waits for its peers: a collective after all
        return grad

    assert _seen_from_a_thread(lambda: backward_with(waits_in_its_hook), backward_syncs=True) == \
        "backward (gradient all-reduce)"
    autograd = types.ModuleType("torch.autograd.fake")
    exec(compile("import time\ndef backward():\n    time.sleep(0.4)\n", "<autograd>", "exec"), autograd.__dict__)
    assert _seen_from_a_thread(autograd.backward, backward_syncs=True) == "backward (gradient all-reduce)"


def test_only_a_rings_layers_count_steps():
    activity = Activity()
    assert not activity.counts_steps  # Horovod's API, a plain script: their loops are their own
    activity.enter("data")
    assert activity.counts_steps
