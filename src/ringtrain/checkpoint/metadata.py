"""DCP's ``.metadata``, read safely: torch reads it with plain ``pickle``, and a checkpoint is input
(docs/architecture.md, principle 12).

The pickle is run by pickle_machine.py's machine, which changes nothing but what it makes, over this module's
exact table: the globals a ``.metadata`` names, each a vetted maker (``torch.Size``, paths, a layout or memory
format by its name, plain containers) or a dtype, and DCP's metadata dataclasses with the type of each field, as
DCP writes them. What comes out is a ``Metadata`` of DCP's shape whose tensors fit what their shard files hold
(``_tensors_fit``), so every reader after this one (the shard check, DCP's own load) can trust it. A ``.metadata``
over ``MAX_BYTES`` is refused unread. Any failure is a ``DamagedCheckpoint`` of this folder alone.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import pathlib
from typing import Any, Callable

import torch

from .files import DamagedCheckpoint
from .pickle_machine import Check, Machine, Maker, Refused, Spec, unpickle as run_pickle, what

HINT_DAMAGED = ("a sharded checkpoint is whole only with every rank's file: copy the complete folder (all "
                 "__*.distcp files, .metadata and ringtrain.pt), or use an older checkpoint.")
_HINT_READ = "the folder is damaged or was not written by torch.distributed.checkpoint; " + HINT_DAMAGED

MAX_BYTES = 256 << 20  # a .metadata larger is refused unread (one of 16,000 shards over 2,000 tensors: 2.8 MB)


def _ints(seq: Any) -> bool:
    return type(seq) in (tuple, list) and all(type(v) is int for v in seq)


def _make_size(*args: Any) -> torch.Size:
    if not args or (len(args) == 1 and _ints(args[0])):
        return torch.Size(*args)
    raise Refused(f"torch.Size of {', '.join(map(what, args))}, not a sequence of ints")


def _make_path(cls: type) -> Callable[..., Any]:
    def make(*parts: Any) -> Any:
        if not all(type(p) is str and "\0" not in p for p in parts):
            raise Refused(f"{cls.__name__} of {', '.join(map(what, parts))}, not text")
        return cls(*parts)

    return make


def _make_layout(name: Any) -> torch.layout:
    """``torch.serialization._get_layout`` without its module: a layout by its name, from a fixed table."""
    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if type(name) is not str or name not in layouts:
        raise Refused(f"{what(name)} is not a torch layout")
    return layouts[name]


def _make_slice(*args: Any) -> slice:
    if not 1 <= len(args) <= 3 or not all(a is None or type(a) is int for a in args):
        raise Refused(f"slice of {', '.join(map(what, args))}")
    return slice(*args)


def _make_ordered(*args: Any) -> collections.OrderedDict:
    if args:
        raise Refused("an OrderedDict made with arguments (a pickled one is filled by SETITEMS)")
    return collections.OrderedDict()


# --- DCP's metadata classes: each field's check, what NEWOBJ sets, what BUILD must give ----------------------

def _is(*types: Any) -> Check:
    return lambda m, v: type(v) in types


def _kind_of(base: type) -> Check:
    return lambda m, v: isinstance(v, base)


def _count(m: Machine, v: Any) -> bool:
    return type(v) is int and v >= 0


def _texts(m: Machine, v: Any) -> bool:
    return type(v) in (list, tuple) and all(type(s) is str for s in v)


def _texts_or_none(m: Machine, v: Any) -> bool:
    return v is None or _texts(m, v)


def _built(*classes: type) -> Check:
    return lambda m, v: type(v) in classes and id(v) not in m.unbuilt


def _list_of(*classes: type) -> Check:
    one = _built(*classes)
    return lambda m, v: type(v) is list and all(one(m, x) for x in v)


def _dict_of(key: Check, value: Check) -> Check:
    return lambda m, v: type(v) is dict and all(key(m, k) and value(m, x) for k, x in v.items())


def _or_none(check: Check) -> Check:
    return lambda m, v: v is None or check(m, v)


_PLAIN = (type(None), bool, int, float, str, bytes, tuple, list, dict, collections.OrderedDict)


def _plain(m: Machine, v: Any) -> bool:
    """Plain data all the way down (``planner_data``: DCP's default planner's fqn -> path of keys), each object
    looked at once (a shared one is not walked again: no blow-up)."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if type(x) not in _PLAIN:
            return False
        if isinstance(x, (tuple, list, dict)) and id(x) not in seen:
            seen.add(id(x))
            todo.extend(x.items() if isinstance(x, dict) else x)
    return True


