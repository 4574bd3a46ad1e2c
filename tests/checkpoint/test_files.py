"""Checkpoints: rank-0 atomic writes, unwrapped state, plain-PyTorch loading, resume."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import _fault_jobs
import _ring_jobs as jobs
import ringtrain as rt
from ringtrain.checkpoint import files as checkpoint, rng
from ringtrain.checkpoint.folder import CheckpointDir
from ringtrain.checkpoint.temporaries import writer_tag

from _launch_util import child_env, outputs  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_saved_under_two_ranks_loads_in_plain_pytorch(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    params = run_ranks(jobs.train, 8, 1, save=path)[0]
    raw = torch.load(path)  # plain torch, default weights_only
    assert not any(k.startswith("module.") for k in raw["model"])
    plain = jobs.small_model()
    plain.load_state_dict(raw["model"])
    assert torch.equal(jobs.flat_params(plain), params)
    assert raw["epoch"] == 0 and "state" in raw["optimizer"]
    assert [f for f in os.listdir(tmp_path) if f != "ckpt.pt"] == [], "temporary files left behind"


def test_two_rank_checkpoint_loads_in_one_process(run_ranks, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    params = run_ranks(jobs.train, 8, 1, save=path)[0]
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    extras = ring.load(path, model=model)
    assert extras["epoch"] == 0
    assert torch.equal(jobs.flat_params(model), params)


def test_resume_mid_epoch_matches_uninterrupted_run(run_ranks, tmp_path):
    path = str(tmp_path / "mid.pt")
    full = run_ranks(jobs.train, 8, 2)
    run_ranks(jobs.train, 8, 2, save=path, save_after_batches=3)
    resumed = run_ranks(jobs.train, 8, 2, load=path)
    assert (resumed[0] - full[0]).abs().max().item() <= 1e-6


def test_resume_at_epoch_boundary_matches_uninterrupted_run(tmp_path):
    path = str(tmp_path / "epoch.pt")
    full = jobs.train(16, 3)
    jobs.train(16, 2, save=path)
    resumed = jobs.train(16, 3, load=path)
    assert (resumed - full).abs().max().item() <= 1e-6


def test_loads_plain_state_dict_with_or_without_module_prefix(tmp_path):
    src = jobs.small_model()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(1.0)
    for name, sd in {
        "plain.pt": src.state_dict(),
        "prefixed.pt": {f"module.{k}": v for k, v in src.state_dict().items()},
        "nested.pt": {"model": {f"module.{k}": v for k, v in src.state_dict().items()}},
    }.items():
        torch.save(sd, tmp_path / name)
        ring = rt.Ring()
        model = ring.setup(jobs.small_model())
        ring.load(str(tmp_path / name), model=model)
        assert torch.equal(jobs.flat_params(model), jobs.flat_params(src)), name


def test_wrong_model_lists_missing_and_unexpected_keys(tmp_path):
    torch.save({"model": torch.nn.Linear(3, 3).state_dict()}, tmp_path / "other.pt")
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    with pytest.raises(rt.RingtrainError, match="missing keys: 0.weight") as info:
        ring.load(str(tmp_path / "other.pt"), model=model)
    assert "unexpected keys: weight" in str(info.value) and "HINT:" in str(info.value)


def test_unreadable_and_missing_checkpoints(tmp_path):
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(rt.RingtrainError, match="cannot read the checkpoint"):
        ring.load(str(tmp_path / "junk.pt"), model=model)
    with pytest.raises(rt.RingtrainError, match="no checkpoint at"):
        ring.load(str(tmp_path / "absent.pt"), model=model)
    with pytest.raises(rt.RingtrainError, match="no entry 'net'"):
        ring.save(str(tmp_path / "ok.pt"), model=model)
        ring.load(str(tmp_path / "ok.pt"), net=model)


def test_checkpoint_with_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    ring = rt.Ring()
    with pytest.raises(rt.RingtrainError, match="weights_only"):
        ring.load(str(tmp_path / "evil.pt"), model=ring.setup(jobs.small_model()))


def test_failed_save_raises_on_every_rank_without_hanging(run_ranks, tmp_path):
    errors = run_ranks(jobs.save_failure, str(tmp_path / "missing-folder" / "ckpt.pt"))
    assert all("rank 0" in e and "does not exist" in e and "HINT:" in e for e in errors)


def test_atomic_save_keeps_previous_file_on_failure(tmp_path):
    path = tmp_path / "ckpt.pt"
    checkpoint.atomic_save({"v": torch.tensor(1)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        checkpoint.atomic_save({"v": Unpicklable()}, path)
    assert torch.load(path)["v"].item() == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_user_save_killed_mid_write_leaves_a_temporary_the_next_save_removes(tmp_path):
    path = tmp_path / "ckpt.pt"
    proc = subprocess.run([sys.executable, _fault_jobs.__file__, "user-save-kill", "--path", str(path)],
                          capture_output=True, text=True, timeout=90, env=child_env())
    assert proc.returncode == -9, outputs(proc)  # SIGKILL halfway through the temporary file
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".ckpt.pt.") and left.endswith(".tmp") and (tmp_path / left).stat().st_size > 0
    # Not touched: a temporary a live process is writing (this one), one from another host (cannot be checked).
    host, pid = writer_tag().split("-")
    live = tmp_path / f".other.pt.{host}-{pid}.abcd_123.tmp"
    remote = tmp_path / f".other.pt.{'0' if host[0] != '0' else '1'}{host[1:]}-1.abcd_123.tmp"
    for other in (live, remote):
        other.write_bytes(b"being written")
    ring = rt.Ring()
    ring.save(str(path), model=ring.setup(jobs.small_model()))
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, remote.name, "ckpt.pt"])


def test_a_sharded_user_save_killed_mid_write_leaves_a_staging_folder_the_next_save_removes(tmp_path):
    path = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, _fault_jobs.__file__, "user-save-kill", "--path", str(path), "--sharded"],
                          capture_output=True, text=True, timeout=90, env=child_env())
    assert proc.returncode == -9, outputs(proc)  # SIGKILL with the shards written, the folder not yet in place
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".ckpt.") and left.endswith(".tmp") and (tmp_path / left).is_dir(), left
    assert any(n.endswith(".distcp") for n in os.listdir(tmp_path / left))
    # Not touched: a staging folder a live process is writing (this one), one from another host.
    host, pid = writer_tag().split("-")
    live = tmp_path / f".other.{host}-{pid}.abcd_123.tmp"
    remote = tmp_path / f".other.{'0' if host[0] != '0' else '1'}{host[1:]}-1.abcd_123.tmp"
    for other in (live, remote):
        other.mkdir()
        (other / "__0_0.distcp").write_bytes(b"being written")
    ring = rt.Ring()
    model = ring.setup(jobs.small_model())
    ring.save(str(path), model=model, full=False)
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, remote.name, "ckpt"])
    fresh = jobs.small_model()
    ring.load(str(path), model=fresh)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_a_full_disk_at_the_manifest_write_is_named_and_the_old_manifest_kept(tmp_path):
    # Step 2's checkpoint and manifest are written; at step 4 the checkpoint file is written, then the file
    # system refuses the new manifest (ENOSPC at the OS call).
    folder = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, _fault_jobs.__file__, "manifest-full", "--folder", str(folder)],
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 3, outputs(proc)
    manifest = folder / "manifest.json"
    assert (f"ERROR RingtrainError: rank 0: cannot write the checkpoint manifest {str(manifest)!r}: No space left on "
            "device (OSError, errno 28)\nHINT: check the folder's free space (df -h) and permissions (ls -ld), then "
            "try again; the previous manifest is kept, so the newest checkpoint it lists is still the one resumed "
            "from.") in proc.stdout, outputs(proc)
    assert [e["step"] for e in json.loads(manifest.read_text())["checkpoints"]] == [2]
    assert sorted(os.listdir(folder)) == ["losses", "manifest.json", "step-000000002.pt", "step-000000004.pt"]
    assert CheckpointDir(folder).latest_readable() == str(folder / "step-000000002.pt")


def test_rng_state_round_trip():
    state = rng.capture_rng()
    a = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    rng.restore_rng(state)
    b = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


# --- the checkpoint folder: never lose a checkpoint, never touch a file outside it ---------

def _snapshot(root) -> dict:
    """Every file under ``root`` (links not followed): its bytes, or where a link points."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = ("file", f.read())
    return out


