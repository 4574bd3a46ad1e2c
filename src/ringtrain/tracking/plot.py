"""ringtrain plot: a run folder's curves as pictures a person opens to see how the run went.

Usage:
    ringtrain plot RUN_DIR [--out DIR]

RUN_DIR is the folder ``ring.log`` wrote (``Ring(log_dir=...)``; the path is printed when logging
starts). Writes, into RUN_DIR (or --out):

* ``curves.png`` — every metric of ``metrics.csv`` against the step, one panel per metric, with its
  last value in the panel's title;
* ``ranks.png`` — when ``ranks.csv`` has rows (ring loaders record step times): per rank, the ms of
  a step spent waiting for data, computing, and waiting for the other ranks, against the step. A rank
  whose data share stands out is starving its loader; the others' wait share is the time lost to it.
  Each panel's title has the rank's whole-run figures, added up from the rows as ``ringtrain run``'s
  per-rank table computes them (the same numbers); the bands show each logging interval, the wait
  measured as the table measures it: against the rank fastest over the whole run.

Needs matplotlib: ``pip install "ringtrain[plot]"`` (without it, the command says so and exits 1).

Exit status: 0 written; 1 RUN_DIR has no metrics.csv or it cannot be read, or matplotlib is missing; 2 a usage
error.
"""

from __future__ import annotations

import math
import os
import sys

from ..errors import HintingParser, RingtrainError, missing_extra, pyplot
from ..liveness.stall import per_rank_stats
from .table import read_rows

PARTS = (("data_ms", "data (waiting for the loader)", "#9c9c9c"),
         ("compute_ms", "compute", "#4e79a7"),
         ("wait_ms", "waiting for the other ranks", "#e15759"))  # the colours of timeline_plot.py
MAX_RANK_PANELS = 16


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def series(rows: list[dict[str, str]], columns: list[str]) -> dict[str, tuple[list[float], list[float]]]:
    """Per metric column: the steps and values of the rows that have one."""
    out = {}
    for name in columns:
        if name in ("step", "time"):
            continue
        points = [(_number(r.get("step")), _number(r.get(name))) for r in rows]
        points = [(s, v) for s, v in points if s is not None and v is not None]
        if points:
            out[name] = ([s for s, _ in points], [v for _, v in points])
    return out


def run_totals(rows: list[dict[str, float | None]]) -> dict[int, dict[str, float]]:
    """ranks.csv's rows summed per rank into the step times' counters (``StepTimes.summary()``'s ``steps`` and
    ``total_*``): ``stall.per_rank_stats`` of them is the run's table, over the logged steps."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        steps, rank = row.get("steps"), row.get("rank")
        if rank is None or not steps or row.get("sync_ms") is None:
            continue  # a row of an older ringtrain (no sync_ms) cannot be added up
        total = out.setdefault(int(rank), {"steps": 0.0, "total_data": 0.0, "total_sync": 0.0, "total_step": 0.0})
        total["steps"] += steps
        for key, column in (("total_data", "data_ms"), ("total_sync", "sync_ms"), ("total_step", "ms_per_step")):
            total[key] += (row.get(column) or 0.0) * steps
    return out


EXTRA = "plot"  # pyproject.toml's extra that brings matplotlib


DRAWING = "drawing curves.png and ranks.png"


def _save(fig, path: str) -> str:
    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    return path


def curves_png(curves: dict[str, tuple[list[float], list[float]]], path: str, title: str) -> str:
    plt = pyplot(EXTRA, DRAWING)
    columns = min(3, len(curves))
    rows = math.ceil(len(curves) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.9 * rows + 0.5), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes.flat, curves.items()):
        ax.plot(steps, values, color="#4e79a7", linewidth=1.4, marker="o" if len(steps) < 30 else None, markersize=3)
        ax.set_title(f"{name}: {values[-1]:.4g} at step {steps[-1]:.0f}", fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def against_run_fastest(by_rank: dict[int, list[dict[str, float]]], totals: dict[int, dict[str, float]]) -> None:
    """Each interval's wait measured as the table measures the run's: against the rank fastest over the whole run
    (its synchronising part that interval), so a panel's red band adds up to the wait its title gives — measured
    against each interval's own fastest rank, it added up to more (4 % beside the table's 0.0 %). In place; rows
    without ``sync_ms`` (an older ringtrain) keep the interval's own split."""
    timed = {r: t for r, t in totals.items() if t["steps"]}
    if not timed:
        return
    fastest = min(timed, key=lambda r: timed[r]["total_sync"] / timed[r]["steps"])
    theirs = {v["step"]: v.get("sync_ms") for v in by_rank.get(fastest, [])}
    for values in by_rank.values():
        for v in values:
            reference = theirs.get(v["step"])
            if v.get("sync_ms") is None or reference is None:
                continue
            v["wait_ms"] = max(0.0, v["sync_ms"] - reference)
            v["compute_ms"] = max(0.0, (v.get("ms_per_step") or 0.0) - (v.get("data_ms") or 0.0) - v["wait_ms"])


