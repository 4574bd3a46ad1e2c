"""The board's seal: a post another process forged into the store is ignored and named; the job's own are read."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from ringtrain.liveness import seal as seals
from ringtrain.liveness.board import PREFIX, Board
from ringtrain.errors import RingtrainError
from ringtrain.liveness.records import Exit, Post, Whereabouts

pytestmark = pytest.mark.timeout(60)


def _boards(secret: str | None, world: int = 2):
    store = dist.HashStore()
    return store, [Board(store, r, world, "0-0", seals.Seal(secret)) for r in range(world)]


def _forge(store, rank: int, text: str) -> None:
    """What another process can do with a TCPStore client on the job's port."""
    store.set(f"{PREFIX}/0-0/rank/{rank}", text)
    store.append(f"{PREFIX}/0-0/posted", f"{rank},")
    store.add(f"{PREFIX}/0-0/count", 1)


def test_sealed_posts_are_read_and_a_forged_one_is_ignored_and_named_once(capsys):
    store, (zero, one) = _boards("s3cret")
    fake = Post(rank=1, state="failed", reason="forged: rank 1 failed", time=1.0).to_json()
    _forge(store, 1, fake)
    assert zero.read() == {} and zero.first_peer_post() is None
    zero.read()  # read again: still one line for the key
    err = capsys.readouterr().err
    assert err.count(f"ignored a post on the job's store under '{PREFIX}/0-0/rank/1'") == 1
    assert "not sealed" in err

    one.post("failed", "ValueError: boom")  # the real rank 1 posts: sealed, read by its peer
    assert zero.read()[1].reason == "ValueError: boom"
    assert zero.first_peer_post().as_blame().describe() == "rank 1 failed (ValueError: boom)"


def test_a_post_sealed_with_another_secret_or_under_another_key_is_ignored(capsys):
    store, (zero, _) = _boards("job-a")
    other = seals.Seal("job-b")
    text = Post(rank=1, state="failed", reason="x", time=1.0).to_json()
    _forge(store, 1, other.seal(f"{PREFIX}/0-0/rank/1", text))
    assert zero.read() == {}
    assert "does not match" in capsys.readouterr().err
    # A genuine seal replayed under another rank's key (or generation) does not open either.
    mine = seals.Seal("job-a")
    _forge(store, 1, mine.seal(f"{PREFIX}/0-0/rank/0", text))
    assert zero.read() == {}


def test_a_forged_hello_or_whereabouts_is_ignored(capsys):
    store, (zero, one) = _boards("k")
    zero.hello()
    store.set(f"{PREFIX}/0-0/hello/1", json.dumps({"pid": 1, "host": "x", "hostname": "x"}))
    assert zero.hellos() == {} and zero.neighbours() is None  # not every rank is known: no pid is trusted
    assert sorted(zero.hellos_so_far()) == [0]
    one.hello()
    assert sorted(zero.hellos()) == [0, 1]
    store.set(f"{PREFIX}/0-0/where/1", json.dumps({"rank": 1, "pid": 1, "host": "x", "hostname": "x", "beat": 0}))
    assert zero.whereabouts() == {}


def test_without_a_secret_everything_is_read_as_before():
    store, (zero, one) = _boards(None)
    _forge(store, 1, Post(rank=1, state="failed", reason="plain", time=1.0).to_json())
    assert zero.read()[1].reason == "plain"
    sealed = seals.Seal("k").seal(f"{PREFIX}/0-0/rank/1", Post(rank=1, state="failed", reason="s", time=2.0).to_json())
    _forge(store, 1, sealed)  # a sealed post read by a process without the secret: taken at its word
    assert zero.read()[1].reason == "s"


def test_an_agent_posts_a_killed_rank_which_peers_blame():
    store, (zero, one) = _boards("k")
    agent = Board(store, -1, 2, "0-0", seals.Seal("k"))
    agent.post_exit(Exit(rank=0, pid=4242, hostname="node-a", exitcode=-9, time=5.0))
    blame = one.first_peer_post().as_blame()
    assert blame.describe() == "rank 0 was killed by SIGKILL (the OOM killer?) on host node-a, pid 4242"


