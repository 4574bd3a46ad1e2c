"""A checkpoint reached by some ranks only (issue 36, item 7): ``if ring.is_main: ring.save(...)`` ends in seconds,
naming ring.save, what the other rank really does and the fix — not at the collective's 30-minute timeout.

The decision (stall.one_sided_checkpoint) is tested over hand-made whereabouts, the watchdog's check on a real
in-process store, and the whole path in real 2-rank `ringtrain run` jobs (tests/helpers/_checkpoint_jobs.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import _checkpoint_jobs as jobs
import pytest
import torch.distributed as dist

from _launch_util import child_env, ringtrain_cmd

from ringtrain.liveness import membership as liveness, stall
from ringtrain.liveness.activity import Activity, checkpoint_call, in_collective
from ringtrain.liveness.records import Whereabouts
from ringtrain.liveness.watchdog import CheckpointOnSomeRanks, Publisher

pytestmark = pytest.mark.timeout(150)

NOW = 1000.0
AFTER = 5.0
SAVE_LINE = next(i for i, text in enumerate(open(jobs.__file__), 1) if "# on rank 0 only: it waits for ever" in text)


def _view(rank: int, **fields) -> Whereabouts:
    return Whereabouts(rank=rank, pid=100 + rank, host="h", hostname="node", beat=fields.pop("beat", NOW - 0.5), **fields)


def _saving(rank: int = 0, **fields) -> Whereabouts:
    """A rank in ring.save, waiting in its first collective since 20 s: 13 collectives issued before the save."""
    return _view(rank, **{"checkpoint": "ring.save", "checkpoint_at": 13, "issued": 14, "phase": "collective",
                          "waiting": "broadcast_object(src=0) #2", "waiting_since": NOW - 20, "seq": 2, "step": 4,
                          "site": "train.py:60 in main", **fields})


def _in_backward(rank: int = 1, **fields) -> Whereabouts:
    """A rank that went on into the next step's gradient all-reduce (issued: the 14th collective)."""
    return _view(rank, **{"issued": 14, "phase": "backward", "waiting": "backward (gradient all-reduce)",
                          "waiting_since": NOW - 19, "seq": 1, "step": 4, "site": "train.py:52 in main", **fields})


def test_a_save_one_rank_waits_in_while_the_other_is_in_the_next_step_is_named_with_the_fix():
    found = stall.one_sided_checkpoint(0, 2, {0: _saving(), 1: _in_backward()}, NOW, AFTER)
    assert found is not None
    message, hint = found
    assert message == ("ring.save waits for the other ranks (in broadcast_object(src=0) #2), but rank 1 is in the "
                       "gradient all-reduce of step 5 at train.py:52 in main — ring.save runs on every rank and writes "
                       "the file once (from rank 0); called on some ranks only, it waits for ever.")
    assert hint == "call ring.save on every rank: remove the `if ring.is_main:` (or rank check) around it; it saves once."
    # the other rank's phase label says nothing: its collective and its line do
    stale = _in_backward(phase="evaluation")
    assert "rank 1 is in the gradient all-reduce of step 5 at train.py:52" in \
        stall.one_sided_checkpoint(0, 2, {0: _saving(), 1: stale}, NOW, AFTER)[0]
    # a ring collective, with its number
    other = _in_backward(waiting="all_reduce(op=mean, float32[3]) #2", phase="collective", seq=2)
    assert "rank 1 is in all_reduce(op=mean, float32[3]) #2 at train.py:52" in \
        stall.one_sided_checkpoint(0, 2, {0: _saving(), 1: other}, NOW, AFTER)[0]


def test_ring_load_and_the_periodic_checkpoint_get_their_own_words():
    message, hint = stall.one_sided_checkpoint(0, 2, {0: _saving(checkpoint="ring.load", waiting="load"),
                                                      1: _in_backward()}, NOW, AFTER)
    assert message.startswith("ring.load waits for the other ranks (in load), but rank 1 is in the gradient all-reduce")
    assert "ring.load runs on every rank" in message and hint.startswith("call ring.load on every rank")
    message, hint = stall.one_sided_checkpoint(0, 2, {0: _saving(checkpoint="the periodic checkpoint"),
                                                      1: _in_backward()}, NOW, AFTER)
    assert "every rank writes the periodic checkpoint, at the same step" in message
    assert "if ring.is_main" not in hint and "the same steps of the loop" in hint


