"""The liveness board and watchdog, piece by piece, on a real (in-process) store.

End-to-end behaviour — real jobs where one rank leaves — is in tests/launcher/test_launch_failfast.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
import threading
import time
from collections import namedtuple

import pytest
import torch.distributed as dist

from ringtrain.launcher.report import first_cause
from ringtrain.liveness import failures, membership as liveness, procs
from ringtrain.liveness.records import Blame, Exit, Post


def boards(world_size: int = 2, generation: str = "0-0") -> list[liveness.Board]:
    store = dist.HashStore()
    return [liveness.Board(store, rank, world_size, generation) for rank in range(world_size)]


def test_posts_are_read_back_by_every_rank_and_counted():
    b0, b1 = boards()
    assert b0.count() == 0 and b0.read() == {}
    b1.post("failed", "ValueError: boom")
    assert b0.count() == 1
    post = b0.read()[1]
    assert (post.rank, post.state, post.reason, post.cause) == (1, "failed", "ValueError: boom", "own")
    assert b0.first_peer_post().rank == 1 and b1.first_peer_post() is None


def test_generations_do_not_see_each_other():
    store = dist.HashStore()
    old, new = liveness.Board(store, 1, 2, "0-0"), liveness.Board(store, 0, 2, "1-0")
    old.post("failed", "the dead attempt's failure")
    assert new.count() == 0 and new.read() == {}


def test_a_failure_after_a_peer_posted_is_blamed_on_that_peer():
    b0, b1 = boards()
    b1.post("finished", "process exit")
    entry = liveness.post_failure(b0, "RingtrainError: all_reduce failed")
    assert entry.cause == "peer"
    assert entry.blame == Blame(1, "finished", "process exit")


def test_an_engine_error_about_a_lost_connection_is_not_the_rank_s_own_fault():
    try:
        try:
            raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234")
        except RuntimeError as e:
            raise ValueError("all_reduce failed") from e
    except ValueError as e:
        error = e
    assert liveness.lost_a_peer(error)
    assert not liveness.lost_a_peer(ValueError("a bug of its own"))
    b0, _ = boards()
    assert liveness.post_failure(b0, "ValueError", error).cause == "peer"


def test_a_lost_connection_names_the_neighbour_that_vanished_and_waits_only_that_long():
    # srun or plain torchrun: nobody reads the board but the rank itself, which must say who it was.
    lost = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:15744: Connection reset by peer")
    b0, b1 = boards()
    b0.hello()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    b1.store.set("hello/1", f'{{"pid": {child.pid}, "host": "{procs.host_identity()}"}}')
    entry = liveness.post_failure(b0, "RuntimeError: Read error", lost)
    assert entry.cause == "peer"
    assert entry.blame == liveness.vanished_blame(1)
    # Nobody to name (the peer lives on and posted nothing): a bounded look, then "peer", unnamed.
    b0, b1 = boards()
    b0.hello()
    b1.hello()  # this very process: alive
    start = time.monotonic()
    entry = liveness.post_failure(b0, "RuntimeError: Read error", lost)
    assert entry.cause == "peer" and entry.blame is None
    assert time.monotonic() - start < liveness.LOST_PEER_WAIT_S + 1.0
    # An error of its own waits for nothing: the lost-peer search (the only wait) is never entered.
    b0, _ = boards()
    searched = []
    original = liveness._find_lost_peer
    liveness._find_lost_peer = lambda *a, **k: searched.append(a) or original(*a, **k)
    try:
        assert liveness.post_failure(b0, "ValueError: bug", ValueError("a bug of its own")).cause == "own"
    finally:
        liveness._find_lost_peer = original
    assert searched == []


def test_a_store_whose_host_is_gone_is_asked_no_more_and_named():
    import gc

    from ringtrain.liveness.board import StoreLost
    from ringtrain.liveness.seal import Seal

    timeout = datetime.timedelta(seconds=5)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False, timeout=timeout)
    board = liveness.Board(client, 1, 2, "0-0", Seal("k"), address="127.0.0.1:29500")  # the store's, for reports
    watcher = board.clone()  # the watchdog's connection
    board.hello()
    assert not board.lost and board.hellos_so_far().keys() == {1}
    del master  # the store's host goes (its node was killed)
    gc.collect()
    assert board.read() == {} and board.lost and watcher.lost  # one failed call, seen by every connection
    asked = []
    store = watcher.store._store  # the prefix store under the guard: a call that reached it would be seen here
    watcher.store._store = type("Counting", (), {"__getattr__": lambda self, n: (
        lambda *a, **k: asked.append(n) or getattr(store, n)(*a, **k))})()
    with pytest.raises(StoreLost):
        watcher.count()  # not asked: no C++ warning, no wait
    watcher.store._store = store
    assert asked == []
    lost = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234")
    entry = liveness.post_failure(board, "RuntimeError: Connection closed", lost)
    assert entry.cause == "peer" and entry.blame.state == "unreachable"
    assert entry.blame.describe().startswith("the job's store at 127.0.0.1:29500 closed its connections")


# --- the watchdog's verdicts ------------------------------------------------------------

def watchdog(board: liveness.Board, **kwargs) -> liveness.Watchdog:
    # check() is called directly (the thread is not started); stop is never reached here.
    return liveness.Watchdog(board, backward_syncs=True, error_file=None, grace=0.3, **kwargs)


def test_a_failed_peer_stops_this_rank_at_once_naming_it():
    b0, b1 = boards()
    dog = watchdog(b0)
    assert dog.check() is None
    b1.post("failed", "ValueError: boom")
    message, info = dog.check()
    assert message == "ringtrain: rank 0 stops: rank 1 failed (ValueError: boom); the job cannot go on without it."
    assert info["cause"] == "peer" and info["blame"]["rank"] == 1
    assert b1.read()[0].state == "failed"  # rank 0's own post says it stopped because of rank 1


# A frame whose file looks like torch.distributed: what the main thread shows while in a collective.
_IN_COLLECTIVE = compile("def all_reduce(event):\n    event.wait(10)\n", "<engine>", "exec")


def _main_thread_in_collective(event: threading.Event) -> None:
    namespace: dict = {"__name__": "torch.distributed.fake"}  # the engine is told by its module (activity.py)
    exec(_IN_COLLECTIVE, namespace)
    namespace["all_reduce"](event)


def test_a_finished_peer_stops_this_rank_only_while_it_waits_in_a_collective():
    b0, b1 = boards()
    dog = watchdog(b0)
    b1.post("finished", "process exit")
    assert dog.check() is None  # the main thread (this test) is not in a collective: fine to go on
    verdicts = []
    release = threading.Event()

    def look() -> None:  # the watchdog's view, from another thread, while the main thread waits
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not verdicts:
            verdict = dog.check()
            if verdict:
                verdicts.append(verdict)
            time.sleep(0.05)
        release.set()

    looker = threading.Thread(target=look)
    looker.start()
    _main_thread_in_collective(release)
    looker.join()
    assert verdicts, "the watchdog never stopped a rank blocked in a collective after its peer finished"
    message, info = verdicts[0]
    assert message == "ringtrain: rank 0 stops: rank 1 finished (process exit) while rank 0 called all_reduce."
    assert info["during"] == "all_reduce"


def test_a_neighbour_that_vanished_without_a_word_counts_as_failed():
    b0, b1 = boards()
    b0.hello()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    b1.store.set("hello/1", f'{{"pid": {child.pid}, "host": "{procs.host_identity()}"}}')
    dog = watchdog(b0)
    assert dog.check() is None  # its agent gets a moment to say how it ended (VanishedNeighbour.AGENT_WAIT_S)
    message, info = _first_verdict(dog, 5)
    assert "rank 1 failed (its process ended without a word (killed by a signal, or os._exit?)" in message
    # the same pid on another host (or pid namespace) says nothing about this one
    b0b, b1b = boards()
    b0b.hello()
    b1b.store.set("hello/1", f'{{"pid": {child.pid}, "host": "elsewhere"}}')
    assert watchdog(b0b).check() is None


def test_pid_gone_sees_exited_and_zombie_processes():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while not procs.ended(child.pid) and time.monotonic() < deadline:  # a zombie until reaped
        time.sleep(0.05)
    assert procs.ended(child.pid)
    child.wait()
    assert procs.ended(child.pid)
    assert not procs.ended(os.getpid())


def test_a_store_that_went_away_counts_as_its_host_leaving():
    # Without a launcher, rank 0's process hosts the store: when it ends, the store ends with it.
    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=datetime.timedelta(seconds=2))
    dog = watchdog(liveness.Board(client, 1, 2, "0-0"))
    assert dog.check() is None
    del host  # the server stops
    assert dog.check() is None  # not in a collective: nothing to stop yet
    assert dog.finished.reason == "the job's rendezvous store closed"


# --- the launcher's report: who caused it ---------------------------------------------------

Failure = namedtuple("Failure", "exitcode message local_rank pid")


def record(time_: float, cause: str, blame: dict | None = None) -> dict:
    return {"message": "x", "extraInfo": {failures.INFO_KEY: {"time": time_, "cause": cause, "blame": blame}}}


def test_first_cause_prefers_own_failures_then_signals_then_peers():
    blamed = {"rank": 1, "state": "finished", "reason": "process exit"}
    # rank 0 stopped earlier (seconds-resolution torchrun would pick it), but because of rank 1
    rank, _, blame = first_cause({0: Failure(1, record(10.0, "peer", blamed), 0, 1),
                                  1: Failure(3, record(10.4, "own"), 1, 2)})
    assert (rank, blame) == (1, None)
    # a SIGKILLed rank left no word: it comes before a rank that lost its connection to it
    rank, _, _ = first_cause({0: Failure(1, record(10.0, "peer"), 0, 1), 1: Failure(-9, None, 1, 2)})
    assert rank == 1
    # ... but not the agent's own SIGTERM to the rest
    rank, _, blame = first_cause({0: Failure(1, record(10.0, "peer", blamed), 0, 1), 1: Failure(-15, None, 1, 2)})
    assert (rank, blame) == (0, Blame(1, "finished", "process exit"))


def _first_verdict(dog, within: float):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        verdict = dog.check()
        if verdict is not None:
            return verdict
        time.sleep(0.05)
    raise AssertionError("no verdict")


def test_a_vanished_neighbour_is_named_as_its_agent_says_when_the_agent_says_it_in_time():
    """Issue 31, item 10: a rank SIGKILLed on this host was blamed "without a word" before its node's agent could
    post "killed by SIGKILL on host H, pid P"; the agent's word is waited for a moment, and used."""
    b0, b1 = boards()
    b0.hello()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    b1.store.set("hello/1", f'{{"pid": {child.pid}, "host": "{procs.host_identity()}"}}')
    dog = watchdog(b0)
    assert dog.check() is None
    b1.post_exit(Exit(rank=1, pid=child.pid, hostname="vm", exitcode=-9, time=time.time()))
    message, _ = _first_verdict(dog, 5)
    assert "SIGKILL" in message and "without a word" not in message, message


