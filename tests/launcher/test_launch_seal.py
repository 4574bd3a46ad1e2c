"""The store's trust, end to end: another local process forges "rank 1 failed" into a running job's store
(a TCPStore client on the job's port, as anyone on the machine can open). The job ignores it, says which
key it ignored, and finishes normally. (A real rank's sealed post still ends a job: test_launch_failfast.)
A real failure post recorded from another job with the same secret (the user's RINGTRAIN_JOB_SECRET, or the
loopback secret two-node jobs on one machine share) and replayed at the same key is ignored too (issue 37).
And a one-node job told to listen beyond loopback says so."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import threading
import time

import pytest
from _launch_util import child_env, free_port, ringtrain_cmd, write  # noqa: E402

pytestmark = pytest.mark.timeout(150)

JOB = """
    import os, sys, time
    import torch
    import ringtrain as rt

    ring = rt.Ring(strategy="ddp")
    out = sys.argv[1]
    open(os.path.join(out, f"ready.{ring.rank}"), "w").close()
    deadline = time.monotonic() + 100
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)  # both ranks alive and watching, outside any collective
    total = ring.all_reduce(torch.ones(1), "sum")
    os.write(1, f"RESULT rank={ring.rank} total={total.item():g}\\n".encode())
"""


def _forge(port: int) -> str:
    """Post a fake failure of rank 1 on the job's board: the key it wrote."""
    import torch.distributed as dist

    from ringtrain.liveness.records import Post

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    generation = store.get("ringtrain/live/current").decode()
    key = f"ringtrain/live/{generation}/rank/1"
    store.set(key, Post(rank=1, state="failed", reason="FORGED: rank 1 is out of memory", time=time.time()).to_json())
    store.append(f"ringtrain/live/{generation}/posted", "1,")
    store.add(f"ringtrain/live/{generation}/count", 1)
    return key


