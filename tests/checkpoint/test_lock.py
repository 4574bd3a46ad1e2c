"""One checkpoint folder, one job (folder_lock.py).

End to end with real jobs (``ringtrain run``, 2 Gloo ranks): a second job started on a folder a
running job holds is refused, naming the holder, and the first ends exactly as it would alone — also
when the second carries the first's run id (``--rdzv-id 456``) from another pid namespace; a
job whose rank 0 was SIGKILLed is restarted by the launcher, takes the folder over from its dead
holder and resumes. Then the holder rules, on locks written by hand: a live process refuses, a
gone one (or a reused pid) is taken over, another host is refused with the explicit way out, whatever run
id it carries. More on take-overs (item 8 of issue 37: no flock) in test_lock_takeover.py.
"""

from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace

import _fault_jobs as jobs
import pytest
import torch

from _launch_util import child_env, outputs, results

import ringtrain as rt
from ringtrain.checkpoint import lock as folder_lock
from ringtrain.checkpoint.lock import LOCK, FolderLock, Owner
from ringtrain.liveness import procs


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> torch.Tensor:
    """The parameters of the training job run alone (lr 0.1, 15 steps, checkpoints every 3)."""
    proc, paths = jobs.run_train(tmp_path_factory.mktemp("alone"))
    assert proc.returncode == 0, outputs(proc)
    return torch.load(paths["out"])


def _wait_for(path, proc: subprocess.Popen, seconds: float = 150) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the first job ended before {path.name}:\n{proc.communicate()}"
        assert time.monotonic() < deadline, f"no {path} after {seconds} s"
        time.sleep(0.05)