def test_a_finished_peer_that_took_part_in_this_collective_is_waited_for(monkeypatch):
    """Issue 31, item 2: a peer that finished after issuing this rank's collective (its post's count >= ours)
    completes it, however late a busy machine lets this rank see that: not a failure within the stall warning.
    A peer that finished before issuing it never will: stopped after the grace, as before."""
    for peer_seq, stopped in ((5, False), (4, True)):
        b0, b1 = boards()
        dog = watchdog(b0, sequence=lambda: 5, stall_warning=30)
        b1._write_post(Post(rank=1, state="finished", reason="ring.close", time=time.time(), seq=peer_seq))
        assert dog.check() is None
        seen, release = [], threading.Event()

        def look() -> None:
            deadline = time.monotonic() + 1.5  # 5x the grace
            while time.monotonic() < deadline and not seen:
                if (verdict := dog.check()) is not None:
                    seen.append(verdict)
                time.sleep(0.05)
            release.set()

        looker = threading.Thread(target=look)
        looker.start()
        _main_thread_in_collective(release)
        looker.join()
        assert bool(seen) == stopped, (peer_seq, seen)


def test_a_forged_stack_counter_costs_nothing_and_real_requests_are_still_answered():
    """Issue 31, item 9: store.add(".../stacks", 10**9) from anyone who reaches the store kept every watchdog
    looping through 10**9 requests; only the newest few sealed requests are looked at now."""
    b0, b1 = boards()
    dog = watchdog(b0)
    dog.check()
    b1.store.add("stacks", 10**9)
    started = time.monotonic()
    dog.check()
    assert time.monotonic() - started < 5.0  # 10**9 requests would take hours: 5 s is no flake on a loaded machine
    number = b1.request_stacks()
    dog.check()
    assert "Thread 'MainThread'" in b1.answers(number, [0], 2.0).get(0, "")