def _tensors_fit(metadata: Any) -> None:
    """Every tensor's pieces inside it and covering it, each stored in at least its own bytes (where no transform
    compresses it): what a load allocates for a tensor is bounded by what its shard files hold, so a few bytes of
    ``.metadata`` cannot claim a terabyte."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata  # function-level: slow

    stored = metadata.storage_data
    for fqn, entry in metadata.state_dict_metadata.items():
        if type(entry) is not TensorStorageMetadata:
            continue
        size, itemsize, covered = entry.size, entry.properties.dtype.itemsize, 0
        for chunk in entry.chunks:
            if len(chunk.offsets) != len(size) or len(chunk.sizes) != len(size) or not all(
                    0 <= at and 0 <= n and at + n <= whole for at, n, whole in zip(chunk.offsets, chunk.sizes, size)):
                raise Refused(f"{fqn!r} of size {tuple(size)} has a piece of {tuple(chunk.sizes)} at "
                              f"{tuple(chunk.offsets)}, outside it")
            info = stored.get(MetadataIndex(fqn, chunk.offsets))
            numel = math.prod(chunk.sizes)
            if info is None:
                raise Refused(f"{fqn!r}'s piece at {tuple(chunk.offsets)} is in no shard file")
            if not info.transform_descriptors and info.length < numel * itemsize:
                raise Refused(f"{fqn!r}'s piece at {tuple(chunk.offsets)} is stored in {info.length} bytes, fewer "
                              f"than its {numel * itemsize}")
            covered += numel
        if covered < math.prod(size):
            raise Refused(f"{fqn!r} of size {tuple(size)}: its pieces hold {covered} of its {math.prod(size)} "
                          "elements")


@functools.lru_cache(maxsize=1)
def _table() -> tuple[dict[tuple[str, str], Any], dict[type, Spec]]:
    """Every global a DCP ``.metadata`` may name, by exact (module, name), and DCP's metadata classes' specs."""
    from torch.distributed.checkpoint import filesystem, metadata as md  # function-level: DCP's import is slow

    size, path = _is(torch.Size), _is(str, pathlib.PosixPath, pathlib.PurePosixPath)
    formats = {md._MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT: torch.contiguous_format,
               md._MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST: torch.channels_last,
               md._MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT: torch.preserve_format}

    def properties(state: tuple) -> dict[str, Any]:  # TensorProperties.__getstate__'s tuple, read without it
        if len(state) != 5 or state[3] not in formats:
            raise Refused(f"TensorProperties' state of {len(state)} items {what(state[3:4])}")
        dtype, layout, requires_grad, encoding, pin_memory = state
        return {"dtype": dtype, "layout": layout, "requires_grad": requires_grad,
                "memory_format": formats[encoding], "pin_memory": pin_memory}

    specs = [
        Spec(md.ChunkStorageMetadata, {"offsets": size, "sizes": size}),
        Spec(md.TensorProperties, {"dtype": _kind_of(torch.dtype), "layout": _kind_of(torch.layout),
                                   "requires_grad": _is(bool), "memory_format": _kind_of(torch.memory_format),
                                   "pin_memory": _is(bool)}, properties),
        Spec(md.TensorStorageMetadata, {"properties": _built(md.TensorProperties), "size": size,
                                        "chunks": _list_of(md.ChunkStorageMetadata)}),
        Spec(md.BytesStorageMetadata, {}),
        Spec(md.StorageMeta, {"checkpoint_id": _or_none(path), "save_id": _is(str, type(None)),
                              "load_id": _is(str, type(None)), "modules": _texts}),
        Spec(md.MetadataIndex, {"fqn": _is(str), "offset": _or_none(size), "index": _is(int, type(None))}),
        Spec(filesystem._StorageInfo, {"relative_path": _is(str), "offset": _count, "length": _count,
                                       "transform_descriptors": _texts_or_none}),
    ]
    specs.append(Spec(md.Metadata, {
        "state_dict_metadata": _dict_of(_is(str), _built(md.TensorStorageMetadata, md.BytesStorageMetadata)),
        "planner_data": _plain,
        "storage_data": _dict_of(_built(md.MetadataIndex), _built(filesystem._StorageInfo)),
        "storage_meta": _or_none(_built(md.StorageMeta)), "version": _is(str, type(None))}, finish=_tensors_fit))
    by_class = {spec.cls: spec for spec in specs}
    names: dict[tuple[str, str], Any] = {(spec.cls.__module__, spec.cls.__name__): Maker(
        f"{spec.cls.__module__}.{spec.cls.__name__}", cls=spec.cls) for spec in specs}
    encoding = md._MEM_FORMAT_ENCODING

    def member(value: Any) -> Any:
        if type(value) is not int:
            raise Refused(f"_MEM_FORMAT_ENCODING of {what(value)}")
        return encoding(value)

    for module, name, make, kind in [
            (md.__name__, "_MEM_FORMAT_ENCODING", member, "leaf"), ("torch", "Size", _make_size, "fixed"),
            ("torch.serialization", "_get_layout", _make_layout, "leaf"),
            ("collections", "OrderedDict", _make_ordered, "open"),
            ("pathlib", "PosixPath", _make_path(pathlib.PosixPath), "leaf"),
            ("pathlib", "PurePosixPath", _make_path(pathlib.PurePosixPath), "leaf"),
            ("builtins", "set", None, "open"), ("builtins", "frozenset", None, "fixed"),
            ("builtins", "slice", _make_slice, "leaf")]:
        names[(module, name)] = Maker(f"{module}.{name}", make, kind,
                                      of_ints=torch.Size if make is _make_size else None)
    names.update({("torch", n): v for n, v in vars(torch).items() if isinstance(v, (torch.dtype, torch.layout))})
    return names, by_class


def unpickle(data: bytes) -> Any:
    """``data``, a DCP ``.metadata``, as DCP's ``Metadata``; ``Refused`` says why not.

    pickle_machine.py: no object is changed but what this read makes, and nothing outside the table is built."""
    from torch.distributed.checkpoint.metadata import Metadata  # function-level: DCP's import is slow

    if len(data) > MAX_BYTES:
        raise Refused(f"{len(data):,} bytes, more than the {MAX_BYTES:,} a .metadata may hold")
    names, specs = _table()
    result, machine = run_pickle(data, names, specs)
    if type(result) is not Metadata or id(result) in machine.unbuilt:
        raise Refused(f"it holds {what(result)}, not a whole torch.distributed.checkpoint Metadata")
    return result


def read_metadata(folder: str) -> Any:
    path = os.path.join(folder, ".metadata")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise Refused(f"{size:,} bytes, more than the {MAX_BYTES:,} a .metadata may hold")
            return unpickle(f.read(size + 1))  # a file that grew meanwhile is refused by unpickle
    except FileNotFoundError:
        raise DamagedCheckpoint(f"the sharded checkpoint {folder!r} has no .metadata: it was never completed",
                                HINT_DAMAGED) from None
    except Refused as e:
        raise DamagedCheckpoint(f"cannot read {path!r} ({e})", _HINT_READ) from None
    except Exception as e:  # an OSError, a MemoryError: this folder's, like the rest
        raise DamagedCheckpoint(f"cannot read {path!r} ({type(e).__name__}: {e})", _HINT_READ) from e


def safe_reader(folder: str):
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        """DCP's reader with the metadata read by ``read_metadata`` (no arbitrary unpickling)."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata = read_metadata(folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)