@pytest.mark.parametrize("peer, why", [
    (_in_backward(waiting=None, waiting_since=None, phase="forward"), "the peer computes"),
    (_in_backward(waiting=None, waiting_since=None, phase="evaluation"), "the peer evaluates"),
    (_in_backward(waiting_since=NOW - 2), "the peer waits, but not for long yet"),
    (_in_backward(beat=NOW - 10), "the peer's word is stale (frozen, or holding the GIL)"),
    (_in_backward(checkpoint="ring.save", checkpoint_at=13, waiting="gather_object() #2"), "both in the same save"),
    (_in_backward(checkpoint="ring.save", checkpoint_at=13, waiting="broadcast_object(src=0) #2"), "the same call"),
    # DDP's forward (an evaluation that takes long) looks like the engine's frames: but it issued nothing since the
    # save began, so it may still come to it
    (_in_backward(waiting="forward", phase="evaluation", issued=13), "the peer is behind, in a long forward"),
    (_in_backward(issued=None), "no collective count to compare"),
])
def test_no_stop_without_a_proven_deadlock(peer, why):
    assert stall.one_sided_checkpoint(0, 2, {0: _saving(), 1: peer}, NOW, AFTER) is None, why


def test_no_stop_while_this_rank_waits_less_than_the_bound_or_is_in_no_checkpoint():
    assert stall.one_sided_checkpoint(0, 2, {0: _saving(waiting_since=NOW - 3), 1: _in_backward()}, NOW, AFTER) is None
    # its phase still says checkpoint after ring.save returned: that is not being in one
    after = _saving(checkpoint=None, checkpoint_at=None, phase="checkpoint", waiting="all_reduce(op=sum, int64[1]) #3")
    assert stall.one_sided_checkpoint(0, 2, {0: after, 1: _in_backward()}, NOW, AFTER) is None
    assert stall.one_sided_checkpoint(0, 2, {0: _saving()}, NOW, AFTER) is None  # rank 1 never said where it is


def test_among_several_ranks_every_one_must_wait_and_the_lowest_in_the_save_speaks():
    views = {0: _saving(0), 1: _in_backward(1), 2: _saving(2), 3: _in_backward(3, site="train.py:53 in main")}
    message, _ = stall.one_sided_checkpoint(0, 4, views, NOW, AFTER)
    assert ("but rank 1 is in the gradient all-reduce of step 5 at train.py:52 in main; rank 3 is in the gradient "
            "all-reduce of step 5 at train.py:53 in main —") in message
    assert stall.one_sided_checkpoint(2, 4, views, NOW, AFTER) is None  # rank 0's post stops rank 2
    computing = {**views, 3: _in_backward(3, waiting=None, waiting_since=None, phase="forward")}
    assert stall.one_sided_checkpoint(0, 4, computing, NOW, AFTER) is None


def test_a_checkpoint_s_phase_outlives_its_call_but_its_word_does_not():
    assert _view(0, phase="checkpoint").doing() == "outside any collective"  # ring.save returned long ago
    assert _view(0, phase="checkpoint", checkpoint="ring.save").doing() == "in ring.save"
    assert _view(0, phase="evaluation", waiting="backward (gradient all-reduce)").doing() == \
        "in backward (gradient all-reduce)"
    assert Whereabouts.from_json(_saving().to_json()) == _saving()


# --- the activity: which checkpoint, and whether it still runs ------------------------------------------

def save(activity: Activity, release: threading.Event | None = None):
    """What ring.save does first (checkpoint/state_files.py): enter the phase; then, with ``release``, wait in a ring
    collective (in c10d's frames) until released. Returns what the watchdog sees inside."""
    activity.enter("checkpoint")
    if release is not None:
        with activity.calling("broadcast_object(src=0)"):
            _in_engine("torch.distributed.distributed_c10d", release)
    return checkpoint_call(activity, sys._getframe())