def test_a_stall_claim_taken_beforehand_by_someone_else_is_not_the_jobs():
    """Issue 31, item 9: pre-claiming the stall/* keys suppressed every report; a sealed board claims under a
    name only the job's ranks can make."""
    from ringtrain.liveness.seal import Seal

    store = dist.HashStore()
    board = liveness.Board(store, 0, 2, "0-0", Seal("the-jobs-secret"))
    board.store.set("stall/100/1", "9")  # what the old, guessable name was
    assert board.claim("100/1") and not liveness.Board(store, 1, 2, "0-0", Seal("the-jobs-secret")).claim("100/1")


def test_positions_older_than_the_others_are_not_taken_for_a_mismatch():
    """Issue 31, item 10: a rank's stale whereabouts (published long before) said "the ranks were in different
    collectives" after a kill; only positions of about the same moment are compared."""
    from ringtrain.liveness import stall
    from ringtrain.liveness.records import Whereabouts

    now = time.time()
    fresh = Whereabouts(rank=0, pid=1, host="h", hostname="h", beat=now, step=12, phase="backward",
                        waiting="all_reduce #30", seq=30)
    stale = Whereabouts(rank=1, pid=2, host="h", hostname="h", beat=now - 40, step=1, phase="forward",
                        waiting="__init__", seq=2)
    assert stall.mismatch({0: fresh, 1: stale}) is None
    assert "rank 1 is in __init__" in stall.mismatch({0: fresh, 1: dataclasses.replace(stale, beat=now)})


