"""A plan's rows and how they are shown: the table, the JSON file (its schema in docs/plan.md), the bar chart."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import RingtrainError, pyplot
from .devices import GiB
from .trace import PARTS

SCHEMA = "ringtrain.plan/1"


@dataclass
class Row:
    """One layout's plan, per rank: the peak and its parts (bytes), whether it fits, FLOPs, time, MFU."""

    layout: str
    strategy: str
    world_size: int
    ac: str
    offload: bool
    peak: int = 0
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    temporaries: int = 0
    host: int = 0  # CPU offload: bytes in host memory instead
    fits: bool = False
    flops: int = 0  # this rank's, one step, recomputation included
    traffic: dict[str, int] = field(default_factory=dict)  # mesh dim -> bytes one rank sends per step
    step_s: float = 0.0
    mfu: float = 0.0
    fastest: bool = False
    trace_s: float = 0.0  # how long planning this layout took (wall clock)
    trace_cpu_s: float = 0.0  # and this process's CPU time for it
    error: str | None = None  # why it could not be planned

    def parts(self) -> dict[str, int]:
        return {p: getattr(self, p) for p in PARTS}


@dataclass
class Plan:
    """The rows of a plan, with what they were planned for (``meta``), in the table's order."""

    rows: list[Row]
    meta: dict[str, Any]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Row:
        return self.rows[i]

    def fastest(self) -> Row | None:
        return next((r for r in self.rows if r.fastest), None)

    def table(self) -> str:
        return table(self)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **self.meta, "rows": [asdict(r) for r in self.rows]}

    def save(self, folder: str) -> list[str]:
        """``plan.json``, ``plan.txt`` and ``plan.png`` in ``folder`` (the picture only where matplotlib is
        installed); their paths."""
        os.makedirs(folder, exist_ok=True)
        paths = [os.path.join(folder, n) for n in ("plan.json", "plan.txt", "plan.png")]
        _write(paths[0], json.dumps(self.to_json(), indent=2) + "\n")
        _write(paths[1], self.table() + "\n")
        try:
            bars_png(self, paths[2])
        except RingtrainError as e:  # no matplotlib: the plan is written without its picture, and that is said
            print(f"ringtrain plan: {e}", flush=True)
            return paths[:2]
        return paths

    def __repr__(self) -> str:
        return self.table()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def gib(n: int) -> str:
    return f"{n / GiB:.2f}" if n >= 0.01 * GiB else f"{n / 2**20:.1f}M"


def seconds(s: float) -> str:
    return f"{s:.2f}s" if s >= 1 else f"{s * 1e3:.1f}ms" if s >= 1e-3 else f"{s * 1e6:.0f}us"


def table(plan: Plan) -> str:
    m = plan.meta
    head = (f"ringtrain plan: {m['parameters'] / 1e6:,.1f} M parameters, {m['world_size']} ranks "
            f"({m['nnodes']} node(s)), precision {m['precision']}, device {m['device']} "
            f"({m['device_memory'] / GiB:.0f} GiB, {m['peak_tflops']:g} TFLOPS peak); memory per rank in GiB")
    cols = ("layout", "peak", "params", "grads", "optim", "activ", "temp", "fits", "TFLOP", "step", "MFU")
    rows = []
    for r in plan.rows:
        if r.error:
            rows.append((("* " if r.fastest else "  ") + r.layout, "error", r.error[:60], "", "", "", "", "", "", "",
                         ""))
            continue
        rows.append((("* " if r.fastest else "  ") + r.layout, gib(r.peak), gib(r.parameters), gib(r.gradients),
                     gib(r.optimizer), gib(r.activations), gib(r.temporaries), "yes" if r.fits else "NO",
                     f"{r.flops / 1e12:.2f}", seconds(r.step_s), f"{100 * r.mfu:.0f}%"))
    widths = [max(len(c), *(len(x[i]) for x in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cols))]
    for x in rows:
        if x[1] == "error":
            lines.append(f"{x[0].ljust(widths[0])}  error: {x[2]}")
            continue
        lines.append("  ".join(v.ljust(widths[i]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(x)))
    best = plan.fastest()
    if best is not None:
        lines.append(f"* fastest that fits (most samples a second: the highest MFU): {best.layout} "
                     f"({seconds(best.step_s)} a step predicted): {best.strategy}")
    else:
        lines.append("no layout fits the device: HINT: a smaller batch, activation checkpointing, more ranks, "
                     "or a device with more memory.")
    return "\n".join(lines)


def bars_png(plan: Plan, path: str) -> str:
    """Stacked bars: each layout's peak per rank by part, the device's memory as a dashed line; the fastest that
    fits marked with a star."""
    plt = pyplot("plot", "drawing plan.png")
    rows = [r for r in plan.rows if not r.error]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.8))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [getattr(r, part) / GiB for r in rows]
        ax.bar(range(len(rows)), values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(plan.meta["device_memory"] / GiB, color="black", linestyle="--", linewidth=1,
               label=f"{plan.meta['device']} memory")
    for i, r in enumerate(rows):
        if r.fastest:
            ax.annotate("*", (i, bottom[i]), ha="center", va="bottom", fontsize=16)
    ax.set_xticks(range(len(rows)), [r.layout for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("peak memory per rank (GiB)")
    ax.set_title(f"ringtrain plan: {plan.meta['parameters'] / 1e6:,.0f} M parameters on {plan.meta['world_size']} "
                 "ranks (* fastest that fits)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
