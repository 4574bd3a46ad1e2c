"""Sharded checkpoints: one folder that every rank writes its own shards into, complete or absent.

The folder is torch's distributed checkpoint (``torch.distributed.checkpoint``, DCP) plus one
file of ours::

    ckpt/.metadata                 DCP: which tensor pieces are where (written last by DCP's coordinator)
    ckpt/__0_0.distcp ...          DCP: one file per rank, its shards (replicated tensors written once)
    ckpt/ringtrain.pt              ours (rank 0): everything that is not a tensor, the run's state
                                   (RNG of every rank, loaders, steps), and the data files with their sizes

Only tensors go to DCP; the rest (optimizer hyperparameters, an epoch number, a scheduler's
state) goes to ``ringtrain.pt``, written with ``torch.save`` and read back with
``weights_only=True``. DCP stores other values by pickling them and reads them back with
``weights_only=False``, and reads its ``.metadata`` with plain ``pickle``: a checkpoint is input
(docs/architecture.md, principle 12), so ``SafeReader`` reads the metadata through an unpickler (metadata.py) that
builds only DCP's own metadata classes, and every file it names must be a plain name inside
the folder.

**Complete or absent.** The ranks write into a staging folder beside the target
(``.ckpt.<writer>.<random>.tmp``); only when DCP's coordinator has written ``.metadata`` (so every
rank's data is on disk, ``fsync``-ed) does rank 0 write ``ringtrain.pt`` and rename the
staging folder into place — swapping it atomically with an older checkpoint at that path
(Linux ``renameat2(RENAME_EXCHANGE)``). A crash at any moment leaves the old checkpoint or
the new one, and at worst a staging folder that ``CheckpointDir.prepare`` removes, or (outside a
checkpoint_dir) the next save in that folder once its writer is gone (``temporaries``).

**Any world size.** Tensors are stored with their global shapes; loading asks each rank for
the pieces its own layout holds (a DTensor shard, a pipeline stage, the whole tensor), so a
folder written by 2 FSDP ranks loads into 3, into DDP, or into one process with no group.
``consolidate`` turns a folder into one plain ``torch.save`` file.

**Asynchronous.** ``AsyncSave`` copies the state to CPU memory (buffers kept between saves) and writes it
from a daemon thread over a process group of its own (Gloo), while training goes on: DCP's
collectives on the default group would interleave with the training's and hang. A daemon
thread never holds up the process's exit; a save cut short leaves only its staging folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping

import torch

from ..errors import RingtrainError
from ..liveness.activity import Activity, waits_for_peers
from . import files, value_reader
from .dcp_errors import dcp_failure
from .metadata import HINT_DAMAGED as _HINT_DAMAGED, read_metadata, safe_reader
from .state import is_sharded, optimizer_by_index
from .temporaries import remove_dead_temporaries, temporary_folder, write_failed

INFO = "ringtrain.pt"
FORMAT = 1
_TENSOR = "__ringtrain_tensor__"  # the skeleton's placeholder for a tensor stored by DCP

# --- tensors to DCP, the rest to ringtrain.pt -------------------------------------------------

class Whole:
    """A part of the tree kept whole in ``ringtrain.pt`` (rank 0's value), tensors included."""

    def __init__(self, value: Any):
        self.value = value


def split(tree: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """``tree``'s tensors by path (``"model/0.weight"``) and the tree with placeholders in their place."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, Whole):
            return value.value
        if isinstance(value, torch.Tensor):
            key = "/".join(path)
            if key in tensors:
                raise RingtrainError(f"ring.save: two entries are both named {key!r}",
                                     "use distinct keys (a dict with both 1 and '1' as keys cannot be sharded).")
            tensors[key] = value
            return {_TENSOR: key}
        if isinstance(value, Mapping):
            return {k: walk(v, (*path, str(k))) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(walk(v, (*path, str(i))) for i, v in enumerate(value))
        return value

    return tensors, walk(tree, ())


def merge(skeletons: list[Any]) -> Any:
    """Every rank's skeleton as one: a pipeline rank names only its own stage's tensors (and its
    optimizer groups only its own parameters); the folder needs them all. Dicts are united, lists of
    dicts merged item by item, other lists united in order (rank order: stage order); a value that is
    neither is rank 0's."""
    if all(isinstance(s, dict) for s in skeletons):
        keys: dict[Any, None] = {}
        for s in skeletons:
            keys.update(dict.fromkeys(s))
        return {k: merge([s[k] for s in skeletons if k in s]) for k in keys}
    if all(isinstance(s, list) for s in skeletons):
        if len({len(s) for s in skeletons}) == 1 and all(isinstance(v, dict) for s in skeletons for v in s):
            return [merge(list(items)) for items in zip(*skeletons)]
        united: list[Any] = []
        for s in skeletons:
            united += [v for v in s if v not in united]
        return united
    return skeletons[0]


_SKIPPED = object()


def join(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The tree ``split`` took apart; a tensor not in ``tensors`` (not loaded on this rank) is left out."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {_TENSOR}:
            return tensors.get(value[_TENSOR], _SKIPPED)
        if isinstance(value, dict):
            out = {k: walk(v) for k, v in value.items()}
            return {k: v for k, v in out.items() if v is not _SKIPPED}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        return value

    return walk(skeleton)


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """DCP warns on every save and load without a process group; one process is what we asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized")
        yield


def data_files(folder: str, metadata: Any) -> dict[str, int]:
    """The data files ``metadata`` points into, each with the bytes it must hold; each name checked to be
    a plain file name in ``folder``."""
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name = os.fspath(getattr(info, "relative_path", ""))
        if not name or os.path.basename(name) != name or name in (".", "..") or "\0" in name:
            raise RingtrainError(f"the sharded checkpoint {folder!r} points outside its folder ({name!r})",
                                 "only load checkpoints written by ringtrain or torch.distributed.checkpoint.")
        needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    return needed


def problem(folder: str) -> str | None:
    """Why ``folder`` is not a complete sharded checkpoint of ours, or None when it is one."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        return "not a folder"
    info_path = os.path.join(folder, INFO)
    if not os.path.isfile(info_path):
        return f"no {INFO}: not written by ring.save, or never completed"
    try:
        info = files.read(info_path)
        needed = data_files(folder, read_metadata(folder))
    except RingtrainError as e:
        return e.message
    if info.get("format") != FORMAT:
        return f"{INFO} has format {info.get('format')!r}, this ringtrain reads {FORMAT}"
    for name, size in sorted(needed.items()):
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isfile(path):
            return f"the shard file {name} is missing"
        if os.path.getsize(path) < size:
            return f"the shard file {name} is truncated ({os.path.getsize(path)} of {size} bytes)"
    return None


def check(folder: str) -> None:
    found = problem(folder)
    if found is not None:
        raise files.DamagedCheckpoint(f"cannot load the sharded checkpoint {folder!r}: {found}", _HINT_DAMAGED)


def is_sharded_checkpoint(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


# --- writing ----------------------------------------------------------------------------------

def staging_folder(path: str) -> str:
    """A fresh staging folder beside ``path`` (rank 0 makes it; the others are told its name)."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RingtrainError(f"cannot save the checkpoint {path!r}: folder {parent!r} does not exist",
                             "create the folder first (os.makedirs(folder, exist_ok=True)) or save elsewhere.")
    if os.path.isdir(path) and not os.path.islink(path) and os.listdir(path) and problem(path) is not None:
        raise RingtrainError(f"cannot save the sharded checkpoint to {path!r}: a folder that is not a ringtrain "
                             "checkpoint is there, and ring.save never deletes what is not its own",
                             "save to a new path, or move that folder away.")
    try:
        remove_dead_temporaries(parent)  # what a writer killed mid-save here left (kill -9, the OOM killer)
        return temporary_folder(parent, os.path.basename(path))
    except OSError as e:
        raise write_failed("the sharded checkpoint", path, e,
                           "the checkpoint at that path, if any, is unchanged") from e


def write_shards(folder: str, tensors: Mapping[str, torch.Tensor], group: Any = None) -> None:
    """DCP's save of ``tensors`` into ``folder`` (collective over ``group``; every file fsync-ed). A failure is a
    ``RingtrainError`` naming the rank, errno and path (``dcp_failure``)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(folder, sync_files=True)
    try:
        if dist.is_available() and dist.is_initialized():
            dcp.save(dict(tensors), storage_writer=writer, process_group=group)
        else:
            with _one_process():
                dcp.save(dict(tensors), storage_writer=writer, no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        raise dcp_failure("writing", folder, e) from e


def finish(staging: str, path: str, skeleton: Any, kinds: Mapping[str, str], meta: Mapping[str, Any]) -> None:
    """Rank 0, once every rank's shards are on disk: write ``ringtrain.pt`` and put the folder in place."""
    sizes = {name: os.path.getsize(os.path.join(staging, name)) for name in sorted(os.listdir(staging))}
    files.atomic_save({"format": FORMAT, "skeleton": skeleton, "kinds": dict(kinds), "meta": dict(meta),
                            "files": sizes}, os.path.join(staging, INFO))
    publish(staging, path)


def publish(staging: str, path: str) -> None:
    """Move the complete folder ``staging`` to ``path``: atomically, replacing what is there."""
    if not os.path.lexists(path):
        os.rename(staging, path)
    elif not _exchange(staging, path):  # on success `staging` holds the old checkpoint now
        # No atomic swap here (not Linux, or a file system without it): a moment without `path`.
        old = staging + ".old"
        os.rename(path, old)
        os.rename(staging, path)
        staging = old
    _fsync_dir(os.path.dirname(os.path.abspath(path)))
    if os.path.lexists(staging):
        remove(staging)


def remove(path: str) -> None:
    """Delete a checkpoint (file or folder) of ours; a link is removed, never followed."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where that is unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(os.path.abspath(a)), at_fdcwd, os.fsencode(os.path.abspath(b)),
                     _RENAME_EXCHANGE)
    return done == 0


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AsyncSave:
    """One sharded save in flight at a time, written by a daemon thread over ``group``."""

    def __init__(self, group: Any, activity: Activity):
        self.group = group
        self.activity = activity  # the ring's: while the rest of a save is this rank's own, nobody is waited for
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._shared_done = threading.Event()  # the save's collective part is over: the rest is this rank's own
        self._buffers: dict[str, torch.Tensor] = {}  # the staging copies, reused from save to save
        self.staging_s = 0.0  # the last save's copy to CPU memory (the part training waits for)
        self.write_s = 0.0  # ... and its write in the background, to the end of the rename

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, staging: str, tensors: Mapping[str, torch.Tensor], done: Callable[[], None],
              clean_up: bool = False) -> None:
        """Copy ``tensors`` to CPU memory now, then write them in the background and call ``done()``;
        ``clean_up`` (the main process): a failed save's staging folder is removed."""
        start = time.perf_counter()
        staged = self._stage(tensors)
        self.staging_s = time.perf_counter() - start

        def run() -> None:
            begun = time.perf_counter()
            with contextlib.suppress(OSError, AttributeError):
                # Below the training threads: on a busy CPU the write waits, not the step (Linux: per thread).
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            try:
                write_shards(staging, staged, self.group)
                self._shared_done.set()
                done()
            except BaseException as e:  # surfaced by wait() on the main thread
                self._error = e
                if clean_up:  # what a failed save wrote (a full disk): nothing of it stays
                    with contextlib.suppress(OSError):
                        remove(staging)
            finally:
                self.write_s = time.perf_counter() - begun

        self._error = None
        self._shared_done.clear()
        self._thread = threading.Thread(target=run, name="ringtrain-checkpoint", daemon=True)
        self._thread.start()

    def _stage(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A CPU copy of ``tensors`` (shards stay shards), in buffers kept from one save to the next.

        Fresh memory each time would cost more than the copy itself (the first touch of every page:
        1.7 s instead of 0.2 s for 290 MiB here); the buffers are free to reuse because a save waits
        for the previous one. The price: one CPU copy of this rank's state, held for the run.
        """
        staged: dict[str, torch.Tensor] = {}
        on_gpu = False
        for key, value in tensors.items():
            local = value.to_local() if is_sharded(value) else value
            buffer = self._buffers.get(key)
            if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
                buffer = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
                self._buffers[key] = buffer
            buffer.copy_(local.detach(), non_blocking=local.is_cuda)
            on_gpu = on_gpu or local.is_cuda
            if is_sharded(value):
                from torch.distributed.tensor import DTensor

                buffer = DTensor.from_local(buffer, value.device_mesh, value.placements, run_check=False,
                                            shape=value.shape, stride=value.stride())
            staged[key] = buffer
        if on_gpu:
            torch.cuda.synchronize()
        return staged

    @waits_for_peers(lambda frame: "a sharded checkpoint's save (its collectives, on the writer thread)")
    def wait(self) -> BaseException | None:
        """Block until the save in flight is written; its error, if it failed."""
        if self._thread is not None:
            # While the writer is in its collectives, waiting here is waiting for the other ranks (whose
            # peers may be gone: the watchdog must see it); after them, what is left (the main process's
            # metadata and manifest, at low priority on a busy CPU) is this rank's alone, and a peer that
            # finished meanwhile did nothing wrong.
            while self._thread.is_alive() and not self._shared_done.is_set():
                self._thread.join(0.2)
            with self.activity.working_alone():
                while self._thread.is_alive():
                    self._thread.join(0.2)
            self._thread = None
        error, self._error = self._error, None
        return error


# --- reading ----------------------------------------------------------------------------------

def load(folder: str, target_for: Callable[[str, tuple[int, ...], torch.dtype], torch.Tensor | None]
         ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """Read ``folder``: (the saved tree with tensors filled in, the kind of each entry, the run's meta).

    ``target_for(key, shape, dtype)`` gives the tensor to read entry ``key`` into — a DTensor
    reads only its shard — or None to leave it out (another pipeline stage's). Collective when a
    process group exists.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    check(folder)
    info = files.read(os.path.join(folder, INFO))
    metadata = read_metadata(folder)
    targets: dict[str, torch.Tensor] = {}
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            target = target_for(key, tuple(md.size), md.properties.dtype)
            if target is not None:
                targets[key] = target
    reader = safe_reader(folder)
    try:
        if dist.is_available() and dist.is_initialized():
            dcp.load(targets, storage_reader=reader)
        else:
            with _one_process():
                dcp.load(targets, storage_reader=reader, no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        raise dcp_failure("reading", folder, e, damaged=True) from e
    return join(info["skeleton"], targets), dict(info.get("kinds", {})), dict(info.get("meta", {}))


def checkpoint_values(path: str) -> dict[str, Any]:
    """A checkpoint's plain values — what ``ring.save`` got besides models, optimizers and schedulers, and
    ``ring.extras`` (``model_args``, ``best_val_loss``...) — from a file or a sharded folder alike, on the CPU,
    with no process group and no tensor read from a folder's shards: what a script needs before it builds its
    model (``rt.checkpoint_values(path)["model_args"]``)."""
    if is_sharded_checkpoint(path):
        check(path)
        info = files.read(os.path.join(path, INFO))
        tree = join(info["skeleton"], {})
        return {k: value_reader.decode(v, k) for k, v in tree.items() if dict(info.get("kinds", {})).get(k) == "value"}
    ckpt = files.read(path)
    meta = ckpt.get(files.META_KEY)
    listed = set(meta.get("extras") or []) if isinstance(meta, dict) else set()
    return {k: value_reader.decode(v, k) for k, v in ckpt.items()
            if k != files.META_KEY and (k in listed or not _is_state(v))}


def _is_state(value: Any) -> bool:
    """A model's or optimizer's state dict (tensors, or an optimizer's ``state``/``param_groups``)."""
    if isinstance(value, Mapping):
        if set(value) >= {"state", "param_groups"}:
            return True
        return bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())
    return False


def consolidate(folder: str, out: str) -> dict[str, Any]:
    """One process, no group: write ``folder`` as one plain ``torch.save`` file at ``out``; returns it.

    ``torch.load(out)["model"]`` is a plain state dict under the model's own names; optimizers are
    numbered as ``optimizer.state_dict()`` numbers them, so plain PyTorch and ``ring.load`` read it.
    """
    tree, kinds, meta = load(folder, lambda key, shape, dtype: torch.empty(shape, dtype=dtype))
    for name, kind in kinds.items():
        if kind == "optimizer" and name in tree:
            tree[name] = optimizer_by_index(tree[name])
    tree[files.META_KEY] = meta
    files.atomic_save(tree, out)
    return tree
