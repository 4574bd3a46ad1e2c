"""``timeline.png``: where each rank's step goes, and how much of the all-reduce hid under backward.

Read from the parts timeline.py writes. A step is what the run's per-rank table counts (activity.StepTimes, which
every part carries): one optimizer step, from its first batch's fetch (or the previous optimizer step) to its own —
an epoch's evaluation and checkpoint are no step's. Per rank and step:

* the main thread's phases: data wait, forward, backward, optimizer, checkpoint, the ring's collectives,
  and ``other`` (the rest of the step: the user's own code between ringtrain's calls);
* the gradient all-reduce: the union of the buckets' intervals. Backward *computes* until the last
  bucket's hook is called (its gradients are the last ones ready); all-reduce time inside that
  window is hidden, the rest is waiting — inside ``backward`` (DDP finishes the reductions before
  ``backward()`` returns) or inside the optimizer step (Horovod's ``synchronize()``) — and is drawn
  as "all-reduce, not hidden", taken out of the phase it happened in.

The picture: stacked bars of mean ms per step for each rank over every step kept (the first, which builds DDP's
buckets, included: so the bar is the table's ms/step), with the table's data and wait shares and the hidden share
beside each bar; below, the last steps of every rank as a Gantt chart (main thread, with its waits for buckets drawn
in the colour of "all-reduce, not hidden" as in the bars, and the buckets' own lane), with a legend of every colour
it uses.
"""

from __future__ import annotations

import os
from typing import Iterable

from ..errors import pyplot
from ..liveness.stall import per_rank_stats, per_rank_summary
from .plot import EXTRA as PLOT_EXTRA

PARTS = ("data", "forward", "backward", "all-reduce, not hidden", "optimizer", "checkpoint", "collective", "other")
COLORS = {"data": "#9c9c9c", "forward": "#4e79a7", "backward": "#59a14f", "all-reduce, not hidden": "#e15759",
          "optimizer": "#f28e2b", "checkpoint": "#b07aa1", "collective": "#76b7b2", "evaluation": "#edc948",
          "other": "#e2e2e2", "bucket": "#e15759"}
GANTT_STEPS = 3


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two unions."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def _windows(events: list, step_times: list | None) -> list[tuple[int, float, float, float | None]]:
    """Each step's (index, start s, end s, data ms): the ring's step times (activity.StepTimes, from the first batch's
    fetch or the previous optimizer step to this one's: the table's steps), else — a Horovod script, whose optimizer
    steps end steps — from a step's first main-thread event to the next step's (data unknown: None)."""
    if step_times:
        return [(int(t[0]), float(t[1]), float(t[2]), float(t[3])) for t in step_times]
    by_step: dict[int, list] = {}
    for event in events:
        by_step.setdefault(event[5], []).append(event)
    steps = sorted(by_step)
    starts = {s: min((e[3] for e in by_step[s] if e[2] == 0), default=None) for s in steps}
    out = []
    for i, step in enumerate(steps):
        main = [e for e in by_step[step] if e[2] == 0]
        if starts[step] is None or not any(e[0] in ("backward", "optimizer") and e[1] == "phase" for e in main):
            continue  # a step with nothing to show
        later = [starts[s] for s in steps[i + 1:] if starts[s] is not None]
        out.append((step, starts[step], later[0] if later else max(e[4] for e in by_step[step]), None))
    return out