@pytest.fixture
def outside(tmp_path):
    """A folder beside the checkpoint folder with a file that looks like a checkpoint; ``check()``
    asserts at the end of the test that nothing in it was changed, removed or added."""
    folder = tmp_path / "outside"
    folder.mkdir()
    victim = folder / "victim.pt"
    checkpoint.atomic_save({"model": jobs.small_model().state_dict(), checkpoint.META_KEY: {"epoch": 99}}, victim)
    before = _snapshot(folder)
    yield victim
    assert _snapshot(folder) == before, "a file outside the checkpoint folder was touched"


def _committed(folder, steps, keep_last=3) -> CheckpointDir:
    """A folder holding real (tiny) ring checkpoints of ``steps``, committed in order."""
    d = CheckpointDir(folder, keep_last=keep_last)
    os.makedirs(folder, exist_ok=True)
    for step in steps:
        payload = {"model": jobs.small_model().state_dict(), checkpoint.META_KEY: {"optimizer_steps": step}}
        checkpoint.atomic_save(payload, d.path_for(step))
        d.commit(d.path_for(step), step=step)
    return d


def _steps_seen(seen: list, steps: int, batch: int = 4) -> list:
    return seen[: steps * batch]


def test_prepare_deletes_only_ringtrain_temporaries(tmp_path, outside):
    d = _committed(tmp_path / "ckpt", [2])
    folder = tmp_path / "ckpt"
    ours = [".step-000000004.pt.k2j_9x1a.tmp", ".manifest.json.0ab_cdef.tmp", ".ringtrain-write-check.zz01.tmp"]
    for name in ours:
        (folder / name).write_bytes(b"half")
    theirs = ["notes.tmp", ".cache.tmp", "step-000000099.pt", "model-best.pt", ".step-000000004.pt.tmp.bak"]
    for name in theirs:
        (folder / name).write_bytes(b"user data")
    (folder / ".step-000000006.pt.abc.tmp").mkdir()  # our shape, but a folder: not ours
    (folder / ".step-000000008.pt.abc.tmp").symlink_to(outside)  # our shape, but a link: not ours
    with pytest.warns(UserWarning, match="does not list.*step-000000099.pt"):
        d.prepare()
    left = set(os.listdir(folder))
    assert not left & set(ours)
    assert set(theirs) | {"step-000000002.pt", "manifest.json", ".step-000000006.pt.abc.tmp",
                          ".step-000000008.pt.abc.tmp"} == left
    assert d.latest_readable() == d.path_for(2)