@pytest.mark.timeout(420)
def test_second_job_on_a_held_folder_is_refused_and_the_first_ends_as_alone(tmp_path, alone):
    # The first job holds the folder and stops after step 5 (a checkpoint of step 3 is in it) until told to go
    # on; meanwhile a second job, with another learning rate, is started on the same folder.
    first_dir, second_dir, hold = tmp_path / "first", tmp_path / "second", tmp_path / "hold"
    hold.mkdir()
    paths = jobs.train_paths(first_dir)
    second_dir.mkdir()
    (second_dir / "log").mkdir()
    first = subprocess.Popen(jobs.train_command(first_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env(**{jobs.HOLD_AT_STEP: "5", jobs.HOLD_DIR: str(hold)}))
    try:
        _wait_for(hold / "holding", first)
        holder = json.loads((paths["ckpt"] / LOCK).read_text())
        second_cmd = jobs.train_command(second_dir, "--lr", "0.05")
        second_cmd[second_cmd.index("--ckpt") + 1] = str(paths["ckpt"])
        second = subprocess.run(second_cmd, capture_output=True, text=True, timeout=200, env=child_env())
    finally:
        (hold / "go").touch()
        out, err = first.communicate(timeout=200)
    assert first.returncode == 0, f"{out}\n{err}"
    assert [(r["rank"], r["steps"]) for r in results(out)] == [("0", "15"), ("1", "15")], out
    assert "resumed from" not in out and "took over" not in out

    # The second job was refused at Ring(...), before training, naming the holder; it left nothing behind.
    assert second.returncode != 0, outputs(second)
    said = second.stdout + second.stderr
    assert f"is in use by another job: pid {holder['pid']} on host {holder['host']}" in said, outputs(second)
    assert "HINT: give this run a checkpoint_dir of its own" in said, outputs(second)
    assert not results(second.stdout) and not (second_dir / "params.pt").exists()
    # The first ended with the parameters it has alone, and gave the folder back.
    assert (torch.load(paths["out"]) - alone).abs().max().item() <= 1e-6
    assert sorted(os.listdir(paths["ckpt"])) == ["losses", "manifest.json", "step-000000012.pt", "step-000000015.pt"]


def _with_run_id(command: list[str], run_id: str) -> list[str]:
    """``ringtrain run --rdzv-id RUN_ID ...``: the run id as torchrun tutorials give it."""
    at = command.index("run") + 1
    return [*command[:at], "--rdzv-id", run_id, *command[at:]]


@pytest.mark.timeout(420)
@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0, reason="needs root and unshare (util-linux)")
def test_a_second_job_with_the_same_run_id_in_another_pid_namespace_is_refused_while_the_first_runs(tmp_path, alone):
    """Issue 37, item 3: two jobs given one ``--rdzv-id 456`` (TORCHELASTIC_RUN_ID) are two jobs. The second,
    started in a pid namespace of its own (``unshare --pid``, as a container would), cannot check the first's
    rank 0 from there: it used to take the folder over as "an earlier attempt of this job" and resume the first's
    checkpoint while the first trained on. It is refused, naming the holder, and the first ends as alone."""
    first_dir, second_dir, hold = tmp_path / "first", tmp_path / "second", tmp_path / "hold"
    hold.mkdir()
    paths = jobs.train_paths(first_dir)
    second_dir.mkdir()
    (second_dir / "log").mkdir()
    first = subprocess.Popen(_with_run_id(jobs.train_command(first_dir), "456"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=child_env(**{jobs.HOLD_AT_STEP: "5", jobs.HOLD_DIR: str(hold)}))
    try:
        _wait_for(hold / "holding", first)
        holder = json.loads((paths["ckpt"] / LOCK).read_text())
        assert holder["job"] == "torchrun 456" and holder["pidns"] == procs.pid_namespace()
        second_cmd = _with_run_id(jobs.train_command(second_dir), "456")  # the same script: it would resume
        second_cmd[second_cmd.index("--ckpt") + 1] = str(paths["ckpt"])
        second = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *second_cmd], capture_output=True,
                                text=True, timeout=200, env=child_env())
        lock_after = json.loads((paths["ckpt"] / LOCK).read_text()) if (paths["ckpt"] / LOCK).exists() else None
    finally:
        (hold / "go").touch()
        out, err = first.communicate(timeout=200)
    said = second.stdout + second.stderr
    assert second.returncode != 0 and "took over" not in said and "resumed from" not in said, outputs(second)
    assert lock_after == holder, outputs(second)  # the folder stayed the first's while it ran
    assert (f"is locked by pid {holder['pid']} on host {holder['host']} (pid namespace {holder['pidns']}, "
            f"torchrun 456, holding it since {holder['since']})") in said, outputs(second)
    assert "from another pid namespace of this host it cannot be told whether that job is still running" in said
    assert "the same run id (torchrun 456) does not make it the same job" in said, outputs(second)
    assert (f"HINT: stop that job, or give this run a checkpoint_dir of its own; if you know it is not running, "
            f"delete {paths['ckpt'] / LOCK} and start again") in said, outputs(second)
    assert not results(second.stdout) and not (second_dir / "params.pt").exists()
    assert first.returncode == 0, f"{out}\n{err}"
    assert [(r["rank"], r["steps"]) for r in results(out)] == [("0", "15"), ("1", "15")], out
    assert "resumed from" not in out and "took over" not in out
    assert (torch.load(paths["out"]) - alone).abs().max().item() <= 1e-6
    assert sorted(os.listdir(paths["ckpt"])) == ["losses", "manifest.json", "step-000000012.pt", "step-000000015.pt"]


def test_a_job_killed_with_sigkill_and_started_again_takes_the_folder_over_and_resumes(tmp_path, capsys):
    # One process, SIGKILLed while committing step 4's checkpoint: its lock stays, naming a pid that is gone.
    folder = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, jobs.__file__, "ckpt-kill", "--folder", str(folder), "--point", "temp-partial"],
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == -9, outputs(proc)
    holder = json.loads((folder / LOCK).read_text())
    assert holder["pid"] != os.getpid() and Owner(**holder).state() == "gone"  # the killed process's
    params = jobs.checkpointed_run(str(folder))  # the same job, started again (here, in this process)
    said = capsys.readouterr().out
    assert f"ringtrain: took over checkpoint_dir {folder} from pid {holder['pid']} on host {holder['host']}" in said
    assert "which is no longer running" in said
    assert f"ringtrain: resumed from {folder / 'step-000000002.pt'}" in said
    assert (params - jobs.checkpointed_run(str(tmp_path / "alone"))).abs().max().item() <= 1e-6
    assert not (folder / LOCK).exists()


