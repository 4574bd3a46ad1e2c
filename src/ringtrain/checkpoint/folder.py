"""``CheckpointDir``: the folder of a run's periodic checkpoints — files, or sharded folders (sharded.py)
for strategies that shard — and its manifest, which lists a checkpoint only once it is complete. The
manifest is input from a file, so it is checked before anything it names is loaded or deleted
(docs/architecture.md, "Inputs are untrusted").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from typing import Any, Mapping

from ..errors import RingtrainError
from . import files, sharded
from .temporaries import TAGGED, os_error_in, temporary, write_failed, writer_gone

_STEP_FILE = re.compile(r"step-(\d{9,})(?:\.pt)?")  # CheckpointDir.path_for's names: files, or sharded folders
# The temporaries ringtrain itself names in a checkpoint folder: atomic_save's and the
# manifest's files ".<final name>.<mkstemp's [a-z0-9_] characters>.tmp", and check_writable's
# probe; a sharded save's staging folder ".step-<n>.<writer>.<mkdtemp's 8 characters>.tmp" (and ".old",
# an older folder on its way out). One of that shape was never renamed to its final name, so it
# never counted. Each is ours only as the kind it is made as (a file, or a folder).
_OWN_TEMPORARY = re.compile(
    r"\.(?:step-\d{9,}\.pt|manifest\.json|ringtrain-write-check|ringtrain\.lock)\.(?:[0-9a-f]{8}-\d+\.)?[a-z0-9_]+\.tmp")
_OWN_STAGING = re.compile(r"\.step-\d{9,}\.(?:[0-9a-f]{8}-\d+\.)?[a-z0-9_]{8}\.tmp(?:\.old)?")
_MANIFEST_HINT = (
    "manifest entries are plain file names in the checkpoint folder (e.g. step-000000012.pt), and only ringtrain "
    "writes the manifest: check who else can write there, then fix manifest.json or delete it (ringtrain "
    "rebuilds it from the checkpoints in the folder, reading each one)."
)


def _plain_file(path: str) -> bool:
    """A regular file or folder, and not a link (a link is never ours to follow or delete when unlisted)."""
    return (os.path.isfile(path) or os.path.isdir(path)) and not os.path.islink(path)


class CheckpointDir:
    """A folder of periodic checkpoints: the last ``keep_last`` complete ones and a manifest.

    A checkpoint is a file (``step-000000012.pt``) or, for a strategy that shards, a
    folder every rank writes its shards into (``step-000000012/``, sharded.py). It
    counts only once the manifest lists it, and the manifest is rewritten atomically
    *after* the checkpoint is on disk — so a crash at any moment leaves the previous
    complete checkpoint as the latest one, never a partial one. Only the main process
    writes the manifest (for an asynchronous sharded save, from its writer thread, once
    every rank's shards are written; the next save waits for it).

    Nothing is lost and nothing outside the folder is touched: the only files
    deleted are ringtrain's own temporaries and checkpoints that rotation drops
    from the manifest; a file the manifest does not list is left alone; a
    missing manifest is rebuilt from the checkpoints that read back whole; a
    manifest entry that is not a plain file name in this folder (absolute,
    ``..``, a link leading out) stops the run before it is loaded or deleted.
    """

    MANIFEST = "manifest.json"

    def __init__(self, folder: str | os.PathLike, keep_last: int = 3):
        self.notes: list[str] = []  # what the main process set aside while choosing where to resume
        if not isinstance(keep_last, int) or keep_last < 1:
            raise RingtrainError(f"Ring got keep_last={keep_last!r}", "keep at least 1 checkpoint.")
        self.folder = os.fspath(folder)
        self.keep_last = keep_last

    @property
    def manifest(self) -> str:
        return os.path.join(self.folder, self.MANIFEST)

    # --- before training (main process) -------------------------------------
    def check_writable(self) -> None:
        """Create the folder if needed and prove that a file can be made in it.

        Called by ``Ring(...)``, so a folder that cannot take checkpoints is named
        before training, not at the first save ``save_every`` steps later.
        """
        self._create()
        try:
            fd, probe = temporary(self.folder, "ringtrain-write-check")
        except OSError as e:
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} is not writable ({type(e).__name__}: {e.strerror or e})",
                "give a checkpoint_dir this user can write to (on a shared file system if several nodes "
                "resume from it), or fix the folder's permissions or mount.",
            ) from e
        os.close(fd)
        os.unlink(probe)

    def prepare(self) -> None:
        """Make the folder ready (main process): create it, remove ringtrain's own
        temporaries a crash left behind, and rebuild a missing manifest."""
        self._create()
        names = sorted(os.listdir(self.folder))
        for name in names:
            path = os.path.join(self.folder, name)
            if _OWN_TEMPORARY.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                found = TAGGED.fullmatch(name)
                if found is None or writer_gone(found["writer"]):  # a live writer's is being written now: left
                    os.unlink(path)
            elif _OWN_STAGING.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
        step_files = [n for n in names if _STEP_FILE.fullmatch(n)]
        if not os.path.lexists(self.manifest):
            if step_files:
                self._rebuild(step_files)
            return
        listed = {e["file"] for e in self._entries()}
        unlisted = [n for n in step_files if n not in listed]
        if unlisted:
            # A complete file a crash left between its rename and the manifest update, an
            # older one a crash left during rotation, or one the user put here: not ours to delete.
            warnings.warn(
                f"ringtrain: {self.folder} holds checkpoint files the manifest does not list; they are "
                f"left in place and not resumed from: {', '.join(unlisted)}",
                stacklevel=2,
            )

    def _create(self) -> None:
        if os.path.lexists(self.folder) and not os.path.isdir(self.folder):
            raise RingtrainError(
                f"checkpoint_dir {self.folder!r} exists and is not a folder",
                "give a checkpoint_dir that is a folder (or a path that does not exist yet).",
            )
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as e:
            raise RingtrainError(
                f"cannot create checkpoint_dir {self.folder!r} ({type(e).__name__}: {e.strerror or e})",
                "give a checkpoint_dir under a folder this user can write to, or create it first with the "
                "right owner (mkdir -p ...).",
            ) from e

    def _rebuild(self, step_files: list[str]) -> None:
        """A manifest for the checkpoints in the folder that read back whole, oldest first."""
        found, unreadable = [], []
        for name in sorted(step_files, key=lambda n: int(_STEP_FILE.fullmatch(n).group(1))):  # type: ignore[union-attr]
            path = os.path.join(self.folder, name)
            problem = self._problem(path) if _plain_file(path) else "not a regular file"
            if problem is None:
                found.append({"file": name, "step": int(_STEP_FILE.fullmatch(name).group(1))})  # type: ignore[union-attr]
            else:
                unreadable.append(f"{name} ({problem})")
        if found:
            self._write_manifest(found)
        warnings.warn(
            f"ringtrain: {self.folder} had no {self.MANIFEST}; "
            + (f"rebuilt it from the complete checkpoints found: {', '.join(e['file'] for e in found)}" if found
               else "no complete checkpoint was found in it")
            + (f"; left in place, not listed: {', '.join(unreadable)}" if unreadable else ""),
            stacklevel=3,
        )

    def own_names(self) -> list[str]:
        """The manifest and every checkpoint in the folder, listed or not (what ``resume="never"`` sets aside)."""
        return sorted(n for n in os.listdir(self.folder) if n == self.MANIFEST or _STEP_FILE.fullmatch(n))

    # --- the manifest ----------------------------------------------------------
    def _inside(self, name: Any) -> str:
        """The path of manifest entry ``name``; refused unless it names a file in this folder."""
        plain = (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and os.path.basename(name) == name
            and not (os.altsep and os.altsep in name)
            and "\0" not in name
        )
        if plain:
            path = os.path.join(self.folder, name)
            if not os.path.islink(path) or os.path.dirname(os.path.realpath(path)) == os.path.realpath(self.folder):
                return path
            found = f"{name!r}, a link to {os.path.realpath(path)!r} outside the folder"
        else:
            found = f"{name!r}, which is not a file name inside the folder"
        raise RingtrainError(f"the checkpoint manifest {self.manifest!r} lists {found}", _MANIFEST_HINT)

    def _entries(self) -> list[dict[str, Any]]:
        """The manifest's entries whose files exist, oldest first, each checked to name a file in here."""
        if not os.path.lexists(self.manifest):
            return []
        try:
            with open(self.manifest) as f:
                entries = json.load(f)["checkpoints"]
            if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
                raise TypeError("'checkpoints' is not a list of {\"file\": ...} entries")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RingtrainError(
                f"the checkpoint manifest {self.manifest!r} is unreadable ({type(e).__name__}: {e})",
                "it is only ever replaced atomically, so something else wrote it: restore it, or delete "
                "manifest.json and ringtrain rebuilds it from the checkpoints in the folder.",
            ) from e
        return [e for e in entries if os.path.exists(self._inside(e["file"]))]

    def _write_manifest(self, entries: list[dict[str, Any]]) -> None:
        """Replace the manifest atomically; a refused write (full disk) keeps the old one and says so."""
        tmp = None
        try:
            fd, tmp = temporary(self.folder, self.MANIFEST)
            with os.fdopen(fd, "w") as f:
                json.dump({"format": files.FORMAT, "checkpoints": entries}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.manifest)
        except BaseException as e:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            if (refused := os_error_in(e)) is not None:
                raise write_failed("the checkpoint manifest", self.manifest, refused,
                                   "the previous manifest is kept, so the newest checkpoint it lists is still the "
                                   "one resumed from") from e
            raise

    # --- reading ---------------------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        """The manifest's entries of the listed checkpoints (``file``, ``step``, ``epoch``, ``seconds``), oldest first."""
        return self._entries()

    def candidates(self) -> list[str]:
        """Paths of the listed checkpoints, newest first."""
        return [os.path.join(self.folder, e["file"]) for e in reversed(self._entries())]

    def seconds_of(self, path: str) -> float | None:
        """How long the save of the listed checkpoint ``path`` took (the manifest's record), or None."""
        name = os.path.basename(path)
        found = [e.get("seconds") for e in self._entries() if e["file"] == name]
        return float(found[-1]) if found and isinstance(found[-1], (int, float)) else None

    def latest(self) -> str | None:
        """Path of the newest listed checkpoint, or None."""
        candidates = self.candidates()
        return candidates[0] if candidates else None

    def latest_readable(self, failed: Mapping[str, str] | None = None) -> str | None:
        """The newest listed checkpoint that reads back whole; None when none is listed.

        A newer one that does not read (damaged on disk, truncated by a full disk after
        its rename) is set aside (``set_aside``), and what was done is left in ``notes``. Each candidate is read once here
        and again by the resume: a second read of one file per restart, in exchange for
        deciding on the main process alone (every rank then loads the same file).
        When every listed checkpoint fails, that is an error rather than a fresh start:
        a passing fault (a file system hiccup) must not send the run back to step 0 and
        then rotate the good checkpoints away. ``failed``: the ones that read whole here but did not load (path ->
        why), passed over, and named in that error; the resume sets them aside once an older one has loaded.
        """
        failed = dict(failed or {})
        candidates = self.candidates()
        problems = []
        for path in candidates:
            if path in failed:
                continue
            problem = self._problem(path)
            if problem is None:
                for damaged, why in problems:  # newer ones that do not read: out of the way of the next saves
                    self.notes.append(self.set_aside(damaged, why, instead=path))
                return path
            problems.append((path, problem))
        if problems or failed:
            found = dict(problems) | {path: f"did not load: {why}" for path, why in failed.items()}
            listed = "; ".join(f"{os.path.basename(p)} ({found[p]})" for p in candidates if p in found)
            raise RingtrainError(
                f"none of the checkpoints listed in {self.manifest!r} can be read: {listed}",
                "check the disk and the files; to start from scratch instead, move the folder away.",
            )
        return None

    def set_aside(self, path: str, why: str, instead: str | None = None) -> str:
        """Move a damaged checkpoint out of the way (renamed ``<name>.damaged``, never deleted) and out of the
        manifest, so the run resumes from an older one and saves again under that step's name; what to say."""
        name = os.path.basename(self._inside(os.path.basename(path)))
        target = os.path.join(self.folder, f"{name}.damaged")
        n = 1
        while os.path.lexists(target):
            n += 1
            target = os.path.join(self.folder, f"{name}.damaged-{n}")
        if os.path.lexists(path):
            try:
                os.rename(path, target)
            except OSError as e:  # a read-only or full folder: name the file, keep it where it is
                raise RingtrainError(
                    f"cannot set aside the damaged checkpoint {path!r} as {os.path.basename(target)} "
                    f"({type(e).__name__}: {e.strerror or e}); it is left in place",
                    "check the checkpoint folder's space and permissions (df -h, ls -ld), or move that checkpoint "
                    "away by hand; the run resumes from the one before it once it is gone.") from e
        self._write_manifest([e for e in self._entries() if e["file"] != name])
        return (f"ringtrain: set aside the damaged checkpoint {name} as {os.path.basename(target)} ({why}); "
                f"resuming from {os.path.basename(instead) if instead else 'an earlier one'}")

    @staticmethod
    def _problem(path: str) -> str | None:
        """Why ``path`` is not a complete ringtrain checkpoint, or None when it is one."""
        if os.path.isdir(path):
            return sharded.problem(path)
        try:
            obj = files.read(path)
        except RingtrainError as e:
            cause = e.__cause__
            if cause is None:
                return e.message
            first = (str(cause).splitlines() or [""])[0].split(". ")[0][:160]  # torch's long advice stays out
            return f"{type(cause).__name__}: {first}"
        if not isinstance(obj.get(files.META_KEY), dict):
            return "not written by ring.save"
        return None

    # --- writing (main process) ------------------------------------------------
    def path_for(self, step: int, folder: bool = False) -> str:
        """Where step ``step``'s checkpoint goes: a file, or a folder (a sharded checkpoint)."""
        return os.path.join(self.folder, f"step-{step:09d}" + ("" if folder else ".pt"))

    def commit(self, path: str, **info: Any) -> None:
        """Record ``path`` (already written) as the newest checkpoint; drop the oldest beyond keep_last."""
        name = os.path.basename(path)
        self._inside(name)
        entries = [e for e in self._entries() if e["file"] != name] + [{"file": name, **info}]
        keep, drop = entries[-self.keep_last :], entries[: -self.keep_last]
        self._write_manifest(keep)
        kept = {e["file"] for e in keep}
        for entry in drop:
            if entry["file"] in kept:  # listed twice (a hand-edited manifest): still needed
                continue
            stale = self._inside(entry["file"])
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale)
            elif os.path.lexists(stale):
                os.unlink(stale)
