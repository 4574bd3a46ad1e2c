"""The store's trust, end to end: another local process forges "rank 1 failed" into a running job's store
(a TCPStore client on the job's port, as anyone on the machine can open). The job ignores it, says which
key it ignored, and finishes normally. (A real rank's sealed post still ends a job: test_launch_failfast.)
And a one-node job told to listen beyond loopback says so."""

from __future__ import annotations

import datetime
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


def test_a_one_node_job_listening_beyond_loopback_is_warned_about(tmp_path):
    script = write(tmp_path / "job.py", "print('ran', flush=True)\n")
    proc = subprocess.run(ringtrain_cmd("run", "--nproc-per-node", "1", "--master-addr", "0.0.0.0", str(script)),
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr
    assert "--master-addr 0.0.0.0 is not a loopback address" in proc.stderr
    assert "HINT: leave --master-addr out" in proc.stderr