def autosave(activity: Activity):
    """The periodic save: it enters the phase, then writes through ring.save's code, which enters it again."""
    activity.enter("checkpoint")
    inner = save(activity)
    return inner, checkpoint_call(activity, sys._getframe())


def test_checkpoint_call_names_the_call_and_the_count_it_began_at_while_it_runs_only():
    counts = iter(range(13, 100))
    activity = Activity(sequence=lambda: next(counts))
    assert checkpoint_call(activity) is None
    assert save(activity) == ("ring.save", 13)
    assert activity.phase == "checkpoint" and checkpoint_call(activity, sys._getframe()) is None  # returned
    assert save(activity) == ("ring.save", 14)  # a new save: a new count
    inner, outer = autosave(activity)
    assert inner == outer == ("the periodic checkpoint", 15)  # the save inside is the periodic one's
    assert not in_collective(activity, sys._getframe())
    with activity.calling("broadcast_object(src=0)"):
        assert in_collective(activity, sys._getframe())  # a ring collective waits for its peers


# A frame of torch.distributed's c10d (its collective calls) and one of its other modules (local work).
_ENGINE = "def call(event):\n    event.wait(10)\n"


def _in_engine(module: str, event: threading.Event) -> None:
    namespace: dict = {"__name__": module}
    exec(compile(_ENGINE, f"<{module}>", "exec"), namespace)
    namespace["call"](event)


@pytest.mark.parametrize("module, expected", [("torch.distributed.distributed_c10d", True),
                                              ("torch.distributed.checkpoint.filesystem", False)])
def test_only_the_engine_s_collective_calls_are_for_sure_waits(module, expected):
    seen = []
    release = threading.Event()

    def look() -> None:
        time.sleep(0.2)
        seen.append(in_collective(None))
        release.set()

    looker = threading.Thread(target=look)
    looker.start()
    _in_engine(module, release)
    looker.join()
    assert seen == [expected]


# --- the watchdog's check, on a real store ----------------------------------------------------------

def test_the_rank_in_the_save_stops_as_the_cause_and_its_peer_is_stopped_by_its_post():
    store = dist.HashStore()
    b0, b1 = (liveness.Board(store, rank, 2, "0-0") for rank in (0, 1))
    activity = Activity(sequence=lambda: 13)
    dog = liveness.Watchdog(b0, activity, backward_syncs=True, error_file=None, sequence=lambda: 14,
                            checks=[Publisher(), CheckpointOnSomeRanks(after_s=0.6)])
    verdicts = []
    release = threading.Event()

    def peer() -> Whereabouts:  # rank 1, in the next step's gradient all-reduce since the save began
        return _in_backward(1, beat=time.time(), waiting_since=time.time() - 30)

    def look() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not verdicts:
            b1.publish(peer())
            verdict = dog.check()
            if verdict:
                verdicts.append(verdict)
            time.sleep(0.1)
        release.set()

    looker = threading.Thread(target=look)
    looker.start()
    save(activity, release)
    looker.join()
    assert verdicts, "the rank in the save was never stopped"
    message, info = verdicts[0]
    assert message.startswith("ringtrain: rank 0 stops: ring.save waits for the other ranks (in "
                              "broadcast_object(src=0) #1), but rank 1 is in the gradient all-reduce of step 5 at "
                              "train.py:52 in main"), message
    assert message.endswith("\nHINT: call ring.save on every rank: remove the `if ring.is_main:` (or rank check) "
                            "around it; it saves once.")
    assert info["cause"] == "own" and info["during"] == "broadcast_object(src=0) #1"
    assert "ringtrain: rank 0 stops: ring.save" in info["stack"]  # the launcher's report shows it after the stack
    post = b1.read()[0]
    assert post.state == "failed" and post.cause == "own" and post.reason.startswith("ring.save waits")
    # rank 1's watchdog stops it at once, blaming rank 0
    message, info = liveness.Watchdog(b1, backward_syncs=True, error_file=None).check()
    assert message.startswith("ringtrain: rank 1 stops: rank 0 failed (ring.save waits")
    assert info["blame"]["rank"] == 0


