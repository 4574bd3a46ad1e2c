"""From the runs' records to the table's rows: medians, spread, scaling efficiency, ratios.

* samples/s: the median over repeats; spread = (max - min) / 2 / median, in percent.
* time/epoch: samples in one epoch / median samples/s (the timed window may cross an
  epoch boundary or, with ``--steps``, be shorter than an epoch; all steps cost alike).
* scaling efficiency: samples/s / (devices x samples/s of ``single`` at the same precision):
  the speed-up over the un-distributed script per device. Without a ``single`` row, the
  same mode on 1 process is the base.
* ratio vs raw-ddp: the median over repeats of (this run / the raw-ddp run of the same
  repeat, world size and precision) — runs that ran back to back in the same processes.
* final loss / metric: from the last repeat (the one that is evaluated).
* skipped and failed entries that share mode and reason collapse into one row.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from .names import MODES


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(records: list[dict], precisions: list[str]) -> list[dict]:
    ok: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r["status"] == "ok":
            ok[(r["mode"], r["processes"], r["precision"])].append(r)
    rows: dict[tuple, dict] = {}
    for key, runs in ok.items():
        runs.sort(key=lambda r: r["repeat"])
        rates = [r["samples_per_s"] for r in runs]
        last = runs[-1]
        median = _median(rates)
        rows[key] = {
            "mode": key[0], "status": "ok", "processes": key[1], "world_size": last["devices"], "precision": key[2],
            "epoch_s": last["epoch_samples"] / median, "samples_per_s": median,
            "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
            "spread_pct": 100 * (max(rates) - min(rates)) / 2 / median, "repeats": len(runs),
            "scaling_efficiency": None, "ratio_vs_raw_ddp": None,
            "peak_mem_mib": max(r["peak_mem_mib"] for r in runs), "memory_method": last["memory_method"],
            "comm_bytes_per_step": last["comm_bytes_per_step"], "allreduces_per_step": last["allreduces_per_step"],
            "comm_method": last["comm_method"], "final_loss": last["final_loss"], "metric": last["metric"],
            # Every repeat must have seen the same samples; a disagreement shows as a list.
            "samples": _same([r["samples"] for r in runs]), "global_batch": _same([r["global_batch"] for r in runs]),
            "optimizer_steps": _same([r["optimizer_steps"] for r in runs]), "reason": "",
            "_runs": runs,
        }
    for (mode, procs, precision), row in rows.items():
        # One base for every mode, the un-distributed script, so rows compare with each other
        # (ddp's and raw-ddp's efficiencies differ exactly as their speeds do).
        base = rows.get(("single", 1, precision))
        if base is None and mode != "dp":  # dp's 1-process row drives several GPUs: no base of its own
            base = rows.get((mode, 1, precision))
        if base is not None:
            row["scaling_efficiency"] = row["samples_per_s"] / (row["world_size"] * base["samples_per_s"])
        raw = rows.get(("raw-ddp", procs, precision))
        if raw is not None and mode != "dp":
            raw_by_repeat = {r["repeat"]: r["samples_per_s"] for r in raw["_runs"]}
            ratios = [r["samples_per_s"] / raw_by_repeat[r["repeat"]] for r in row["_runs"] if r["repeat"] in raw_by_repeat]
            row["ratio_vs_raw_ddp"] = _median(ratios) if ratios else None
    order = {m: i for i, m in enumerate(MODES)}
    prec_order = {p: i for i, p in enumerate(precisions)}
    out = sorted(rows.values(), key=lambda r: (prec_order.get(r["precision"], 99), r["processes"], order.get(r["mode"], 99)))
    for row in out:
        del row["_runs"]
    return out + _collapsed([r for r in records if r["status"] != "ok"], order)


def _same(values: list):
    return values[0] if all(v == values[0] for v in values) else values


def _collapsed(records: list[dict], order: dict[str, int]) -> list[dict]:
    """One row per (status, mode, reason), listing the world sizes and precisions it covers."""
    groups: dict[tuple, dict] = {}
    for r in records:
        key = (r["status"], r["mode"], r["reason"])
        group = groups.setdefault(key, {"processes": [], "precision": []})
        if r["processes"] not in group["processes"]:
            group["processes"].append(r["processes"])
        if r["precision"] not in group["precision"]:
            group["precision"].append(r["precision"])
    rows = []
    for (status, mode, reason), group in groups.items():
        procs = ",".join(str(p) for p in sorted(group["processes"]))
        rows.append({"mode": mode, "status": status, "processes": procs, "world_size": procs,
                     "precision": ",".join(group["precision"]), "reason": reason})
    return sorted(rows, key=lambda r: (order.get(r["mode"], 99), r["status"], r["processes"]))
