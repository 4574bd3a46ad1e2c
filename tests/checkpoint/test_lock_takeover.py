"""Taking a checkpoint folder over from its holder: only from one that is provably gone (checkpoint/lock.py).

Issue 37, item 3: a run id is not a job — a holder in another pid namespace (or on another host) carrying
this run's id is refused like any holder that cannot be checked. Item 8: where the file system has no
``flock`` (simulated: ``fcntl.flock`` raises ENOLCK, as on an NFS mount without a lock manager), two jobs
taking over one stale lock at once never both win; a claim left by a process killed in the middle of a
take-over is refused there, with the way out, and cleared where ``flock`` guards the folder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest

from _launch_util import child_env

import ringtrain as rt
from ringtrain.checkpoint.lock import LOCK, FolderLock, Owner
from ringtrain.liveness import procs
from ringtrain.parallel.contract import read

ROUNDS = 20


def _gone_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _write_lock(folder, owner: Owner) -> None:
    folder.mkdir(exist_ok=True)
    (folder / LOCK).write_text(json.dumps(asdict(owner)))


def _owner_of(pid: int, **changes) -> Owner:
    return replace(Owner.me("torchrun 456"), **{"pid": pid, "start": procs.start_ticks(pid), **changes})


def _no_flock(*_args, **_kwargs):
    raise OSError(errno.ENOLCK, "No locks available")


@pytest.mark.timeout(60)
@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0, reason="needs root and unshare (util-linux)")
def test_a_live_holder_with_this_run_id_in_another_pid_namespace_is_refused(tmp_path):
    """The holder, ``TORCHELASTIC_RUN_ID=456`` in a pid namespace of its own, runs; this process carries the same
    run id. It used to take the folder over as "an earlier attempt of this job"."""
    folder, ready = tmp_path / "ckpt", tmp_path / "ready"
    folder.mkdir()
    code = (f"import os, time, pathlib; from ringtrain.checkpoint import lock; from ringtrain.parallel import contract; "
            f"lock.FolderLock({str(folder)!r}).acquire(contract.read().job); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                              env=child_env(TORCHELASTIC_RUN_ID="456"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 45
        while not ready.exists():
            assert holder.poll() is None, holder.communicate()[0]
            assert time.monotonic() < deadline, "the holder never took the folder"
            time.sleep(0.05)
        held = json.loads((folder / LOCK).read_text())
        assert held["job"] == "torchrun 456" and held["pidns"] != procs.pid_namespace()
        with pytest.raises(rt.RingtrainError) as info:
            FolderLock(str(folder)).acquire(read({"TORCHELASTIC_RUN_ID": "456"}).job)
        said = str(info.value)
        assert (f"is locked by pid {held['pid']} on host {held['host']} (pid namespace {held['pidns']}, "
                f"torchrun 456, holding it since {held['since']})") in said
        assert "from another pid namespace of this host it cannot be told whether that job is still running" in said
        assert "the same run id (torchrun 456) does not make it the same job" in said
        assert f"delete {folder / LOCK} and start again" in said and "HINT: stop that job" in said
        assert json.loads((folder / LOCK).read_text()) == held  # nothing taken
    finally:
        holder.kill()
        holder.wait()


def test_a_gone_holder_of_this_job_in_this_namespace_is_still_taken_over(tmp_path):
    """A restarted attempt (the same run id, this pid namespace) whose holder is provably gone takes over."""
    folder = tmp_path / "ckpt"
    holder = _owner_of(_gone_pid(), token="theirs")
    _write_lock(folder, holder)
    lock = FolderLock(str(folder))
    said = lock.acquire("torchrun 456")
    assert said is not None and said.startswith(f"ringtrain: took over checkpoint_dir {folder} from pid {holder.pid}")
    assert said.endswith("which is no longer running")
    assert json.loads((folder / LOCK).read_text())["token"] == lock.owner.token
    lock.release()
    assert os.listdir(folder) == []  # no claim left behind


def test_a_holder_when_this_proc_is_another_namespaces_cannot_be_checked(tmp_path, monkeypatch):
    """Under ``unshare --pid --fork`` without ``--mount-proc``, /proc is the outer namespace's: a pid of this
    namespace read there is another process, or none. Nothing can be concluded: the holder is not taken over."""
    folder = tmp_path / "ckpt"
    _write_lock(folder, _owner_of(_gone_pid()))
    real_readlink = os.readlink
    monkeypatch.setattr(procs.os, "readlink",
                        lambda path, *a, **k: "1" if path == "/proc/self" else real_readlink(path, *a, **k))
    with pytest.raises(rt.RingtrainError, match="cannot be told whether that job is still running"):
        FolderLock(str(folder)).acquire("torchrun 456")


def _contender(folder_of, start, done, results) -> None:
    """One job's rank 0 on a file system with no flock: takes each round's folder as soon as the round starts.
    Each read of the lock (or a claim) takes 20 ms, as on a slow network file system: between what a contender
    read and what it does, the other acts — the window a take-over must be safe across."""
    fcntl.flock = _no_flock
    read = FolderLock._read

    def slow_read(lock: FolderLock, *args):
        got = read(lock, *args)
        time.sleep(0.02)
        return got

    FolderLock._read = slow_read
    held = []  # kept alive: a winner holds its folder while the other contender judges it
    for round_ in range(ROUNDS):
        start.wait()
        lock = FolderLock(folder_of(round_))
        try:
            lock.acquire("torchrun 456")
            held.append(lock)
            results.put((round_, os.getpid(), "won", ""))
        except rt.RingtrainError as e:
            results.put((round_, os.getpid(), "refused", str(e)))
        except Exception as e:  # anything else is a failure of the lock, reported rather than a silent hang
            results.put((round_, os.getpid(), "failed", repr(e)))
        done.wait()
    results.close()
    results.join_thread()  # the queue's feeder thread has sent everything: os._exit would drop what it holds
    os._exit(0)  # no atexit: the locks are left as a killed job leaves them


class _Folders:
    def __init__(self, root):
        self.root = root

    def __call__(self, round_: int) -> str:
        return str(self.root / f"ckpt-{round_}")


@pytest.mark.timeout(120)
def test_without_flock_two_jobs_never_both_take_over_one_stale_lock(tmp_path):
    """Issue 37, item 8: 20 rounds, two contenders released together on a folder whose holder is gone, flock
    unavailable. Before, both took it over in 19 or 20 of the 20 rounds, each believing it held the folder."""
    folders = _Folders(tmp_path)
    stale = _owner_of(_gone_pid())
    for round_ in range(ROUNDS):
        _write_lock(tmp_path / f"ckpt-{round_}", replace(stale, token=f"stale-{round_}"))
    ctx = multiprocessing.get_context("fork")
    start, done, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    contenders = [ctx.Process(target=_contender, args=(folders, start, done, results)) for _ in range(2)]
    for c in contenders:
        c.start()
    outcomes = [results.get(timeout=100) for _ in range(2 * ROUNDS)]
    for c in contenders:
        c.join(timeout=30)
    by_round = {r: [o for o in outcomes if o[0] == r] for r in range(ROUNDS)}
    double = [r for r, got in by_round.items() if [o[2] for o in got].count("won") > 1]
    print(f"two winners in {len(double)}/{ROUNDS} rounds")
    assert not double, f"two jobs both took over the stale lock in rounds {double} of {ROUNDS}"
    assert not [o for o in outcomes if o[2] == "failed"], outcomes
    for round_, got in by_round.items():
        assert sorted(o[2] for o in got) == ["refused", "won"], got
        winner = next(o[1] for o in got if o[2] == "won")
        assert json.loads(open(os.path.join(folders(round_), LOCK)).read())["pid"] == winner
        refusal = next(o[3] for o in got if o[2] == "refused")
        assert f"is in use by another job: pid {winner} on host" in refusal, refusal
        assert sorted(os.listdir(folders(round_))) == [LOCK]  # no claim left behind


def test_without_flock_a_lone_restart_still_takes_over_a_gone_holder(tmp_path, monkeypatch, capsys):
    """No flock (an NFS mount without a lock manager): the take-over goes through its claim, still automatic."""
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    folder = tmp_path / "ckpt"
    _write_lock(folder, _owner_of(_gone_pid()))
    ring = rt.Ring(checkpoint_dir=str(folder), save_every=2)
    assert "which is no longer running" in capsys.readouterr().out
    assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
    ring.close()
    assert os.listdir(folder) == []


def _stale_claim(folder) -> tuple[Owner, str]:
    """A folder whose holder is gone, and a claim on it by a contender killed in the middle of its take-over."""
    holder = _owner_of(_gone_pid(), token="dead-holder")
    _write_lock(folder, holder)
    claim = FolderLock(str(folder)).claim_path(holder)
    with open(claim, "w") as f:
        json.dump(asdict(_owner_of(_gone_pid(), token="dead-claimant")), f)
    return holder, claim


def test_without_flock_a_claim_left_by_a_killed_contender_is_refused_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    folder = tmp_path / "ckpt"
    holder, claim = _stale_claim(folder)
    with pytest.raises(rt.RingtrainError) as info:
        FolderLock(str(folder)).acquire("torchrun 456")
    said = str(info.value)
    assert f"is locked by pid {holder.pid}" in said and "was killed while taking it over" in said
    assert "has no flock" in said
    assert f"HINT: if no other job is starting on this folder, delete {folder / LOCK} and {claim}" in said
    assert "or put checkpoint_dir on a file system with locks" in said
    assert json.loads((folder / LOCK).read_text())["token"] == "dead-holder" and os.path.exists(claim)


def test_with_flock_a_claim_left_by_a_killed_contender_is_cleared(tmp_path):
    folder = tmp_path / "ckpt"
    _, claim = _stale_claim(folder)
    lock = FolderLock(str(folder))
    assert lock.acquire("torchrun 456").endswith("which is no longer running")
    assert not os.path.exists(claim)
    lock.release()
    assert os.listdir(folder) == []
