"""A tampered ``.metadata`` costs its own checkpoint only (issue 37, item 2).

The exact-name unpickler of DCP's ``.metadata`` handed pickle the class objects of its table
(``pathlib.PosixPath``, DCP's dataclasses); pickle's BUILD with slot state then ``setattr``s on the class
(``PosixPath.__fspath__ = 0``), for the whole process: every later checkpoint read failed, each was set aside
as damaged and the run went back to step 0. Here: every way a pickle can set attributes on what it was handed
is refused and changes nothing in the process; a poisoned newest checkpoint of three (FSDP, sharded) is set aside
alone and the run resumes the one before, weights equal; payloads too deep, too large or with colliding keys are
refused in milliseconds; a ``.metadata`` of the wrong shape is that folder's problem, not an exception that ends
the resume; and a checkpoint is set aside only once an older one has loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pickle
import time
import tracemalloc
import warnings

import _poison_jobs as jobs
import _ring_jobs
import pytest
import torch

import ringtrain as rt
from ringtrain.checkpoint import files, metadata, sharded
from ringtrain.checkpoint.state_files import StateFiles

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")

META = "torch.distributed.checkpoint.metadata"


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _s(module) + _s(name) + b"\x93"  # STACK_GLOBAL


def _dict(items: dict[str, int]) -> bytes:
    return b"}(" + b"".join(_s(k) + b"K" + bytes([v]) for k, v in items.items()) + b"u"


def _slot_build(target: bytes, attrs: dict[str, int]) -> bytes:
    """BUILD with a (None, slotstate) state: pickle ``setattr``s each item on the object, a class included."""
    return target + b"N" + _dict(attrs) + b"\x86b0"


def _dict_build(target: bytes, attrs: dict[str, int]) -> bytes:
    """BUILD with a dict state: pickle updates the object's ``__dict__`` (a function's, an enum member's)."""
    return target + _dict(attrs) + b"b0"


MEMBER = _global(META, "_MEM_FORMAT_ENCODING") + b"K\x00\x85R"  # _MEM_FORMAT_ENCODING(0): a process-wide member

# What a pickle can set attributes on, before a real metadata follows (so the file itself still reads whole).
POISON = {
    "PosixPath.__fspath__ = 0 (the finding)": _slot_build(_global("pathlib", "PosixPath"), {"__fspath__": 0}),
    "PurePosixPath.__str__ = 0": _slot_build(_global("pathlib", "PurePosixPath"), {"__str__": 0}),
    "PosixPath.__fspath__ = 0 ((empty dict, slot state))": _global("pathlib", "PosixPath") + b"}" + _dict(
        {"__fspath__": 0}) + b"\x86b0",
    "Metadata.__eq__ = 0": _slot_build(_global(META, "Metadata"), {"__eq__": 0}),
    "TensorStorageMetadata.chunks = 0": _slot_build(_global(META, "TensorStorageMetadata"), {"chunks": 0}),
    "ChunkStorageMetadata.poisoned": _slot_build(_global(META, "ChunkStorageMetadata"), {"poisoned": 1}),
    "BytesStorageMetadata.poisoned": _slot_build(_global(META, "BytesStorageMetadata"), {"poisoned": 1}),
    "StorageMeta.modules = 0": _slot_build(_global(META, "StorageMeta"), {"modules": 0}),
    "MetadataIndex.__hash__ = 0": _slot_build(_global(META, "MetadataIndex"), {"__hash__": 0}),
    "_StorageInfo.relative_path": _slot_build(
        _global("torch.distributed.checkpoint.filesystem", "_StorageInfo"), {"relative_path": 0}),
    "_MEM_FORMAT_ENCODING.poisoned": _slot_build(_global(META, "_MEM_FORMAT_ENCODING"), {"poisoned": 1}),
    "an enum member's _value_ (dict state)": _dict_build(MEMBER, {"_value_": 7}),
    "an enum member's _value_ (slot state)": _slot_build(MEMBER, {"_value_": 7}),
    "the layout reader's __dict__ (dict state)": _dict_build(_global("torch.serialization", "_get_layout"),
                                                             {"poisoned": 1}),
}