@pytest.mark.parametrize("world, generation", [("1000000000", "0-0"), ("0", "0-0"), ("-3", "0-0"), ("two", "0-0"),
                                               ("2", "../../x"), ("2", "0-0 "), ("2", "")])
def test_a_tampered_world_or_generation_is_no_board_to_read(world, generation):
    """Issue 31, item 12: tampered `world`/`current` store keys hung the launcher for 185 s (it read every one of
    10**9 ranks' keys); a value that cannot be a job's is no board at all, answered at once."""
    from ringtrain.liveness.board import PREFIX, job_board

    store = dist.HashStore()
    store.set(f"{PREFIX}/current", generation)
    store.set(f"{PREFIX}/{generation}/world", world)
    started = time.monotonic()
    assert job_board(store) is None
    assert time.monotonic() - started < 5.0  # it hung 185 s reading 10**9 ranks' keys: 5 s is no flake under load
    store.set(f"{PREFIX}/current", "0-0")
    store.set(f"{PREFIX}/0-0/world", "2")
    assert job_board(store).world_size == 2  # a real one still reads


def test_an_exit_after_a_clean_close_is_not_bounded(monkeypatch):
    # A finished job's finalization may be slow (a loaded machine), never a wait on peers once the group is gone.
    bounds = []
    monkeypatch.setattr(liveness, "bound_exit", lambda seconds=liveness.EXIT_BOUND_S: bounds.append(seconds))
    for name in ("_ACTIVE", "_LAST"):  # put back after the test: has_left() is this process's own (loop/preempt)
        monkeypatch.setattr(liveness, name, getattr(liveness, name))
    b0, _ = boards()
    member = liveness.Membership(b0, backward_syncs=False, error_file=None, watch=False)
    member.finish("ring.close")
    member.at_exit(bound=False)
    assert bounds == [] and b0.posted.state == "finished"
    liveness.Membership(boards()[0], backward_syncs=False, error_file=None, watch=False).at_exit()
    assert bounds == [liveness.EXIT_BOUND_S]  # not closed: the rest of the exit is bounded, as before


def test_an_error_raised_for_another_ranks_failure_leaves_the_traceback_to_that_rank():
    # ring.save's refusal on rank 0 is raised on every rank (errors.on_rank): rank 1 printed the same traceback as
    # rank 0 when rank 0's failure post was not on the board yet (the two write at the same moment), 3 copies in
    # all with the report's. Rank 1 now says in one line that it stopped because of rank 0, post or not.
    from ringtrain.errors import RingtrainError, on_rank

    b0, b1 = boards()
    one = liveness.Membership(b1, backward_syncs=False, error_file=None, watch=False)
    assert b1.first_peer_post() is None  # rank 0 has not posted yet
    assert one._a_peer_failed(on_rank(RingtrainError("rank 0: refused", "h"), 0))
    zero = liveness.Membership(b0, backward_syncs=False, error_file=None, watch=False)
    assert not zero._a_peer_failed(on_rank(RingtrainError("rank 0: refused", "h"), 0))  # rank 0 prints its own
    assert not one._a_peer_failed(RingtrainError("rank 1's own", "h"))