def step_table(events: list, step_times: list | None = None) -> list[dict]:
    """Per step of one rank (``_windows``): ms in each of ``PARTS``, plus ``allreduce`` (ms, union of the
    buckets), ``hidden`` (ms of it under backward's computation), ``buckets``, ``start`` (s) and ``waiting``
    (the intervals, s, where the main thread waits for buckets: "all-reduce, not hidden")."""
    rows = []
    for step, start, end, data_ms in _windows(events, step_times):
        inside = [(e, max(e[3], start), min(e[4], end)) for e in events if e[4] > start and e[3] < end]
        comm = _union((a, b) for e, a, b in inside if e[1] == "allreduce")
        ready = [a for e, a, _ in inside if e[1] == "allreduce"]
        phases: dict[str, list[tuple[float, float]]] = {}
        for e, a, b in inside:
            if e[2] == 0:
                phases.setdefault(e[0] if e[1] == "phase" else "collective", []).append((a, b))
        computing = _union([(a, min(b, max(ready))) if ready else (a, b) for a, b in phases.get("backward", [])])
        row = {"step": step, "start": start, "buckets": len(ready), "allreduce": _length(comm) * 1e3,
               "hidden": _overlap(comm, computing) * 1e3, "backward_seen": "backward" in phases}
        waiting: list[tuple[float, float]] = []
        collectives = _union(phases.get("collective", []))
        for name in ("data", "forward", "backward", "optimizer", "checkpoint", "evaluation"):
            spans = _union(phases.get(name, []))
            # waiting for buckets inside this phase: all-reduce time there, minus backward's computing
            wait = _minus(_intersect(comm, spans), computing) if name in ("backward", "optimizer") else []
            waiting += wait
            own = _length(spans) - _overlap(spans, collectives) - _length(wait)  # a collective is shown as itself
            key = name if name != "evaluation" else "other"
            row[key] = row.get(key, 0.0) + max(own, 0.0) * 1e3
        if data_ms is not None:
            row["data"] = data_ms  # the table's figure (the same fetches, on the step times' clock)
        row["waiting"] = waiting
        row["all-reduce, not hidden"] = _length(waiting) * 1e3
        row["collective"] = _length(collectives) * 1e3
        row["total"] = (end - start) * 1e3
        row["other"] = row.get("other", 0.0) + max(row["total"] - sum(row.get(k, 0.0) for k in PARTS), 0.0)
        rows.append(row)
    return rows


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of union ``a`` outside union ``b``."""
    out = []
    for start, end in a:
        for s, e in b:
            if e <= start or s >= end:
                continue
            if s > start:
                out.append((start, s))
            start = max(start, e)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return _union((max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if min(e1, e2) > max(s1, s2))


def summary(parts: dict[int, dict]) -> dict[int, dict]:
    """Per rank: mean ms per step of each of ``PARTS``, ``step`` ms, ``allreduce`` ms, ``hidden_pct`` (None without a
    recorded backward), ``steps`` (the steps the part holds: every step of the run, up to KEEP_STEPS), ``buckets``
    per step, and ``table``: the run's per-rank figures (stall.per_rank_stats of the step times every rank's part
    carries: what ``ringtrain run`` prints at the end), or None for a part without them (a Horovod script)."""
    table = per_rank_stats({r: p.get("times") or {} for r, p in parts.items()})
    out = {}
    for rank, part in sorted(parts.items()):
        rows = step_table(part["events"], part.get("step_times"))
        if not rows:
            out[rank] = {"steps": 0, "table": table.get(rank)}
            continue
        mean = {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in (*PARTS, "total", "allreduce", "hidden")}
        seen = any(r["backward_seen"] for r in rows)
        out[rank] = {**{k: mean[k] for k in PARTS}, "step": mean["total"], "allreduce": mean["allreduce"],
                     "hidden_pct": (100.0 * mean["hidden"] / mean["allreduce"]) if seen and mean["allreduce"] else None,
                     "steps": len(rows), "buckets": max(r["buckets"] for r in rows), "table": table.get(rank)}
    return out


def format_summary(parts: dict[int, dict]) -> str:
    """The run's per-rank table (the one ``ringtrain run`` prints), then where each step goes, in ms per step."""
    rows = summary(parts)
    lines = []
    table = per_rank_summary({r: p.get("times") or {} for r, p in parts.items()})
    if table:
        lines += [table, ""]
    lines.append("where the steps go (mean ms per step):")
    lines.append("rank  steps  ms/step  " + "  ".join(f"{p.split(',')[0][:10]:>10}" for p in PARTS) + "  hidden")
    for rank, row in rows.items():
        if not row["steps"]:
            lines.append(f"{rank:>4}  no complete step")
            continue
        hidden = "n/a" if row["hidden_pct"] is None else f"{row['hidden_pct']:.0f} %"
        lines.append(f"{rank:>4}  {row['steps']:>5}  {row['step']:>7.2f}  "
                     + "  ".join(f"{row[p]:>10.2f}" for p in PARTS) + f"  {hidden}")
    return "\n".join(lines)


def _label(row: dict) -> str:
    """The words beside a rank's bar: the run's table figures, then the all-reduce and how much of it hid."""
    hidden = "" if row["hidden_pct"] is None else f", {row['hidden_pct']:.0f} % hidden under backward"
    table = row.get("table")
    if table:
        head = (f"{table['ms_per_step']:.1f} ms/step; data {table['data_pct']:.1f} %, wait {table['wait_pct']:.1f} %")
    else:
        head = f"{row['step']:.1f} ms/step"
    return f"  {head}; all-reduce {row['allreduce']:.1f} ms{hidden}"


