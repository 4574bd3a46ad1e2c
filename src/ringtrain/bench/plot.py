"""``throughput.png``: samples/s by mode and world size, one panel per precision (matplotlib, Agg)."""

from __future__ import annotations

import os

from .modes import MODES


def throughput_png(rows: list[dict], meta: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display needed: CI machines and ssh sessions have none
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    precisions = list(dict.fromkeys(r["precision"] for r in ok)) or ["32"]
    modes = [m for m in MODES if any(r["mode"] == m for r in ok)]
    worlds = sorted({r["world_size"] for r in ok})
    fig, axes = plt.subplots(1, len(precisions), figsize=(max(6.0, 1.1 * len(modes) * len(precisions) + 2), 4.2),
                             squeeze=False, sharey=True)
    width = 0.8 / max(len(worlds), 1)
    for ax, precision in zip(axes[0], precisions):
        for i, world in enumerate(worlds):
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
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"W={world}")
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes, rotation=30, ha="right")
        ax.set_title(f"precision {precision}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (median, min-max)")
    axes[0][-1].legend(title="devices", loc="best", fontsize=8, framealpha=0.8)
    fig.suptitle(f"ringtrain bench: {meta.get('workload')} on {meta.get('device_name') or meta.get('device', '')}",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