@pytest.mark.stress
@pytest.mark.timeout(300)
def test_restart_after_rank_0_is_killed_takes_the_folder_over_and_resumes(tmp_path, alone):
    # Rank 0, the folder's holder, SIGKILLs itself after step 8; torchrun restarts the workers. The new rank 0
    # finds the lock of a process that is gone, takes it over and resumes from step 6.
    proc, paths = jobs.run_train(tmp_path / "run", **{jobs.KILL_AT_STEP: "8", jobs.KILL_RANK: "0",
                                                      jobs.KILL_MARKER: str(tmp_path / "killed")})
    assert proc.returncode == 0, outputs(proc)
    assert (tmp_path / "killed").exists()
    lines = proc.stdout.splitlines()
    took = [line for line in lines if line.startswith("ringtrain: took over checkpoint_dir")]
    assert len(took) == 1 and took[0].endswith("which is no longer running"), outputs(proc)
    assert [line for line in lines if line.startswith("ringtrain: resumed from")] == [
        f"ringtrain: resumed from {paths['ckpt'] / 'step-000000006.pt'} (epoch 1, step 6)"], outputs(proc)
    assert (torch.load(paths["out"]) - alone).abs().max().item() <= 1e-6
    assert not (paths["ckpt"] / LOCK).exists()


# --- the holder rules, on locks written by hand ----------------------------------------------

def _write_lock(folder, owner: Owner) -> None:
    folder.mkdir(exist_ok=True)
    (folder / LOCK).write_text(json.dumps(asdict(owner)))


def _owner_of(pid: int, **changes) -> Owner:
    fields = {"pid": pid, "start": procs.start_ticks(pid), **changes}
    return replace(Owner.me("torchrun test-job"), **fields)


def test_a_live_holder_refuses_and_nothing_changes(tmp_path):
    folder = tmp_path / "ckpt"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        holder = _owner_of(other.pid)
        _write_lock(folder, holder)
        with pytest.raises(rt.RingtrainError, match=f"in use by another job: pid {other.pid} on host") as info:
            rt.Ring(checkpoint_dir=str(folder), save_every=2)
        assert "HINT:" in str(info.value) and f"kill {other.pid}" in str(info.value)
        assert json.loads((folder / LOCK).read_text()) == asdict(holder)
        assert os.listdir(folder) == [LOCK]
    finally:
        other.kill()
        other.wait()


