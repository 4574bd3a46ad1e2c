"""A checkpoint is input: reading one runs no code (issue 31, item 1).

Every reader of a checkpoint — a sharded folder's ``.metadata`` (resume, ``ring.load``, ``ringtrain
consolidate``) and ``ringtrain.pt`` / a full file (``weights_only=True``) — is fed hand-made pickles
that would run ``touch OWNED``: the dotted-name payload that got through a module-wide allowlist,
the same through every protocol and opcode that names a global (GLOBAL, STACK_GLOBAL, INST), names
the metadata module imports (``os``, ``dataclass``, ``Enum``), and REDUCE on allowed names with
arguments that are not theirs. Each read must raise ``RingtrainError`` and leave no ``OWNED``.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile

import pytest
import torch

import ringtrain as rt
from ringtrain.checkpoint import files as checkpoint, sharded

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")

META = b"torch.distributed.checkpoint.metadata"
TOUCH = b"touch OWNED"


def _short(b: bytes) -> bytes:
    """SHORT_BINUNICODE of ``b`` (protocol 4+)."""
    return b"\x8c" + bytes([len(b)]) + b


def _stack_global(proto: int, module: bytes, name: bytes) -> bytes:
    return b"\x80" + bytes([proto]) + _short(module) + _short(name) + b"\x93" + _short(TOUCH) + b"\x85R."


PAYLOADS = {
    # the repro, verbatim: a dotted name resolved through a module the allowlist took whole
    "issue repro (protocol 4, STACK_GLOBAL)":
        b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\tos.system\x93\x8c\x0btouch OWNED\x85R.",
    "protocol 5, STACK_GLOBAL, dotted": _stack_global(5, META, b"os.system"),
    "protocol 4, STACK_GLOBAL, os.system": _stack_global(4, b"os", b"system"),
    "protocol 4, STACK_GLOBAL, posix.system": _stack_global(4, b"posix", b"system"),
    "protocol 4, builtins.eval": b"\x80\x04" + _short(b"builtins") + _short(b"eval") + b"\x93"
                                 + _short(b"__import__('os').system('touch OWNED')") + b"\x85R.",
    "protocol 0, GLOBAL os.system": b"cos\nsystem\n(S'touch OWNED'\ntR.",
    "protocol 0, GLOBAL dotted in the metadata module": b"c" + META + b"\nos.system\n(S'touch OWNED'\ntR.",
    "protocol 1, GLOBAL + BINSTRING": b"cos\nsystem\nq\x00(U\x0btouch OWNEDq\x01tq\x02Rq\x03.",
    "protocol 2, GLOBAL dotted": b"\x80\x02c" + META + b"\nos.system\nX\x0b\x00\x00\x00touch OWNED\x85R.",
    "protocol 3, GLOBAL subprocess": b"\x80\x03csubprocess\ncall\nX\x0b\x00\x00\x00touch OWNED\x85\x85R.",
    "INST os.system": b"(S'touch OWNED'\nios\nsystem\n.",
    "INST dotted in the metadata module": b"(S'touch OWNED'\ni" + META + b"\nos.system\n.",
    "a name the metadata module imports (os)": _stack_global(4, META, b"os"),
    "a name the metadata module imports (dataclass)": _stack_global(4, META, b"dataclass"),
    "a name the metadata module imports (Enum)": _stack_global(4, META, b"Enum"),
    "torch dotted to a function": _stack_global(4, b"torch", b"serialization.os.system"),
    "REDUCE on the allowed _get_layout, with a name that is no layout": _stack_global(
        4, b"torch.serialization", b"_get_layout"),
    "REDUCE on an allowed class reaching a method": _stack_global(4, b"pathlib", b"PosixPath.write_text"),
}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(read, folder_or_file) -> None:
    with pytest.raises(rt.RingtrainError):
        read(str(folder_or_file))


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_metadata_runs_no_code(in_tmp, name):
    folder = in_tmp / "x"
    folder.mkdir()
    (folder / ".metadata").write_bytes(PAYLOADS[name])
    _refused(sharded.read_metadata, folder)
    _refused(sharded.check, folder)          # what resume, ring.load and consolidate ask first
    _refused(lambda f: sharded.consolidate(f, str(in_tmp / "out.pt")), folder)
    assert not (in_tmp / "OWNED").exists(), f"{name}: code ran"


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_full_file_runs_no_code(in_tmp, name):
    """``ringtrain.pt`` and full checkpoints: a plain pickle file, and the payload as a zip's data.pkl."""
    raw = in_tmp / "raw.pt"
    raw.write_bytes(PAYLOADS[name])
    _refused(checkpoint.read, raw)

    zipped = in_tmp / "zipped.pt"
    torch.save({"epoch": 1}, zipped)
    with zipfile.ZipFile(zipped) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    pkl = next(n for n in members if n.endswith("/data.pkl"))
    members[pkl] = PAYLOADS[name]
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    _refused(checkpoint.read, zipped)
    assert not (in_tmp / "OWNED").exists(), f"{name}: code ran"


def test_real_metadata_still_reads(in_tmp):
    """The exact table holds every name a real DCP ``.metadata`` uses (bf16 and fp32 tensors, a path)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"a": torch.zeros(3, dtype=torch.bfloat16), "b": torch.ones(2, 2)}, checkpoint_id=str(in_tmp / "ok"))
    md = sharded.read_metadata(str(in_tmp / "ok"))
    assert md.state_dict_metadata["a"].properties.dtype is torch.bfloat16
    assert md.state_dict_metadata["b"].properties.layout is torch.strided
    assert tuple(md.state_dict_metadata["b"].size) == (2, 2)
    assert pickle.loads(pickle.dumps(md)).state_dict_metadata.keys() == md.state_dict_metadata.keys()


def test_payload_would_run_with_plain_pickle(in_tmp):
    """The payloads are live: plain pickle runs the issue's one (so the tests above test something)."""
    pickle.Unpickler(io.BytesIO(PAYLOADS["issue repro (protocol 4, STACK_GLOBAL)"])).load()
    assert (in_tmp / "OWNED").exists()
    os.remove(in_tmp / "OWNED")