def ranks_png(rows: list[dict[str, str]], path: str, title: str) -> str:
    by_rank: dict[int, list[dict[str, float]]] = {}
    for r in rows:
        values = {k: _number(v) for k, v in r.items()}
        if values.get("rank") is not None and values.get("step") is not None:
            by_rank.setdefault(int(values["rank"]), []).append(values)
    weight = {r: sum(v.get("steps") or 0.0 for v in vs) or 1.0 for r, vs in by_rank.items()}  # intervals differ in length
    mean_step = {r: sum((v.get("ms_per_step") or 0.0) * (v.get("steps") or 0.0) for v in vs) / weight[r]
                 for r, vs in by_rank.items()}
    # The titles: the whole run's figures, computed as the table `ringtrain run` prints them (the same counters,
    # the same function), not an average of the intervals' own split.
    totals = run_totals([v for vs in by_rank.values() for v in vs])
    whole = per_rank_stats(totals)
    against_run_fastest(by_rank, totals)
    shown = sorted(sorted(by_rank, key=lambda r: -mean_step[r])[:MAX_RANK_PANELS])  # the slowest, in rank order
    plt = pyplot(EXTRA, DRAWING)
    columns = min(2, len(shown))
    grid = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(grid, columns, figsize=(6.2 * columns, 2.4 * grid + 0.9), squeeze=False,
                             sharex=True, sharey=True)
    for ax, rank in zip(axes.flat, shown):
        points = sorted(by_rank[rank], key=lambda v: v["step"])
        # A row covers the steps since the previous one: drawn "pre" (up to its step), the first row needs where its
        # interval began, or it is not drawn at all (the first steps: the warm-up).
        points.insert(0, {**points[0], "step": max(0.0, points[0]["step"] - (points[0].get("steps") or 0.0))})
        steps = [p["step"] for p in points]
        ax.stackplot(steps, *[[p.get(key) or 0.0 for p in points] for key, _, _ in PARTS],
                     labels=[label for _, label, _ in PARTS], colors=[c for _, _, c in PARTS], step="pre")
        if rank in whole:
            run = whole[rank]
            ax.set_title(f"rank {rank}: {run['steps']} steps, {run['ms_per_step']:.1f} ms/step; data "
                         f"{run['data_pct']:.1f} %, wait {run['wait_pct']:.1f} % (whole run)", fontsize=9)
        else:  # rows without sync_ms (an older ringtrain): the intervals' own split
            shares = {key: sum((p.get(key) or 0.0) * (p.get("steps") or 0.0) for p in points) for key, _, _ in PARTS}
            total = sum(shares.values()) or 1.0
            ax.set_title(f"rank {rank}: {mean_step[rank]:.1f} ms/step; data {100 * shares['data_ms'] / total:.0f} %, "
                         f"wait {100 * shares['wait_ms'] / total:.0f} %", fontsize=9)
        ax.set_ylabel("ms per step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PARTS), fontsize=8, frameon=False)
    more = f" ({len(shown)} slowest of {len(by_rank)} ranks)" if len(shown) < len(by_rank) else ""
    fig.suptitle(f"{title}: where each rank's step goes{more}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot(folder: str, out: str | None = None) -> list[str]:
    """Draw ``curves.png`` (and ``ranks.png`` when there are per-rank rows) of a run folder; their paths."""
    metrics = os.path.join(folder, "metrics.csv")
    if not os.path.isfile(metrics):
        raise RingtrainError(f"{folder!r} has no metrics.csv",
                             "give the folder ring.log wrote (printed as 'ringtrain: logging to ...' when it began).")
    lacking = missing_extra("matplotlib", EXTRA, DRAWING)
    if lacking is not None:
        raise lacking
    out = out or folder
    os.makedirs(out, exist_ok=True)
    columns, rows = read_rows(metrics)
    curves = series(rows, columns)
    if not curves:
        raise RingtrainError(f"{metrics!r} has no logged values yet", "plot it after the first ring.log call.")
    title = os.path.normpath(folder)
    written = [curves_png(curves, os.path.join(out, "curves.png"), title)]
    ranks = os.path.join(folder, "ranks.csv")
    if os.path.isfile(ranks):
        _, rank_rows = read_rows(ranks)
        if rank_rows:
            written.append(ranks_png(rank_rows, os.path.join(out, "ranks.png"), title))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = HintingParser(prog="ringtrain plot", description=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter, usage="ringtrain plot RUN_DIR [--out DIR]")
    parser.add_argument("folder", metavar="RUN_DIR", help="the run folder ring.log wrote")
    parser.add_argument("--out", metavar="DIR", default=None, help="where to write the pictures (default: RUN_DIR)")
    args = parser.parse_args(argv)
    try:
        written = plot(args.folder, args.out)
    except (RingtrainError, OSError) as e:
        text = str(e) if isinstance(e, RingtrainError) else f"{e}\nHINT: check the folder's permissions."
        print(f"ringtrain plot: {text}", file=sys.stderr)
        return 1
    for path in written:
        print(f"ringtrain plot: wrote {path}")
    return 0
