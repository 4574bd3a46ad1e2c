"""``timeline.png``: where each rank's step goes, and how much of the all-reduce hid under backward.

Read from the parts timeline.py writes. Per rank and step:

* the main thread's phases: data wait, forward, backward, optimizer, checkpoint, the ring's collectives,
  and ``other`` (the rest of the step: the user's own code between ringtrain's calls);
* the gradient all-reduce: the union of the buckets' intervals. Backward *computes* until the last
  bucket's hook is called (its gradients are the last ones ready); all-reduce time inside that
  window is hidden, the rest is waiting — inside ``backward`` (DDP finishes the reductions before
  ``backward()`` returns) or inside the optimizer step (Horovod's ``synchronize()``) — and is drawn
  as "all-reduce, not hidden", taken out of the phase it happened in.

The picture: stacked bars of mean ms per step for each rank (the first step, which builds DDP's
buckets and warms the allocator, is left out when there are more), the hidden share written
beside each bar; below, the last steps of every rank as a Gantt chart (main thread and buckets).
"""

from __future__ import annotations

import os
from typing import Iterable

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


def step_table(events: list) -> list[dict]:
    """Per complete step of one rank: ms in each of ``PARTS``, plus ``allreduce`` (ms, union of the
    buckets), ``hidden`` (ms of it under backward's computation), ``buckets`` and ``start`` (s)."""
    by_step: dict[int, list] = {}
    for event in events:
        by_step.setdefault(event[5], []).append(event)
    steps = sorted(by_step)
    starts = {s: min((e[3] for e in by_step[s] if e[2] == 0), default=None) for s in steps}
    rows = []
    for i, step in enumerate(steps):
        main = [e for e in by_step[step] if e[2] == 0]
        if starts[step] is None or not any(e[0] in ("backward", "optimizer") and e[1] == "phase" for e in main):
            continue  # a loader's last (empty) fetch, or a step with nothing to show
        later = [starts[s] for s in steps[i + 1:] if starts[s] is not None]
        end = later[0] if later else max(e[4] for e in by_step[step])
        comm = _union((e[3], e[4]) for e in by_step[step] if e[1] == "allreduce")
        ready = [e[3] for e in by_step[step] if e[1] == "allreduce"]
        phases: dict[str, list[tuple[float, float]]] = {}
        for e in main:
            key = e[0] if e[1] == "phase" else "collective"
            phases.setdefault(key, []).append((e[3], e[4]))
        computing = [(s, min(e, max(ready))) if ready else (s, e) for s, e in phases.get("backward", [])]
        computing = _union(computing)
        hidden = _overlap(comm, computing)
        row = {"step": step, "start": starts[step], "buckets": len(ready), "allreduce": _length(comm) * 1e3,
               "hidden": hidden * 1e3, "backward_seen": "backward" in phases}
        waiting = 0.0
        collectives = _union(phases.get("collective", []))
        for name in ("data", "forward", "backward", "optimizer", "checkpoint", "evaluation"):
            spans = _union(phases.get(name, []))
            # waiting for buckets inside this phase: all-reduce time there, minus backward's computing
            wait = (_overlap(comm, spans) - _overlap(_intersect(comm, spans), computing)) if name in (
                "backward", "optimizer") else 0.0
            waiting += wait
            own = _length(spans) - _overlap(spans, collectives) - wait  # a collective is shown as itself
            key = name if name != "evaluation" else "other"
            row[key] = row.get(key, 0.0) + max(own, 0.0) * 1e3
        row["all-reduce, not hidden"] = waiting * 1e3
        row["collective"] = _length(collectives) * 1e3
        row["total"] = (end - starts[step]) * 1e3
        row["other"] = row.get("other", 0.0) + max(row["total"] - sum(row.get(k, 0.0) for k in PARTS), 0.0)
        rows.append(row)
    return rows


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return _union((max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if min(e1, e2) > max(s1, s2))


def summary(parts: dict[int, dict]) -> dict[int, dict]:
    """Per rank: mean ms per step of each of ``PARTS``, ``step`` ms, ``allreduce`` ms, ``hidden_pct``
    (None without a recorded backward), ``steps`` averaged and ``buckets`` per step."""
    out = {}
    for rank, part in sorted(parts.items()):
        rows = step_table(part["events"])
        used = rows[1:] if len(rows) > 2 else rows
        if not used:
            out[rank] = {"steps": 0}
            continue
        mean = {k: sum(r.get(k, 0.0) for r in used) / len(used) for k in (*PARTS, "total", "allreduce", "hidden")}
        seen = any(r["backward_seen"] for r in used)
        out[rank] = {**{k: mean[k] for k in PARTS}, "step": mean["total"], "allreduce": mean["allreduce"],
                     "hidden_pct": (100.0 * mean["hidden"] / mean["allreduce"]) if seen and mean["allreduce"] else None,
                     "steps": len(used), "buckets": max(r["buckets"] for r in used)}
    return out


def format_summary(parts: dict[int, dict]) -> str:
    lines = ["rank  steps  ms/step  " + "  ".join(f"{p.split(',')[0][:10]:>10}" for p in PARTS) + "  hidden"]
    for rank, row in summary(parts).items():
        if not row["steps"]:
            lines.append(f"{rank:>4}  no complete step")
            continue
        hidden = "n/a" if row["hidden_pct"] is None else f"{row['hidden_pct']:.0f} %"
        lines.append(f"{rank:>4}  {row['steps']:>5}  {row['step']:>7.2f}  "
                     + "  ".join(f"{row[p]:>10.2f}" for p in PARTS) + f"  {hidden}")
    return "\n".join(lines)


def timeline_png(parts: dict[int, dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display needed: CI machines and ssh sessions have none
    import matplotlib.pyplot as plt

    ranks = sorted(parts)
    stats = summary(parts)
    fig, (bars, gantt) = plt.subplots(2, 1, figsize=(11, 2.6 + 1.1 * len(ranks)),
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
        hidden = "" if row["hidden_pct"] is None else f", {row['hidden_pct']:.0f} % hidden under backward"
        bars.text(left, y, f"  {row['step']:.1f} ms/step; all-reduce {row['allreduce']:.1f} ms{hidden}",
                  va="center", fontsize=8)
    bars.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    bars.invert_yaxis()
    bars.set_xlabel("ms per step (mean)")
    right = max((stats[r].get("step", 0.0) for r in ranks), default=1.0)
    bars.set_xlim(0, right * 1.75 or 1.0)
    bars.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32 - 0.05 / max(len(ranks), 1)), fontsize=7,
                ncol=len(PARTS), frameon=False)
    counted = min((stats[r]["steps"] for r in ranks), default=0)
    bars.set_title(f"Where each rank's step goes (mean of {counted} steps)", fontsize=10)
    # --- the last steps, as they happened ---------------------------------------------------------
    t0, t1 = _window(parts)
    labels = []
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
            else:
                color = COLORS.get(name, COLORS["collective"]) if category == "phase" else COLORS["collective"]
                gantt.barh(2 * y, width, left=left, height=0.8 if category == "phase" else 0.45,
                           color=color, edgecolor="none")
        labels += [(2 * y, f"rank {rank}"), (2 * y + 0.6, "  all-reduce")]
    gantt.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    gantt.invert_yaxis()
    gantt.set_xlim(0, max((t1 - t0) * 1e3, 1e-3))
    gantt.set_xlabel(f"ms (the last {GANTT_STEPS} steps of rank {ranks[0]}; buckets alternate in shade)")
    gantt.set_title("The last steps: main thread and each gradient bucket's all-reduce", fontsize=10)
    fig.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _window(parts: dict[int, dict]) -> tuple[float, float]:
    """From the start of the last few complete steps of the first rank to the end of its last one."""
    rows = step_table(parts[min(parts)]["events"]) if parts else []
    if not rows:
        times = [t for p in parts.values() for e in p["events"] for t in (e[3], e[4])] or [0.0, 1.0]
        return min(times), max(times)
    last = rows[-GANTT_STEPS:]
    return last[0]["start"], last[-1]["start"] + last[-1]["total"] / 1e3