def test_a_forged_posted_list_naming_a_rank_without_a_post_does_not_block_the_reader():
    store, (zero, one, _) = _boards("k", world=3)
    one.post("finished", "process exit")
    store.append(f"{PREFIX}/0-0/posted", "2,")  # rank 2 never posted: a get would wait until the store's timeout
    assert sorted(zero.read()) == [1]


def test_job_secret_policy(tmp_path):
    assert seals.job_secret(False)[0]  # one node: made here
    secret, warning = seals.job_secret(True)
    assert secret is None and "RINGTRAIN_JOB_SECRET" in warning and "HINT:" in warning
    assert seals.job_secret(True, "given") == ("given", None)
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert seals.job_secret(True, None, str(path)) == ("from-file", None)
    path.write_text("\n")
    with pytest.raises(RingtrainError, match="RINGTRAIN_JOB_SECRET_FILE=.* is empty"):
        seals.job_secret(True, None, str(path))
    with pytest.raises(RingtrainError, match="cannot be read"):
        seals.job_secret(True, None, str(tmp_path / "missing"))


# --- bound to the job (issue 37, item 1) ------------------------------------------------------------------------

def _job(secret: str = "one-secret-for-two-jobs", world: int = 2, generation: str = "0-0", agent: str | None = None):
    """A job's boards as its ranks hold them once the group formed: every rank said hello, then bound."""
    store = dist.HashStore()
    ranks = [Board(store, r, world, generation, seals.Seal(secret), agent=agent) for r in range(world)]
    for board in ranks:
        board.hello()
    for board in ranks:
        assert board.bind(wait_s=1.0)
    return store, ranks


def _copy(src, dst, key: str) -> None:
    """What a local user with no secret can do: record a job's value from its store, write it into another's."""
    dst.set(key, src.get(key))
    generation = key.split("/")[2]
    dst.append(f"{PREFIX}/{generation}/posted", f"{key.rsplit('/', 1)[1]},")
    dst.add(f"{PREFIX}/{generation}/count", 1)


def test_a_failure_post_replayed_from_another_job_with_the_same_secret_is_ignored_and_said_once(capsys):
    store_a, (_, a1) = _job()
    a1.post("failed", "RuntimeError: injected failure")
    store_b, (b0, b1) = _job()
    _copy(store_a, store_b, f"{PREFIX}/0-0/rank/1")  # the same key in every job
    assert b0.read() == {} and b0.first_peer_post() is None
    b0.read()
    err = capsys.readouterr().err
    assert err.count(f"ignored a post on the job's store under '{PREFIX}/0-0/rank/1'") == 1, err
    assert "sealed for another job" in err and "injected failure" not in err
    b1.post("failed", "ValueError: real")  # the job's own rank still ends it
    assert b0.first_peer_post().as_blame().describe() == "rank 1 failed (ValueError: real)"


def test_a_post_of_another_attempt_or_formation_of_the_same_job_is_ignored():
    store, (_, one) = _job(generation="0-0")
    one.post("failed", "the first attempt's failure")
    _, (later, _) = _job(generation="1-0")
    raw = store.get(f"{PREFIX}/0-0/rank/1")
    # Under the later generation's key: neither the key in the MAC nor the job's key (its hellos' nonces) matches.
    later.store.set("rank/1", raw)
    later.store.append("posted", "1,")
    assert later.read() == {}


