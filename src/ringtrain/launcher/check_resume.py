"""``ringtrain run --check-resume STEP``: does this script resume exactly? Run it, and see.

A user's proof that their loop — prefetches, loaders of its own, evaluation, random draws — continues after a kill
as the run never killed would have. The job runs twice, each time with its rings saving into a folder of
this check's (a checkpoint every step, none deleted; the script's own ``checkpoint_dir`` is left alone): first
uninterrupted to its end, then from its checkpoint of step STEP — what a kill right after that checkpoint and a
restart give. Then every loss ``ring.backward`` saw on every rank past STEP (selfcheck.py records them) and every
checkpoint after STEP (weights, optimizer, extras) are compared, bitwise: "exact", or the first step and tensor that
differ, exit 1. What the script writes itself (its own ``ring.save`` paths, logs) is written by both runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Callable

from ..errors import RingtrainError
from ..parallel import contract


def _say(text: str) -> None:
    print(f"ringtrain run --check-resume: {text}", file=sys.stderr, flush=True)


def check_step(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise RingtrainError(f"--check-resume {value!r} is not a step", "give the optimizer step to stop and resume "
                             "at, >= 1 and before the job's last step, e.g. --check-resume 5.")
    return value


def run(plan: Any, step: int, execute: Callable[[Any], int]) -> int:
    if plan.max_nodes > 1:
        raise RingtrainError("--check-resume runs the job twice on this machine; it takes one node",
                             "check the script's resume on one node (e.g. --nproc-per-node 2), then run it on many.")
    root = tempfile.mkdtemp(prefix="ringtrain-check-resume-")
    reference, resumed = os.path.join(root, "uninterrupted"), os.path.join(root, "resumed")

    def attempt(folder: str) -> int:
        with contract.exported(contract.to_environ(check_resume=folder)):  # the workers' rings save here
            return execute(plan)

    _say(f"1/2: the uninterrupted run, a checkpoint every step into {reference}")
    rc = attempt(reference)
    if rc != 0:
        _say(f"the uninterrupted run ended with exit {rc}: nothing to compare (its files are in {root})")
        return rc
    steps = _listed(reference)
    if step not in steps or max(steps) <= step:
        raise RingtrainError(
            f"--check-resume {step}: the run saved the steps {_span(steps)}, so it "
            + ("never reached step {step}".format(step=step) if step not in steps else "has no step after it"),
            "give a step the job passes and trains beyond (its last step was "
            f"{max(steps) if steps else 'none: does it use ring.steps, ring.epochs or ring.loader?'}).")
    _prepare(reference, resumed, step)
    _say(f"2/2: the run resumed from the checkpoint of step {step}")
    rc = attempt(resumed)
    if rc != 0:
        _say(f"the resumed run ended with exit {rc} (its files are in {root})")
        return rc
    found = compare(reference, resumed, step)
    if found is None:
        later = [s for s in _listed(resumed) if s > step]
        _say(f"exact: resumed from step {step}, the run equals the uninterrupted one — the checkpoints of steps "
             f"{_span(later)} bitwise, and every loss past step {step} on every rank.")
        shutil.rmtree(root, ignore_errors=True)
        return 0
    _say(f"NOT exact: resumed from step {step}, {found}. The runs are in {root}.\nHINT: wrap a prefetching draw "
         "once — `get_batch = ring.batches(get_batch)` —, hand loader objects of the script's own (with "
         "state_dict()/load_state_dict()) to ring.keep, keep other per-rank values in ring.extras, and draw random "
         "numbers from the global generators after ring.setup (docs/exact-resume.md).")
    return 1


def _span(steps: list[int]) -> str:
    return "none" if not steps else f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _listed(folder: str) -> list[int]:
    from ..checkpoint.folder import CheckpointDir  # noqa: PLC0415 - torch, once the job ran

    if not os.path.isdir(folder):
        return []
    return sorted(int(e.get("step", -1)) for e in CheckpointDir(folder).entries() if isinstance(e.get("step"), int))


def _entry(folder: str, step: int) -> dict:
    from ..checkpoint.folder import CheckpointDir  # noqa: PLC0415 - torch, once the job ran

    return next(e for e in CheckpointDir(folder).entries() if e.get("step") == step)


def _prepare(reference: str, resumed: str, step: int) -> None:
    """The resumed run's folder: the checkpoint of ``step`` alone, listed, and the losses recorded before it."""
    from ..checkpoint.folder import CheckpointDir  # noqa: PLC0415 - torch, once the job ran

    entry = _entry(reference, step)
    os.makedirs(resumed)
    source = os.path.join(reference, entry["file"])
    target = os.path.join(resumed, entry["file"])
    (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, target)
    if os.path.isdir(os.path.join(reference, "losses")):
        shutil.copytree(os.path.join(reference, "losses"), os.path.join(resumed, "losses"))
    CheckpointDir(resumed, keep_last=10**6).commit(target, **{k: v for k, v in entry.items() if k != "file"})


def _losses(folder: str) -> dict[tuple[int, int, int], float]:
    from ..checkpoint.selfcheck import read_record  # noqa: PLC0415 - torch, once the job ran

    found = {}
    losses = os.path.join(folder, "losses")
    for name in sorted(os.listdir(losses)) if os.path.isdir(losses) else []:
        if name.startswith("rank-") and name.endswith(".txt"):
            rank = int(name[5:-4])
            for (step, micro), value in read_record(os.path.join(losses, name)).items():
                found[step, micro, rank] = value
    return found


def _tensors(path: str) -> dict[str, Any]:
    """A checkpoint's entries (meta left out) as flat ``entry[key]...`` names -> tensors and plain values."""
    import torch  # noqa: PLC0415 - torch, once the job ran

    from ..checkpoint import files, sharded  # noqa: PLC0415 - torch, once the job ran

    if sharded.is_sharded_checkpoint(path):
        tree, _, _ = sharded.load(path, lambda key, shape, dtype: torch.empty(shape, dtype=dtype))
    else:
        tree = files.read(path)
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}[{k!r}]" if prefix else str(k), v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        else:
            flat[prefix] = value
    walk("", {k: v for k, v in tree.items() if k != files.META_KEY})
    return flat


def compare(reference: str, resumed: str, step: int) -> str | None:
    """The first difference between the two runs past ``step`` (a loss, then a checkpoint's tensor), or None."""
    import torch  # noqa: PLC0415 - torch, once the job ran

    mine, theirs = _losses(resumed), _losses(reference)
    for key in sorted(k for k in theirs if k[0] >= step):
        if key not in mine:
            return f"the resumed run has no loss for step {key[0]}, micro-batch {key[1]} on rank {key[2]}"
        if mine[key] != theirs[key]:
            return (f"the first loss that differs is at step {key[0]}, micro-batch {key[1]}, on rank {key[2]}: "
                    f"{mine[key]!r}, where the uninterrupted run had {theirs[key]!r}")
    for later in [s for s in _listed(reference) if s > step]:
        if later not in _listed(resumed):
            return f"the resumed run has no checkpoint of step {later}"
        a = _tensors(os.path.join(reference, _entry(reference, later)["file"]))
        b = _tensors(os.path.join(resumed, _entry(resumed, later)["file"]))
        for name in sorted(set(a) | set(b)):
            x, y = a.get(name), b.get(name)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y):
                    continue
                diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                return f"the checkpoint of step {later} differs first in {name} (max |difference| {diff:.3g})"
            if type(x) is not type(y) or x != y:
                return f"the checkpoint of step {later} differs first in {name} ({y!r}, uninterrupted {x!r})"
    return None
