"""The collectives of a ``ring.log`` call: a check that every rank logs the same names (a fixed-size row each), then
every rank's values, and its step times, in one matrix.

Each rank fills its own row of a ``world_size x (1 + n + 4)`` float64 matrix — a fingerprint of the
metric names, its ``n`` values, and its step counters since the previous call (steps, ms waiting for
data, ms in the synchronising part, ms in whole steps: activity.StepTimes) — and zeros elsewhere; one
``all_reduce(sum)`` gives every rank the whole matrix. Mean, sum, max, min or rank 0's value are then
read off the columns with no second round trip, and so is the per-rank data / compute / wait split
of the interval (stall.per_rank_stats) that ``ranks.csv`` keeps. The matrix is small (8 bytes per rank
per value) and the call is made at the user's own frequency, never per batch behind their back.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Mapping

import torch

from ..errors import RingtrainError
from ..liveness.stall import per_rank_stats

REDUCTIONS = ("mean", "sum", "max", "min", None)
TIMES = ("steps", "total_data", "total_sync", "total_step")  # activity.StepTimes counters, in this order


def check_reduce(reduce: Any) -> None:
    if reduce not in REDUCTIONS:
        raise RingtrainError(f"ring.log got reduce={reduce!r}",
                             "use 'mean' (the default), 'sum', 'max', 'min', or None (rank 0's own value).")


def fingerprint(names: list[str]) -> float:
    """The metric names, as a number every rank can compare in the same matrix (exact in float64)."""
    return float(zlib.crc32("\0".join(names).encode()))


def values_of(values: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """The names and the scalar values of ``values``; anything that is not one scalar number is named."""
    if not isinstance(values, Mapping) or not values:
        raise RingtrainError(f"ring.log got {type(values).__name__} {values!r:.80}",
                             'give a non-empty dict of names to numbers: ring.log({"loss": loss, "acc": acc}).')
    names, out = [], []
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            raise RingtrainError(f"ring.log got the metric name {name!r}", "name each value with a non-empty string.")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise RingtrainError(f"ring.log got {name}= a tensor of shape {tuple(value.shape)}",
                                     f"log one number per name: {name}=t.mean(), or one name per element.")
            value = value.detach().reshape(())
        elif not isinstance(value, (int, float)):
            raise RingtrainError(f"ring.log got {name}={type(value).__name__} {value!r:.60}",
                                 "log numbers or one-element tensors.")
        names.append(name)
        out.append(value)
    return names, out


def agree(names: list[str], *, rank: int, world_size: int, device: torch.device,
          all_reduce: Callable[[torch.Tensor], torch.Tensor],
          gather_object: Callable[[Any], list[Any]]) -> None:
    """Every rank logs the same names, checked before the matrix (whose width is the number of values) is
    reduced: ranks with different counts would hand the engine differently sized buffers (Gloo aborts the
    process, "Received data size doesn't match"). A fixed-size row each (the names' fingerprint and count);
    only when they differ are the names themselves gathered, to say which metric which rank logs."""
    if world_size == 1:
        return
    marks = torch.zeros(world_size, 2, dtype=torch.float64, device=device)
    marks[rank] = torch.tensor([fingerprint(names), float(len(names))], dtype=torch.float64, device=device)
    marks = all_reduce(marks).cpu()
    if bool((marks != marks[0]).any()):
        every = gather_object(names)
        theirs = [(r, n) for r, n in enumerate(every) if n != every[0]]
        only = sorted(set().union(*map(set, every)) - set(every[0]).intersection(*map(set, every[1:])))
        raise RingtrainError(
            "ring.log was called with other metric names on rank(s) "
            f"{[r for r, _ in theirs]} than on rank 0 ({', '.join(every[0])} on rank 0; "
            + "; ".join(f"{', '.join(n) or 'nothing'} on rank {r}" for r, n in theirs) + ")"
            + (f": {', '.join(only)} not logged by every rank" if only else ""),
            "call ring.log with the same names, in the same order, on every rank (log 0.0, or a value every "
            "rank has, for a metric that only some ranks compute).")


def gather(names: list[str], values: list[Any], times: list[float], *, rank: int, world_size: int,
           device: torch.device, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Every rank's row, on every rank (on the CPU): the collective of the call (after ``agree``)."""
    width = 1 + len(values) + len(TIMES)
    row = torch.stack([v.to(device=device, dtype=torch.float64) if isinstance(v, torch.Tensor)
                       else torch.tensor(float(v), dtype=torch.float64, device=device)
                       for v in [fingerprint(names), *values, *times]])
    if world_size == 1:
        return row.reshape(1, width).cpu()
    matrix = torch.zeros(world_size, width, dtype=torch.float64, device=device)
    matrix[rank] = row
    return all_reduce(matrix).cpu()


def reduced(names: list[str], matrix: torch.Tensor, reduce: str | None) -> dict[str, float]:
    """The values of the call, reduced over the ranks as asked."""
    marks = matrix[:, 0]
    if bool((marks != marks[0]).any()):
        odd = [r for r in range(len(marks)) if marks[r] != marks[0]]
        raise RingtrainError(f"ring.log was called with other metric names on rank(s) {odd} than on rank 0 "
                             f"({', '.join(names)} here)",
                             "call ring.log with the same names, in the same order, on every rank.")
    values = matrix[:, 1:1 + len(names)]
    if reduce is None:
        column = values[0]
    elif reduce == "mean":
        column = values.mean(0)
    else:
        column = getattr(values, reduce)(0)
        column = column.values if reduce in ("max", "min") else column
    return dict(zip(names, column.tolist()))


def rank_rows(matrix: torch.Tensor) -> list[dict[str, float]]:
    """Per rank, over the steps since the previous call: ms per step, its data / compute / wait parts, and the
    synchronising part's ms (``sync_ms``: with ``steps``, ``ms_per_step`` and ``data_ms`` the interval's own
    counters back, so the rows of a run add up to the whole run's figures: plot.run_totals)."""
    counters = matrix[:, -len(TIMES):].tolist()
    stats = per_rank_stats({r: dict(zip(TIMES, c)) for r, c in enumerate(counters)})
    rows = []
    for r, s in stats.items():
        ms = s["ms_per_step"]
        rows.append({"rank": r, "steps": s["steps"], "ms_per_step": round(ms, 4),
                     **{f"{part}_ms": round(ms * s[f"{part}_pct"] / 100, 4) for part in ("data", "compute", "wait")},
                     "sync_ms": round(counters[r][2] / s["steps"], 4)})
    return rows