def test_missing_manifest_is_rebuilt_from_readable_checkpoints(tmp_path, outside):
    d = _committed(tmp_path / "ckpt", [2, 4, 6])
    os.unlink(os.path.join(d.folder, "manifest.json"))
    (tmp_path / "ckpt" / "step-000000008.pt").write_bytes(b"PK\x03\x04 truncated")  # unreadable: kept, not listed
    before = _snapshot(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match=r"rebuilt it .*step-000000002.pt, step-000000004.pt, step-000000006.pt; "
                                         r"left in place, not listed: step-000000008.pt"):
        d.prepare()
    after = _snapshot(tmp_path / "ckpt")
    assert {k: v for k, v in after.items() if k != "manifest.json"} == before, "a checkpoint was lost or changed"
    assert d.latest_readable() == d.path_for(6)
    assert [e["step"] for e in json.load(open(os.path.join(d.folder, "manifest.json")))["checkpoints"]] == [2, 4, 6]


def test_missing_manifest_resumes_from_the_newest_checkpoint(tmp_path, outside):
    full, seen_full = jobs.periodic(str(tmp_path / "full"), 3)
    folder = tmp_path / "run"
    _, seen_first = jobs.periodic(str(folder), 3, stop_at_step=15)  # checkpoints of steps 12 and 14
    os.unlink(folder / "manifest.json")  # e.g. only the .pt files were copied
    checkpoints = {k: v for k, v in _snapshot(folder).items()}
    with pytest.warns(UserWarning, match="rebuilt it from the complete checkpoints found: "
                                         "step-000000012.pt, step-000000014.pt"):
        resumed, seen_second = jobs.periodic(str(folder), 3)
    assert len(seen_second) == (30 - 14) * 4, "did not resume from step 14"
    assert sorted(_steps_seen(seen_first, 14) + seen_second) == sorted(seen_full)
    assert (resumed - full).abs().max().item() <= 1e-6
    assert set(checkpoints) - {"losses/rank-00000.txt"} == {"step-000000012.pt", "step-000000014.pt"}


