"""DCP's ``.metadata``, read safely: torch reads it with plain ``pickle``, and a checkpoint is input
(docs/architecture.md, principle 12). The unpickler here builds only the globals of an exact table — DCP's
metadata classes, torch's dtypes and layouts, ``torch.Size``, plain containers and paths — looked up by
(module, name), never a module taken whole (a protocol-4 pickle resolves dotted names) and never a function run.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

from ..errors import RingtrainError

HINT_DAMAGED = ("a sharded checkpoint is whole only with every rank's file: copy the complete folder (all "
                 "__*.distcp files, .metadata and ringtrain.pt), or use an older checkpoint.")

def _layout(name: Any) -> Any:
    """``torch.serialization._get_layout`` without its module: a layout by its name, from a fixed table."""
    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if not isinstance(name, str) or name not in layouts:
        raise pickle.UnpicklingError(f"{name!r} is not a torch layout")
    return layouts[name]


def _metadata_names() -> dict[tuple[str, str], Any]:
    """Every global a DCP ``.metadata`` may name, by exact (module, name): DCP's metadata classes, torch's
    dtypes, ``torch.Size``, plain containers and paths. No module is allowed whole (a protocol-4 pickle
    resolves dotted names, so ``metadata`` + ``os.system`` would reach ``os`` through its imports), and no
    function runs: ``_get_layout`` is answered by ``_layout``'s table."""
    import collections
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    names: dict[tuple[str, str], Any] = {
        (metadata.__name__, cls.__name__): cls
        for cls in (metadata.ChunkStorageMetadata, metadata.TensorProperties, metadata.TensorStorageMetadata,
                    metadata.BytesStorageMetadata, metadata.StorageMeta, metadata.Metadata,
                    metadata.MetadataIndex, metadata._MEM_FORMAT_ENCODING)}
    names.update({(filesystem.__name__, "_StorageInfo"): filesystem._StorageInfo, ("torch", "Size"): torch.Size,
                  ("torch.serialization", "_get_layout"): _layout,
                  ("collections", "OrderedDict"): collections.OrderedDict,
                  ("pathlib", "PosixPath"): pathlib.PosixPath, ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
                  ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice})
    names.update({("torch", n): v for n, v in vars(torch).items() if isinstance(v, (torch.dtype, torch.layout))})
    return names


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the globals of ``_metadata_names``, looked up by exact name; everything else is refused."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self._names = _metadata_names()

    def find_class(self, module: str, name: str) -> Any:
        found = self._names.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")
        return found


def read_metadata(folder: str) -> Any:
    path = os.path.join(folder, ".metadata")
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(io.BytesIO(f.read())).load()
    except FileNotFoundError:
        raise RingtrainError(f"the sharded checkpoint {folder!r} has no .metadata: it was never completed",
                             HINT_DAMAGED) from None
    except Exception as e:
        raise RingtrainError(f"cannot read {path!r} ({type(e).__name__}: {e})",
                             "the folder is damaged or was not written by torch.distributed.checkpoint; " + HINT_DAMAGED) from e


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


