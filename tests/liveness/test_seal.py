"""The board's seal: a post another process forged into the store is ignored and named; the job's own are read."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from ringtrain.liveness import seal as seals
from ringtrain.liveness.board import PREFIX, Board
from ringtrain.errors import RingtrainError
from ringtrain.liveness.records import Exit, Post

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
    assert seals.job_secret(False, {})[0]  # one node: made here
    secret, warning = seals.job_secret(True, {})
    assert secret is None and "RINGTRAIN_JOB_SECRET" in warning and "HINT:" in warning
    assert seals.job_secret(True, {seals.SECRET_ENV: "given"}) == ("given", None)
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert seals.job_secret(True, {seals.SECRET_FILE_ENV: str(path)}) == ("from-file", None)
    path.write_text("\n")
    with pytest.raises(RingtrainError, match="is empty"):
        seals.job_secret(True, {seals.SECRET_FILE_ENV: str(path)})
    with pytest.raises(RingtrainError, match="cannot be read"):
        seals.job_secret(True, {seals.SECRET_FILE_ENV: str(tmp_path / "missing")})