def test_corrupt_newest_checkpoint_resumes_from_the_one_before(tmp_path, outside, capsys):
    full, seen_full = jobs.periodic(str(tmp_path / "full"), 3)
    folder = tmp_path / "run"
    _, seen_first = jobs.periodic(str(folder), 3, stop_at_step=15)  # checkpoints of steps 12 and 14
    newest = folder / "step-000000014.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # the disk kept only the start of it
    capsys.readouterr()
    resumed, seen_second = jobs.periodic(str(folder), 3)
    said = capsys.readouterr().out
    assert re.search(r"set aside the damaged checkpoint step-000000014.pt as step-000000014.pt.damaged \(.*\); "
                     r"resuming from step-000000012.pt", said), said
    assert (folder / "step-000000014.pt.damaged").exists()  # kept, out of the way: never deleted silently
    assert len(seen_second) == (30 - 12) * 4, "did not resume from step 12"
    assert sorted(_steps_seen(seen_first, 12) + seen_second) == sorted(seen_full)
    assert (resumed - full).abs().max().item() <= 1e-6


def test_every_listed_checkpoint_unreadable_is_an_error_not_a_fresh_start(tmp_path, outside):
    d = _committed(tmp_path / "ckpt", [2, 4])
    for step in (2, 4):
        open(d.path_for(step), "r+b").truncate(50)
    before = _snapshot(tmp_path / "ckpt")
    with pytest.raises(rt.RingtrainError, match="none of the checkpoints listed .* can be read") as info:
        d.latest_readable()
    assert "step-000000002.pt" in str(info.value) and "HINT:" in str(info.value)
    assert _snapshot(tmp_path / "ckpt") == before