def test_a_replayed_hello_lets_no_post_of_its_job_in_and_names_no_pid_once_bound(capsys):
    store_a, (_, a1) = _job()
    a1.post("failed", "RuntimeError: injected failure")
    store_b = dist.HashStore()
    b0, b1 = (Board(store_b, r, 2, "0-0", seals.Seal("one-secret-for-two-jobs")) for r in (0, 1))
    b0.hello()
    b1.hello()
    store_b.set(f"{PREFIX}/0-0/hello/1", store_a.get(f"{PREFIX}/0-0/hello/1"))  # before rank 0 binds
    assert b0.bind(wait_s=1.0) and b1.bind(wait_s=1.0)
    _copy(store_a, store_b, f"{PREFIX}/0-0/rank/1")
    assert b0.read() == {}  # rank 0's key came from job A's hello 1 and its own: one nobody ever sealed with
    b1.post("failed", "ValueError: real")
    assert b0.read() == {}  # ...so the real rank 1 goes unheard too: a denial, said, never job A's word taken
    assert "sealed for another job" in capsys.readouterr().err
    # Once bound, the hellos are those the key came from: one written over them later names no pid to look at.
    _, (c0, c1) = _job()
    pid = c0.hellos()[1]["pid"]
    c0.store.set("hello/1", store_a.get(f"{PREFIX}/0-0/hello/1"))
    assert c0.hellos()[1]["pid"] == pid and c0.hellos_so_far()[1]["pid"] == pid
    assert c0.clone().hellos()[1]["pid"] == pid  # the watchdog's connection knows the key too


def test_the_launcher_reads_its_own_jobs_board_and_not_one_copied_from_another_job(capsys):
    from ringtrain.liveness.board import job_board

    secret = "one-secret-for-two-jobs"
    store_a, (_, a1) = _job(secret, agent="job-a-agent")
    a1.post("failed", "RuntimeError: injected failure")
    store_b, (_, b1) = _job(secret, agent="job-b-agent")  # job B's launcher, and its workers
    b1.post("failed", "ValueError: real")
    board = job_board(store_b, secret=secret, agent="job-b-agent")
    assert board.read()[1].reason == "ValueError: real"  # the agent learnt the key from its workers' hellos
    board.post_exit(Exit(rank=0, pid=4242, hostname="node-a", exitcode=-9, time=5.0))
    assert b1.read()[0].as_blame().describe().startswith("rank 0 was killed by SIGKILL")  # ...and its ranks read it
    for r in (0, 1):  # every hello replaced by job A's (and A's post): a consistent set, but not this job's
        store_b.set(f"{PREFIX}/0-0/hello/{r}", store_a.get(f"{PREFIX}/0-0/hello/{r}"))
    store_b.set(f"{PREFIX}/0-0/rank/1", store_a.get(f"{PREFIX}/0-0/rank/1"))
    assert job_board(store_b, secret=secret, agent="job-b-agent") is None
    assert job_board(store_b, secret=secret, agent="job-b-agent") is None
    err = capsys.readouterr().err
    assert err.count("none is from this launcher's workers") == 2 and "injected failure" not in err  # per board


def test_a_plain_scripts_boards_bind_once_every_rank_said_hello():
    """A script without a ring: its observer says hello when it sees the group (worker.py), at its own moment, and
    its exit post comes from a board of its own (membership.leave_process): both learn the key when they can."""
    store = dist.HashStore()
    zero, one = (Board(store, r, 2, "0-0", seals.Seal("k")) for r in (0, 1))
    zero.hello()
    zero.publish(Whereabouts(rank=0, pid=1, host="h", hostname="h", beat=1.0))  # only rank 0 said hello: unbound
    assert one.whereabouts()[0].beat == 1.0
    one.hello()
    one.post("failed", "ValueError: boom")  # every hello there: bound, and so is whoever reads it
    assert zero.read()[1].reason == "ValueError: boom"
    assert seals.Seal.job_of(store.get(f"{PREFIX}/0-0/rank/1"))
    leaving = Board(store, 0, 2, "0-0", seals.Seal("k"))  # rank 0's exit board: the hello there is this process's own
    assert leaving.read()[1].reason == "ValueError: boom"
    # Rank 1's hello replaced by one of another process (sealed with the same secret): a board of rank 1 that
    # said no hello itself does not bind to it, and says so.
    store.set(f"{PREFIX}/0-0/hello/1", seals.Seal("k").seal(f"{PREFIX}/0-0/hello/1", '{"pid": 1, "host": "x"}'))
    other = Board(store, 1, 2, "0-0", seals.Seal("k"))
    assert not other.bind() and other.refused