# --- real 2-rank jobs ---------------------------------------------------------------------------------

FAULT = r"^JOB fault rank=\d t=([\d.]+)"
STARTUP_S = 90  # launch to the fault: imports and 4 steps, bounded for a loaded machine


def _run(mode: str, cwd, within: float) -> tuple[subprocess.Popen, str, float | None]:
    """Run the job in ``cwd``; (its process, its output, seconds from the fault to its end — None if it did not
    end within ``within`` seconds of the fault: killed then)."""
    proc = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", jobs.__file__, mode), cwd=cwd,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    fault, deadline = None, time.monotonic() + STARTUP_S + within
    while proc.poll() is None and time.monotonic() < deadline:
        if fault is None and (found := re.search(FAULT, "".join(lines), re.M)):
            fault = float(found.group(1))
            deadline = min(deadline, time.monotonic() + within - (time.time() - fault))
        time.sleep(0.1)
    ended = proc.poll() is not None
    if not ended:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers die with the launcher (PR_SET_PDEATHSIG)
    proc.wait(30)
    reader.join(10)
    text = "".join(lines)
    if fault is None and (found := re.search(FAULT, text, re.M)):
        fault = float(found.group(1))
    took = time.time() - fault if ended and fault is not None else None
    return proc, text, took


def test_a_save_called_on_rank_0_only_ends_the_job_in_seconds_naming_it_and_the_fix(tmp_path):
    proc, text, took = _run("save", tmp_path, within=60)
    assert took is not None, f"the job still waited 60 s after rank 0 called ring.save alone:\n{text[-6000:]}"
    print(f"ring.save on rank 0 only: the job ended {took:.1f} s after the fault")
    assert proc.returncode != 0 and took < 40, text
    assert "JOB done" not in text
    stop = next(line for line in text.splitlines() if line.startswith("ringtrain: rank 0 stops: "))
    assert stop.startswith("ringtrain: rank 0 stops: ring.save waits for the other ranks (in broadcast_object"), stop
    assert "but rank 1 is in the gradient all-reduce of step 5 at" in stop and "_checkpoint_jobs.py:" in stop
    assert "ring.save runs on every rank" in stop and "waits for ever" in stop
    assert ("HINT: call ring.save on every rank: remove the `if ring.is_main:` (or rank check) around it; it saves "
            "once.") in text
    assert re.search(r"^ringtrain: rank 1 (stops: |stopped because )rank 0 failed \(ring\.save waits", text, re.M), text
    # the launcher names rank 0, the one in ring.save, as the cause, with its line
    report = text[text.index("ringtrain run:"):]
    assert report.startswith("ringtrain run: worker rank 0 failed first"), report
    assert f'_checkpoint_jobs.py", line {SAVE_LINE}' in report and "ring.save runs on every rank" in report


def test_a_sharded_load_on_rank_0_only_ends_the_job_in_seconds(tmp_path):
    proc, text, took = _run("load", tmp_path, within=60)
    assert took is not None, f"the job still waited 60 s after rank 0 called ring.load alone:\n{text[-6000:]}"
    print(f"ring.load on rank 0 only: the job ended {took:.1f} s after the fault")
    assert proc.returncode != 0 and took < 40, text
    assert "ringtrain: rank 0 stops: ring.load waits for the other ranks" in text, text
    assert "but rank 1 is in the gradient all-reduce of step 5 at" in text
    assert "HINT: call ring.load on every rank" in text


def test_a_peer_that_is_slow_to_reach_the_save_is_never_stopped(tmp_path):
    """Rank 0 waits in ring.save for 8 s while rank 1 runs a long evaluation forward in DDP's frames (which look
    like the engine's): rank 1 issued no collective since, so it may still come — and it does."""
    proc, text, took = _run("slow", tmp_path, within=90)
    assert took is not None and proc.returncode == 0, text
    assert "stops:" not in text and text.count("JOB done") == 2, text