@pytest.mark.parametrize("how", ["absolute", "dotdot", "subfolder", "link-out"])
def test_manifest_entry_leaving_the_folder_is_refused(tmp_path, outside, how):
    folder = tmp_path / "ckpt"
    d = _committed(folder, [2], keep_last=1)
    entry = {
        "absolute": str(outside),
        "dotdot": os.path.join("..", "outside", "victim.pt"),
        "subfolder": os.path.join("sub", "step-000000001.pt"),
        "link-out": "step-000000001.pt",
    }[how]
    if how == "link-out":
        (folder / entry).symlink_to(outside)
    if how == "subfolder":
        (folder / "sub").mkdir()
        checkpoint.atomic_save({"model": {}, checkpoint.META_KEY: {}}, folder / entry)
    manifest = json.load(open(os.path.join(d.folder, "manifest.json")))
    # The foreign entry first: it is the oldest, so rotation would delete it, and
    # alone in the manifest it would be the one to resume from.
    manifest["checkpoints"].insert(0, {"file": entry, "step": 1})
    with open(os.path.join(d.folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    before = _snapshot(folder)
    for attempt in (lambda: d.commit(d.path_for(2), step=2),  # keep_last=1: would delete the oldest entry
                    lambda: d.prepare(), lambda: d.latest_readable(), lambda: d.latest()):
        with pytest.raises(rt.RingtrainError, match="lists .*(not a file name inside|outside the folder)") as info:
            attempt()
        assert "HINT: manifest entries are plain file names" in str(info.value)
    with pytest.raises(rt.RingtrainError, match="lists"):
        rt.Ring(checkpoint_dir=str(folder), save_every=1)
    assert _snapshot(folder) == before


def test_rotation_keeps_a_file_the_manifest_lists_twice(tmp_path):
    d = _committed(tmp_path / "ckpt", [2, 4], keep_last=2)
    manifest = json.load(open(os.path.join(d.folder, "manifest.json")))
    manifest["checkpoints"] = [manifest["checkpoints"][1]] + manifest["checkpoints"]  # 4, 2, 4
    with open(os.path.join(d.folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    checkpoint.atomic_save({"model": {}, checkpoint.META_KEY: {}}, d.path_for(6))
    d.commit(d.path_for(6), step=6)  # entries 4, 2, 4, 6: keeps 4, 6, drops 4 (still kept) and 2
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["manifest.json", "step-000000004.pt", "step-000000006.pt"]


@contextlib.contextmanager
def _read_only(folder):
    """Make ``folder`` refuse new files even to root: the immutable attribute (chattr +i),
    or, for a user other than root, chmod. Skips where neither can be had."""
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    if os.geteuid() == 0:
        pytest.skip("running as root on a file system without chattr +i: nothing can make a folder read-only here")
    os.chmod(folder, 0o555)
    try:
        yield
    finally:
        os.chmod(folder, 0o755)


def test_read_only_folder_is_found_before_training(tmp_path, outside):
    folder = tmp_path / "ckpt"
    _committed(folder, [2, 4])
    before = _snapshot(folder)
    with _read_only(folder):
        start = time.monotonic()
        with pytest.raises(rt.RingtrainError, match="is not writable") as info:
            rt.Ring(checkpoint_dir=str(folder), save_every=2)
        assert time.monotonic() - start < 10
        assert "HINT:" in str(info.value)
    assert _snapshot(folder) == before


@pytest.mark.parametrize("where", ["file-in-the-way", "parent-is-a-file", "parent-read-only"])
def test_uncreatable_folder_gets_a_hint(tmp_path, outside, where):
    parent = tmp_path / "parent"
    if where == "parent-read-only":
        parent.mkdir()
        folder = parent / "ckpt"
    else:
        parent.write_bytes(b"a file")
        folder = parent if where == "file-in-the-way" else parent / "ckpt"
    before = _snapshot(tmp_path)
    with _read_only(parent) if where == "parent-read-only" else contextlib.nullcontext():
        for attempt in (lambda: rt.Ring(checkpoint_dir=str(folder), save_every=2),
                        CheckpointDir(folder).prepare):
            with pytest.raises(rt.RingtrainError, match="(is not a folder|cannot create checkpoint_dir)") as info:
                attempt()
            assert "HINT:" in str(info.value)
    assert _snapshot(tmp_path) == before


def test_check_writable_creates_the_folder_and_leaves_nothing(tmp_path):
    folder = tmp_path / "a" / "b"
    CheckpointDir(folder).check_writable()
    assert os.listdir(folder) == []


# --- devices: checkpoints hold CPU tensors and load through the CPU ------------------------

def test_to_cpu_keeps_containers_and_state_dict_metadata():
    model = torch.nn.BatchNorm1d(3)
    state = model.state_dict()
    moved = checkpoint.to_cpu({"model": state, "list": [torch.ones(2, requires_grad=True)], "n": 3, "t": (torch.zeros(1),)})
    assert type(moved["model"]) is type(state) and moved["model"]._metadata == state._metadata
    assert not moved["list"][0].requires_grad and isinstance(moved["t"], tuple) and moved["n"] == 3
    torch.nn.BatchNorm1d(3).load_state_dict(moved["model"])


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
@pytest.mark.gpu
def test_gpu_checkpoint_is_cpu_on_disk_and_resumes_on_the_gpu(tmp_path):
    # A GPU-only defect: loading onto cuda:k brought numpy's RNG state back as a CUDA
    # tensor (restore failed) and Adam's step counters onto the GPU.
    path = str(tmp_path / "gpu.pt")
    ring = rt.Ring(device="cuda", seed=0)
    model = jobs.small_model()
    model, optimizer = ring.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    x, y = jobs.regression_data(8).tensors
    ring.backward(torch.nn.functional.cross_entropy(model(x.to(ring.device)), y.to(ring.device)))
    optimizer.step()
    ring.save(path, model=model, optimizer=optimizer)
    raw = torch.load(path)  # no map_location: where the file says the tensors live
    assert {t.device.type for t in raw["model"].values()} == {"cpu"}
    assert all(v.device.type == "cpu" for s in raw["optimizer"]["state"].values() for v in s.values())
    ring.load(path, model=model, optimizer=optimizer)
    for state in optimizer.state.values():
        assert state["step"].device.type == "cpu" and state["exp_avg"].device == ring.device
    ring.backward(torch.nn.functional.cross_entropy(model(x.to(ring.device)), y.to(ring.device)))
    optimizer.step()
    ring.close()