def test_a_gone_holder_or_a_reused_pid_is_taken_over_with_a_message(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / "ckpt"
    for holder in (_owner_of(gone.pid), _owner_of(os.getppid(), start="1")):  # a live pid that started at another time
        _write_lock(folder, holder)
        ring = rt.Ring(checkpoint_dir=str(folder), save_every=2)
        said = capsys.readouterr().out
        assert f"took over checkpoint_dir {folder} from pid {holder.pid} on host" in said
        assert "which is no longer running" in said
        assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
        ring.close()
        assert not (folder / LOCK).exists()


def test_a_holder_from_before_this_machine_restarted_is_taken_over(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    _write_lock(folder, _owner_of(os.getpid(), boot="an-earlier-boot", token="theirs"))  # this host, another boot
    lock = FolderLock(str(folder))
    said = lock.acquire("torchrun a-different-job")
    assert said is not None and said.endswith("which ran before this machine restarted")
    lock.release()
    assert not (folder / LOCK).exists()


def test_a_holder_on_another_host_is_refused_with_the_way_to_take_over(tmp_path):
    folder = tmp_path / "ckpt"
    holder = _owner_of(1, host="another-node", boot="x", start="")
    _write_lock(folder, holder)
    lock = FolderLock(str(folder))
    with pytest.raises(rt.RingtrainError, match="on host another-node") as info:
        lock.acquire("torchrun a-different-job")
    assert "cannot be told whether that job is still running" in str(info.value)
    assert (f"if you know it is not running, delete {folder / LOCK} and start again") in str(info.value)
    # Carrying this run's id proves nothing (issue 37, item 3: two jobs can be given one --rdzv-id): refused too.
    with pytest.raises(rt.RingtrainError, match="the same run id \\(torchrun test-job\\) does not make it the same"):
        lock.acquire("torchrun test-job")
    assert json.loads((folder / LOCK).read_text()) == asdict(holder)
    # Deleted by hand (the way out the message gives), the folder is this run's.
    (folder / LOCK).unlink()
    assert lock.acquire("torchrun test-job") is None
    lock.release()
    assert not (folder / LOCK).exists()


def test_a_second_ring_in_one_process_replaces_the_lock_and_releases_only_its_own(tmp_path):
    folder = tmp_path / "ckpt"
    first = rt.Ring(checkpoint_dir=str(folder), save_every=2)
    second = rt.Ring(checkpoint_dir=str(folder), save_every=2)  # the same process: no refusal
    token = json.loads((folder / LOCK).read_text())["token"]
    first.close()  # not its lock any more: left for the second
    assert json.loads((folder / LOCK).read_text())["token"] == token
    second.close()
    assert os.listdir(folder) == []


def test_an_unreadable_lock_is_refused_not_overwritten(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / LOCK).write_text('{"host": "h", "pi')
    with pytest.raises(rt.RingtrainError, match="is unreadable") as info:
        rt.Ring(checkpoint_dir=str(folder), save_every=2)
    assert "HINT:" in str(info.value)
    assert (folder / LOCK).read_text() == '{"host": "h", "pi'


def test_job_names_come_from_the_launcher():
    from ringtrain.parallel.contract import read  # the job's name is the launcher contract's

    assert read({"TORCHELASTIC_RUN_ID": "abc"}).job == "torchrun abc"
    assert read({"TORCHELASTIC_RUN_ID": "none"}).job is None  # torchrun's default names no job
    assert read({"SLURM_JOB_ID": "42"}).job == "Slurm job 42"
    assert read({}).job is None


def test_a_lock_written_before_the_pid_namespace_was_recorded_still_reads(tmp_path, capsys):
    """A lock of an older ringtrain (no ``pidns``) is read; its holder is judged by host, boot, pid and start."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / "ckpt"
    old = {k: v for k, v in asdict(_owner_of(gone.pid)).items() if k != "pidns"}
    folder.mkdir()
    (folder / LOCK).write_text(json.dumps(old))
    lock = FolderLock(str(folder))
    said = lock.acquire(None)
    assert said is not None and said.endswith("which is no longer running")
    lock.release()


@pytest.mark.timeout(60)
@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0, reason="needs root and unshare (util-linux)")
def test_a_live_holder_in_another_pid_namespace_is_not_taken_over(tmp_path):
    """Issue 31, item 5: a job started with `unshare --pid --fork --mount-proc` holds the folder as pid 1 of its
    own namespace; seen from here, pid 1 is init, which started at another time — so it looked gone and was taken
    over while it ran. Its pid namespace differs from ours: it cannot be judged from here, and is refused."""
    folder = tmp_path / "ckpt"
    ready = tmp_path / "ready"
    code = (f"import time, pathlib; from ringtrain.checkpoint.lock import FolderLock; "
            f"FolderLock({str(folder)!r}).acquire(None); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    folder.mkdir()
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 45
        while not ready.exists():
            assert holder.poll() is None, holder.communicate()[0]
            assert time.monotonic() < deadline, "the holder never took the folder"
            time.sleep(0.05)
        held = json.loads((folder / LOCK).read_text())
        assert held["pidns"] and held["pidns"] != procs.pid_namespace()
        with pytest.raises(rt.RingtrainError, match="another pid namespace of this host") as info:
            FolderLock(str(folder)).acquire("torchrun another-job")
        assert "cannot be told whether that job is still running" in str(info.value)
        assert json.loads((folder / LOCK).read_text()) == held  # nothing taken
    finally:
        holder.kill()
        holder.wait()