@pytest.fixture
def real_metadata(tmp_path) -> bytes:
    """A real DCP ``.metadata``: bf16 and fp32 tensors, a value (BytesStorageMetadata), a path."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"a": torch.zeros(3, dtype=torch.bfloat16), "b": torch.ones(2, 2), "c": {"x": 1}},
                 checkpoint_id=str(tmp_path / "real"))
    return (tmp_path / "real" / ".metadata").read_bytes()


@contextlib.contextmanager
def restored():
    """The watched classes (and the enum's members) put back as they were on the way out, whatever was done
    to them, so that a poisoned class (on a reader that lets it happen) cannot break pytest itself; yields the
    snapshot to compare with. Its assertions go after the block."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    before = jobs.snapshot()
    members = {m: dict(vars(m)) for m in _MEM_FORMAT_ENCODING}
    try:
        yield before
    finally:
        for cls in jobs.watched_classes():
            was = before[cls.__qualname__]
            for name in set(vars(cls)) - set(was):
                type.__delattr__(cls, name)
            for name, value in was.items():
                if vars(cls).get(name) is not value and name not in ("__dict__", "__weakref__", "__doc__"):
                    type.__setattr__(cls, name, value)
        for member, attrs in members.items():
            vars(member).clear()
            vars(member).update(attrs)


def _folder_with(tmp_path, data: bytes) -> str:
    folder = tmp_path / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".metadata").write_bytes(data)
    return str(folder)


@pytest.mark.parametrize("name", list(POISON))
def test_nothing_a_pickle_is_handed_can_be_changed(tmp_path, real_metadata, name):
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    folder = _folder_with(tmp_path, b"\x80\x04" + POISON[name] + real_metadata[2:])
    with restored() as before:
        try:
            metadata.read_metadata(folder)
            refused = ""
        except rt.RingtrainError as e:
            refused = str(e)
        changed = jobs.changed_since(before)
        values = [m.value for m in _MEM_FORMAT_ENCODING] + [vars(m).get("poisoned") for m in _MEM_FORMAT_ENCODING]
        fspath = os.fspath(pathlib.Path("a") / "b")
        problem = sharded.problem(folder)
    assert "cannot read" in refused, f"{name}: read as whole"
    assert changed == [] and values == [0, 1, 2, None, None, None] and fspath == "a/b", (changed, values, fspath)
    assert problem is not None  # the folder is the one at fault: a problem, not an exception


FILLS = {  # main refuses these too, by the TypeError each happens to raise there: a regression guard
    "SETITEMS on the OrderedDict class": _global("collections", "OrderedDict") + b"(" + _s("k") + b"K\x01u0",
    "APPEND on the set class": _global("builtins", "set") + b"K\x01a0",
    "ADDITEMS on the frozenset class": _global("builtins", "frozenset") + b"(K\x01\x900",
    "SETITEM on a DCP instance": _global(META, "StorageMeta") + b")\x81" + _s("k") + b"K\x01s0",
}


@pytest.mark.parametrize("name", list(FILLS))
def test_filling_what_a_pickle_is_handed_is_refused(tmp_path, real_metadata, name):
    folder = _folder_with(tmp_path, b"\x80\x04" + FILLS[name] + real_metadata[2:])
    with restored() as before:
        with pytest.raises(rt.RingtrainError, match="cannot read"):
            metadata.read_metadata(folder)
        changed = jobs.changed_since(before)
    assert changed == []


@pytest.mark.parametrize("protocol", [None, 2, 3, 5])
def test_a_real_metadata_reads_as_plain_pickle_reads_it(tmp_path, real_metadata, protocol):
    """The safe reader's result equals what pickle makes of a real ``.metadata`` (as DCP wrote it, and pickled
    again with each protocol DCP's pickle may use), field for field. A regression guard: main reads it too."""
    plain = pickle.loads(real_metadata)
    data = real_metadata if protocol is None else pickle.dumps(plain, protocol=protocol)
    ours = metadata.read_metadata(_folder_with(tmp_path, data))
    assert ours == plain
    assert ours.state_dict_metadata["b"].properties.memory_format is torch.contiguous_format
    assert type(ours.storage_meta.checkpoint_id) is type(plain.storage_meta.checkpoint_id)


