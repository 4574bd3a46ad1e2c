"""``throughput.png``: samples/s by mode and world size, one panel per precision (matplotlib, Agg).

Each world size is a bar colour; the hand-written DDP loop (``raw-ddp``, the reference every
"vs raw-ddp" ratio is taken against) is also drawn as a dashed line of that colour across the
panel, so each bar reads against it. Modes that could not run are named under the plot with
why, as in the table: a mode missing from the plot without a word reads as forgotten.
"""

from __future__ import annotations

import os
import textwrap

from ..errors import pyplot
from .names import EXTRA, MODES

REFERENCE = "raw-ddp"
_REASON_CHARS = 160  # a skip reason under the plot: its first words; the table has it whole


def world_label(meta: dict) -> str:
    """What W counts: ranks are CPU processes on CPU, one GPU each on CUDA."""
    return "GPUs" if str(meta.get("device", "cpu")).startswith("cuda") else "processes"


def skipped_lines(rows: list[dict]) -> list[str]:
    """``dp (W=1,2, precision 32): no CUDA GPU here ...``: one line per skipped or failed row."""
    lines = []
    for r in rows:
        if r["status"] == "ok":
            continue
        reason = " ".join(str(r.get("reason", "")).split())
        reason = reason if len(reason) <= _REASON_CHARS else reason[:_REASON_CHARS - 3].rstrip() + "..."
        lines.append(f"{r['mode']} (W={r['world_size']}, precision {r['precision']}) {r['status']}: {reason}")
    return lines


def throughput_png(rows: list[dict], meta: dict, path: str) -> str:
    fig = figure(rows, meta)  # imports matplotlib, or says which extra brings it
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure(rows: list[dict], meta: dict):
    """The plot as a matplotlib Figure (the caller saves and closes it)."""
    plt = pyplot(EXTRA, "throughput.png")

    ok = [r for r in rows if r["status"] == "ok"]
    precisions = list(dict.fromkeys(r["precision"] for r in ok)) or ["32"]
    modes = [m for m in MODES if any(r["mode"] == m for r in ok)]
    worlds = sorted({r["world_size"] for r in ok})
    notes = skipped_lines(rows)
    width_in = max(6.0, 1.1 * len(modes) * len(precisions) + 2)
    chars = int(width_in * 14)  # 7-point monospace: about 14 characters an inch
    wrapped = [part for line in notes for part in textwrap.wrap(line, chars, subsequent_indent="    ")]
    legend_in = 0.45  # the legend's row under the panels: inside a panel it covered bars
    height_in = 4.2 + legend_in + 0.18 * (len(wrapped) + 1 if wrapped else 0)
    fig, axes = plt.subplots(1, len(precisions), figsize=(width_in, height_in), squeeze=False, sharey=True)
    width = 0.8 / max(len(worlds), 1)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, precision in zip(axes[0], precisions):
        for i, world in enumerate(worlds):
            colour = colours[i % len(colours)]
            xs, ys, lo, hi = [], [], [], []
            for j, mode in enumerate(modes):
                row = next((r for r in ok if r["mode"] == mode and r["world_size"] == world
                            and r["precision"] == precision), None)
                if row is None:
                    continue
                xs.append(j + (i - (len(worlds) - 1) / 2) * width)
                ys.append(row["samples_per_s"])
                lo.append(row["samples_per_s"] - row["samples_per_s_min"])
                hi.append(row["samples_per_s_max"] - row["samples_per_s"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=colour, label=f"W={world}")
            reference = next((r for r in ok if r["mode"] == REFERENCE and r["world_size"] == world
                              and r["precision"] == precision), None)
            if reference is not None:
                ax.axhline(reference["samples_per_s"], color=colour, linestyle="--", linewidth=1.2,
                           label=f"{REFERENCE} W={world} (hand-written DDP)")
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes, rotation=30, ha="right")
        ax.set_title(f"precision {precision}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (median, min-max)")
    fig.suptitle(f"ringtrain bench: {meta.get('workload')} on {meta.get('device_name') or meta.get('device', '')}",
                 fontsize=10)
    notes_in = 0.0
    if wrapped:
        text = "not run (see the table):\n" + "\n".join(wrapped)
        fig.text(0.01, 0.01, text, fontsize=7, va="bottom", ha="left", family="monospace")
        notes_in = 0.18 * (len(wrapped) + 1) + 0.1
    # One legend for every panel, in a row of its own under them (above the notes): it covers no bar.
    handles: dict[str, object] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    labels = sorted(handles, key=lambda label: (label.startswith(REFERENCE), label))  # the bars, then the lines
    if labels:
        fig.legend([handles[k] for k in labels], labels, title=world_label(meta), loc="lower center",
                   bbox_to_anchor=(0.5, notes_in / height_in), ncol=len(labels), fontsize=8, title_fontsize=8,
                   frameon=False)
    # The panels' rotated mode names sit under the axes: the legend's row is kept free of them.
    fig.tight_layout(rect=(0, (notes_in + legend_in) / height_in, 1, 1))
    return fig