def test_a_forged_failure_post_is_ignored_and_named(tmp_path):
    script = write(tmp_path / "job.py", JOB)
    port = free_port()
    job = subprocess.Popen(ringtrain_cmd("run", "--nproc-per-node", "2", "--master-port", str(port), str(script),
                                         str(tmp_path)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    lines: list[str] = []
    ignored = threading.Event()

    def read_stderr() -> None:
        for line in job.stderr:
            lines.append(line)
            if "ignored a post on the job's store" in line:
                ignored.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 100
        while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        key = _forge(port)
        # Every rank's watchdog reads the board twice a second: wait for it to have read (and refused) the post.
        deadline = time.monotonic() + 60
        while not ignored.wait(0.2):
            assert job.poll() is None and time.monotonic() < deadline, "the forged post ended the job:\n" + "".join(lines)
        (tmp_path / "go").touch()
        out, _ = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    reader.join(10)
    err = "".join(lines)
    assert job.returncode == 0, err
    assert out.count("total=2") == 2, out + err
    assert f"ignored a post on the job's store under '{key}'" in err
    assert "FORGED" not in err


REPLAYED_JOB = """
    import os, sys, time
    import torch
    import ringtrain as rt

    ring = rt.Ring(strategy="ddp")
    out, name = sys.argv[1], sys.argv[2]
    open(os.path.join(out, f"{name}.ready.{ring.rank}"), "w").close()
    deadline = time.monotonic() + 100
    while not os.path.exists(os.path.join(out, f"{name}.go")) and time.monotonic() < deadline:
        time.sleep(0.05)  # both ranks alive and watching, outside any collective
    if name == "A" and ring.rank == 1:
        raise RuntimeError("injected failure")  # job A's real failure, posted (sealed) on A's board
    total = ring.all_reduce(torch.ones(1), "sum")
    os.write(1, f"RESULT rank={ring.rank} total={total.item():g}\\n".encode())
"""


class _Job:
    """One `ringtrain run` job of REPLAYED_JOB on one node (2 workers) or on two loopback nodes (1 each), its
    stderr read line by line as it comes."""

    def __init__(self, tmp_path, name: str, nodes: int, env: dict[str, str]):
        self.tmp_path, self.name, self.port = tmp_path, name, free_port()
        script = write(tmp_path / "job.py", REPLAYED_JOB)
        if nodes == 1:
            argvs = [["run", "--nproc-per-node", "2", "--master-port", str(self.port)]]
        else:
            argvs = [["run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(r), "--master-addr",
                      "127.0.0.1", "--master-port", str(self.port), "--timeout", "60"] for r in range(nodes)]
        self.procs = [subprocess.Popen(ringtrain_cmd(*argv, str(script), str(tmp_path), name), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env) for argv in argvs]
        self.outs: list[list[str]] = [[] for _ in self.procs]
        self.errs: list[list[str]] = [[] for _ in self.procs]
        self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                        for p, out, err in zip(self.procs, self.outs, self.errs)
                        for stream, lines in ((p.stdout, out), (p.stderr, err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def said(self) -> str:
        return "\n".join(f"--- job {self.name}, node {i}:\n" + "".join(lines) for i, lines in enumerate(self.errs))

    def wait_until(self, done, what: str, timeout: float = 100) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert all(p.poll() is None for p in self.procs), f"job {self.name} ended before {what}:\n{self.said()}"
            assert time.monotonic() < deadline, f"job {self.name}: no {what} in {timeout} s:\n{self.said()}"
            time.sleep(0.1)

    def ready(self) -> None:
        self.wait_until(lambda: all((self.tmp_path / f"{self.name}.ready.{r}").exists() for r in (0, 1)),
                        "ready ranks")

    def go(self) -> None:
        (self.tmp_path / f"{self.name}.go").touch()

    def end(self, timeout: float = 90) -> tuple[list[int], str]:
        try:
            for p in self.procs:
                p.wait(timeout=timeout)
        finally:
            self.kill()
        for reader in self.readers:
            reader.join(10)
        return [p.returncode for p in self.procs], "".join("".join(lines) for lines in self.outs)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60),
                         wait_for_workers=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nodes", [1, 2], ids=["same-secret-two-jobs", "two-loopback-nodes-two-jobs"])
def test_a_failure_post_replayed_from_another_job_with_the_same_secret_is_ignored(tmp_path, nodes):
    """Issue 37, item 1: a local user with no secret recorded job A's real "rank 1 failed" from its store and
    wrote it into healthy job B's store at the same key (`ringtrain/live/0-0/rank/1`, the same in every job):
    B ended rc 1 on every node, "rank 1 failed (RuntimeError: injected failure)". The two jobs share a secret:
    the user's RINGTRAIN_JOB_SECRET, or (two nodes on this machine) the loopback secret file in ~/.cache."""
    env = child_env(RINGTRAIN_STALL_WARNING="off", HOME=str(tmp_path / "home"))
    env.pop("RINGTRAIN_JOB_SECRET_FILE", None)
    if nodes == 1:
        env["RINGTRAIN_JOB_SECRET"] = "one-secret-for-two-jobs"
    else:
        env.pop("RINGTRAIN_JOB_SECRET", None)  # both jobs' nodes read ~/.cache/ringtrain/loopback-secret
    # Job A: its rank 1 fails for real; its post is recorded from A's store as it lands.
    a = _Job(tmp_path, "A", nodes, env)
    try:
        a.ready()
        store = _client(a.port)
        generation = store.get("ringtrain/live/current").decode()
        key = f"ringtrain/live/{generation}/rank/1"
        a.go()
        started = time.monotonic()
        store.wait([key])
        recorded = store.get(key)
        del store
        codes, _ = a.end()
        took = time.monotonic() - started
    finally:
        a.kill()
    assert set(codes) == {1} and b"injected failure" in recorded, a.said()
    # Within the job, the real failure is acted on at once (rank 0 would wait 30 minutes in its all_reduce) and
    # named: on one node torchrun's agent may stop rank 0 before its watchdog reads the post; node 0 of two learns
    # it from the board (its own watchdog's, or the report's reading).
    node0 = "".join(a.errs[0])
    assert "rank 1 failed (RuntimeError: injected failure)" in node0 or \
        (nodes == 1 and "worker rank 1 failed first" in node0), a.said()
    assert took < 60, f"job A took {took:.1f} s to end after its rank 1 failed"
    print(f"job A ended {took:.1f} s after its rank 1 failed")
    if nodes == 2:
        assert (tmp_path / "home" / ".cache" / "ringtrain" / "loopback-secret").exists()

    # Job B, healthy, the same secret: the recorded post written into its store at the same key.
    b = _Job(tmp_path, "B", nodes, env)
    ignored = f"ignored a post on the job's store under '{key}'"
    try:
        b.ready()
        store = _client(b.port)
        assert store.get("ringtrain/live/current").decode() == generation
        store.set(key, recorded)
        store.append(f"ringtrain/live/{generation}/posted", "1,")
        store.add(f"ringtrain/live/{generation}/count", 1)
        del store
        # Every rank's watchdog reads the board twice a second: wait until both ranks have read (and refused) it.
        b.wait_until(lambda: sum("".join(lines).count(ignored) for lines in b.errs) >= 2, "refusal of the replay",
                     timeout=60)
        # `ringtrain stacks` (SIGUSR1 on node 0's launcher) still reads B's board, and every rank answers it.
        os.kill(b.procs[0].pid, signal.SIGUSR1)
        b.wait_until(lambda: all(f"[rank {r}] " in b.said() for r in (0, 1)), "stacks of both ranks", timeout=60)
        b.go()
        codes, out = b.end()
    finally:
        b.kill()
    err = b.said()
    print(err)
    assert codes == [0] * nodes, err
    assert out.count("total=2") == 2, out + err
    assert "injected failure" not in err and "did not answer" not in err, err
    # Once per rank that read it (each rank reads the whole board), not at every poll; counted, not as lines: the
    # two ranks' stderr can meet on one line.
    assert err.count(ignored) == 2, err
    assert err.count("sealed for another job") == 2, err


def test_a_one_node_job_listening_beyond_loopback_is_warned_about(tmp_path):
    script = write(tmp_path / "job.py", "print('ran', flush=True)\n")
    proc = subprocess.run(ringtrain_cmd("run", "--nproc-per-node", "1", "--master-addr", "0.0.0.0", str(script)),
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr
    assert "--master-addr 0.0.0.0 is not a loopback address" in proc.stderr
    assert "HINT: leave --master-addr out" in proc.stderr