# --- bounded: too deep, too large, colliding keys --------------------------------------------------

N = 1_000_000
DEEP = {
    "2 MB of nested lists (the finding)": b"\x80\x04" + b"]" * N + b"a" * (N - 1) + b".",
    "2 MB of nested tuples (TUPLE1: no stack)": b"\x80\x04)" + b"\x85" * (2 * N) + b".",
    # each list appended to the one before it, fetched from the memo: the stack stays small
    "nested lists through the memo": b"\x80\x04]\x94" + b"".join(
        b"j" + i.to_bytes(4, "little") + b"]\x94a0" for i in range(N // 5)) + b".",
    "nested dicts": b"\x80\x04}" + b"K\x00}" * (N // 2) + b"K\x00N" + b"s" * (N // 2 + 1) + b".",
    "1M marks": b"\x80\x04" + b"(" * N + b"t" * N + b".",
}


def _read_time_and_peak(folder: str) -> tuple[float, int]:
    """Seconds to refuse ``folder``'s ``.metadata``, and the most memory the refusal took (a second read, traced:
    tracing slows each allocation)."""
    started = time.perf_counter()
    with pytest.raises(rt.RingtrainError, match="cannot read"):
        metadata.read_metadata(folder)
    took = time.perf_counter() - started
    tracemalloc.start()
    try:
        with pytest.raises(rt.RingtrainError, match="cannot read"):
            metadata.read_metadata(folder)
        return took, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def warm(tmp_path, real_metadata):
    """The reader's table built (its first read imports DCP): what is timed is the refusal alone."""
    metadata.read_metadata(_folder_with(tmp_path / "warm", real_metadata))


@pytest.mark.parametrize("name", list(DEEP))
def test_a_too_deep_payload_is_refused_fast_and_cheaply(tmp_path, warm, name):
    folder = _folder_with(tmp_path, DEEP[name])
    took, peak = _read_time_and_peak(folder)
    # Memory is the measure (main: 94-117 MiB to read these); time only bounds a hang, well clear of a loaded machine.
    assert peak < 24 * 2**20, f"{name}: {peak / 2**20:.0f} MiB to refuse"
    assert took < 5.0, f"{name}: {took:.2f} s to refuse"


def test_a_too_large_metadata_is_refused_unread(tmp_path, warm):
    folder = _folder_with(tmp_path, b"")
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        f.truncate(metadata.MAX_BYTES + 1)  # sparse: no disk
    took, peak = _read_time_and_peak(folder)
    assert peak < 2**20 and took < 5.0, (took, peak)


def test_keys_that_share_a_hash_are_refused_fast(tmp_path, warm):
    """40k ints that all hash to 0 (multiples of 2**61 - 1): a set of them is quadratic to build."""
    step = 2**61 - 1
    items = b"".join(b"\x8a\x0b" + (k * step).to_bytes(11, "little", signed=True) for k in range(1, 40_001))
    folder = _folder_with(tmp_path, b"\x80\x04\x8f(" + items + b"\x90.")
    took, _ = _read_time_and_peak(folder)
    assert took < 5.0, f"{took:.2f} s to refuse"  # building the set of 40k colliding keys took 10.8 s


# --- the wrong shape is the folder's problem ---------------------------------------------------------

def _reshaped(real_metadata: bytes, change) -> bytes:
    md = pickle.loads(real_metadata)
    change(md)
    return pickle.dumps(md, protocol=4)


SHAPES = {
    "a shard's offset is text": lambda md: setattr(next(iter(md.storage_data.values())), "offset", "x"),
    "a shard's length is a list": lambda md: setattr(next(iter(md.storage_data.values())), "length", [1]),
    "a shard's file is a number": lambda md: setattr(next(iter(md.storage_data.values())), "relative_path", 3),
    "storage_data is a list": lambda md: setattr(md, "storage_data", [1, 2]),
    "a tensor's size is text": lambda md: setattr(md.state_dict_metadata["b"], "size", "2x2"),
    "a tensor claims a terabyte its shard does not hold": lambda md: (
        setattr(md.state_dict_metadata["b"], "size", torch.Size([2**20, 2**18])),
        setattr(md.state_dict_metadata["b"].chunks[0], "sizes", torch.Size([2**20, 2**18]))),
    "a tensor's piece lies outside it": lambda md: setattr(md.state_dict_metadata["b"].chunks[0], "offsets",
                                                           torch.Size([1, 0])),
    "the top is not a Metadata": None,
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_metadata_of_the_wrong_shape_is_a_problem_of_its_folder(tmp_path, real_metadata, name):
    change = SHAPES[name]
    data = pickle.dumps([1, {"a": (2, 3)}], protocol=4) if change is None else _reshaped(real_metadata, change)
    folder = _folder_with(tmp_path, data)
    torch.save({"format": sharded.FORMAT}, os.path.join(folder, sharded.INFO))
    found = sharded.problem(folder)  # on main: a TypeError or ValueError out of it, which ends the resume
    assert found is not None and "cannot read" in found, found


# --- end to end: three sharded checkpoints, the newest poisoned ---------------------------------------

def _poison(folder: pathlib.Path) -> None:
    real = (folder / ".metadata").read_bytes()
    poison = _slot_build(_global("pathlib", "PosixPath"), {"__fspath__": 0})
    for cls in ("Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "MetadataIndex", "StorageMeta"):
        poison += _slot_build(_global(META, cls), {"ringtrain_poisoned": 1})
    (folder / ".metadata").write_bytes(b"\x80\x04" + poison + real[2:])


@pytest.mark.timeout(300)
def test_a_poisoned_newest_of_three_sharded_checkpoints_costs_only_itself(run_ranks, tmp_path):
    folder = tmp_path / "ckpt"
    run_ranks(jobs.train, str(folder), 6, timeout=200)
    listed = [e["file"] for e in json.loads((folder / "manifest.json").read_text())["checkpoints"]]
    assert listed == ["step-000000002", "step-000000004", "step-000000006"]
    at_4 = sharded.consolidate(str(folder / "step-000000004"), str(tmp_path / "step4.pt"))["model"]
    _poison(folder / "step-000000006")

    first, _ = run_ranks(jobs.train, str(folder), 8, timeout=200)
    assert first["resumed_at"] == 4, first["resumed_at"]  # the one before the poisoned one, not step 0
    assert first["state"].keys() == at_4.keys()
    assert all(torch.equal(first["state"][k], at_4[k]) for k in at_4), "the resumed weights are not step 4's"
    assert first["changed"] == []  # PosixPath, PurePath, DCP's dataclasses: as they were, in the rank that read it
    assert first["steps"] == 8 and first["fspath"].endswith("manifest.json")  # and it saved again, at 6 and 8
    names = sorted(os.listdir(folder))
    assert [n for n in names if ".damaged" in n] == ["step-000000006.damaged"], names
    listed = [e["file"] for e in json.loads((folder / "manifest.json").read_text())["checkpoints"]]
    assert listed == ["step-000000004", "step-000000006", "step-000000008"]
    assert sharded.problem(str(folder / "step-000000006")) is None  # the new step 6: whole


# --- set aside only once an older one has loaded ------------------------------------------------------

def test_when_no_listed_checkpoint_loads_none_is_set_aside_and_the_run_does_not_start_over(tmp_path, monkeypatch):
    """Every load fails (as when the process itself is at fault, not the files): an error naming each, every
    checkpoint left where it was, the manifest unchanged — never a fresh start that rotates them away."""
    folder = tmp_path / "ckpt"
    _ring_jobs.periodic(str(folder), 1, stop_at_step=4)  # one process: step-2.pt, step-4.pt
    manifest = (folder / "manifest.json").read_text()

    def fails(self, path, **targets):
        raise files.DamagedCheckpoint(f"cannot read the checkpoint {path!r} (as if damaged)", "a test")

    monkeypatch.setattr(StateFiles, "load", fails)
    with pytest.raises(rt.RingtrainError, match="none of the checkpoints") as got:
        _ring_jobs.periodic(str(folder), 1)
    assert "step-000000004.pt" in str(got.value) and "step-000000002.pt" in str(got.value)
    assert sorted(n for n in os.listdir(folder) if n.startswith("step-")) == ["step-000000002.pt", "step-000000004.pt"]
    assert (folder / "manifest.json").read_text() == manifest