def timeline_png(parts: dict[int, dict], path: str) -> str:
    fig = figure(parts)  # says which extra brings matplotlib, where it is missing
    import matplotlib.pyplot as plt

    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def figure(parts: dict[int, dict]):
    """The picture as a matplotlib Figure (the caller saves and closes it)."""
    plt = pyplot(PLOT_EXTRA, "drawing timeline.png")
    from matplotlib.patches import Patch

    ranks = sorted(parts)
    stats = summary(parts)
    fig, (bars, gantt) = plt.subplots(2, 1, figsize=(11, 3.4 + 1.2 * len(ranks)),
                                      gridspec_kw={"height_ratios": [1, 1.4]})
    # --- where the step goes ---------------------------------------------------------------------
    for y, rank in enumerate(ranks):
        row, left = stats[rank], 0.0
        if not row["steps"]:
            continue
        for part in PARTS:
            bars.barh(y, row[part], left=left, color=COLORS[part], edgecolor="white", linewidth=0.5,
                      label=part if y == 0 else None)
            left += row[part]
        bars.text(left, y, _label(row), va="center", fontsize=8)
    bars.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    bars.invert_yaxis()
    bars.set_xlabel("ms per step (mean)")
    right = max((stats[r].get("step", 0.0) for r in ranks), default=1.0)
    bars.set_xlim(0, right * 2.2 or 1.0)
    bars.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32 - 0.05 / max(len(ranks), 1)), fontsize=7,
                ncol=len(PARTS), frameon=False)
    counted = max((stats[r]["steps"] for r in ranks), default=0)
    timed = any(stats[r].get("table") for r in ranks)
    bars.set_title(f"Where each rank's step goes (mean of {counted} steps"
                   + ("; ms/step, data and wait as in the run's per-rank table)" if timed else ")"), fontsize=10)
    # --- the last steps, as they happened ---------------------------------------------------------
    t0, t1 = _window(parts)
    labels = []
    drawn: dict[str, str] = {}  # legend label -> colour, for every colour the chart uses
    for y, rank in enumerate(ranks):
        for event in parts[rank]["events"]:
            name, category, lane, start, end = event[:5]
            if end < t0 or start > t1:
                continue
            left, width = (start - t0) * 1e3, max(end - start, 0.0) * 1e3
            if lane == 1:
                bucket = (event[6] or {}).get("bucket", 0)
                gantt.barh(2 * y + 0.6, width, left=left, height=0.5, color=COLORS["bucket"],
                           alpha=0.55 + 0.45 * (bucket % 2), edgecolor="none")
                drawn["gradient bucket's all-reduce (own lane)"] = COLORS["bucket"]
            else:
                key = name if category == "phase" and name in COLORS else "collective"
                gantt.barh(2 * y, width, left=left, height=0.8 if category == "phase" else 0.45,
                           color=COLORS[key], edgecolor="none")
                drawn[key] = COLORS[key]
        # where the main thread waits for buckets after backward computed its last gradient: drawn over the phase
        # it happens in, as in the bars above (the bars once overlapped backward, the header said 0 %)
        for row in step_table(parts[rank]["events"], parts[rank].get("step_times")):
            for start, end in row["waiting"]:
                if end >= t0 and start <= t1:
                    gantt.barh(2 * y, (end - start) * 1e3, left=(start - t0) * 1e3, height=0.8,
                               color=COLORS["all-reduce, not hidden"], edgecolor="none")
                    drawn["all-reduce, not hidden"] = COLORS["all-reduce, not hidden"]
        labels += [(2 * y, f"rank {rank}"), (2 * y + 0.6, "  all-reduce")]
    gantt.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    gantt.invert_yaxis()
    gantt.set_xlim(0, max((t1 - t0) * 1e3, 1e-3))
    gantt.set_xlabel(f"ms (the last {GANTT_STEPS} steps of rank {ranks[0]}; buckets alternate in shade)")
    gantt.set_title("The last steps: main thread and each gradient bucket's all-reduce", fontsize=10)
    order = [*PARTS, "evaluation"]
    keys = sorted(drawn, key=lambda k: order.index(k) if k in order else len(order))
    shade = {"gradient bucket's all-reduce (own lane)": 0.7}  # drawn lighter than the main thread's red
    gantt.legend([Patch(color=drawn[k], alpha=shade.get(k, 1.0)) for k in keys], keys, loc="upper center", fontsize=7,
                 frameon=False,
                 ncol=min(len(keys), 5), bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    return fig


def _window(parts: dict[int, dict]) -> tuple[float, float]:
    """From the start of the last few steps of the first rank to the end of its last one."""
    first = parts[min(parts)] if parts else None
    rows = step_table(first["events"], first.get("step_times")) if first else []
    if not rows:
        times = [t for p in parts.values() for e in p["events"] for t in (e[3], e[4])] or [0.0, 1.0]
        return min(times), max(times)
    last = rows[-GANTT_STEPS:]
    return last[0]["start"], last[-1]["start"] + last[-1]["total"] / 1e3
