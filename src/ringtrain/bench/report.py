"""The results as a table on stdout, ``results.csv`` and ``results.json``."""

from __future__ import annotations

import csv
import json
import os
from typing import Any

# (header, row key, width, format); text columns are left-aligned, numbers right-aligned.
TABLE = [
    ("mode", "mode", 14, "{}"),
    ("W", "world_size", 3, "{}"),
    ("precision", "precision", 10, "{}"),
    ("s/epoch", "epoch_s", 8, "{:.3f}"),
    ("samples/s", "samples_per_s", 9, "{:.0f}"),
    ("±%", "spread_pct", 4, "{:.0f}"),
    ("scaling", "scaling_efficiency", 7, "{:.2f}"),
    ("peak MiB/rank", "peak_mem_mib", 13, "{:.0f}"),
    ("comm/step", "comm_bytes_per_step", 11, None),
    ("loss", "final_loss", 6, "{:.3f}"),
    ("{metric}", "metric", 8, "{:.3f}"),
    ("vs raw-ddp", "ratio_vs_raw_ddp", 10, "{:.3f}"),
]
TEXT = {"mode", "precision"}

CSV_COLUMNS = [
    "workload", "link", "mode", "status", "world_size", "processes", "precision", "epoch_s", "samples_per_s",
    "samples_per_s_min", "samples_per_s_max", "spread_pct", "repeats", "scaling_efficiency", "peak_mem_mib",
    "memory_method", "comm_bytes_per_step", "allreduces_per_step", "comm_method", "final_loss", "metric_name",
    "metric", "ratio_vs_raw_ddp", "samples", "global_batch", "optimizer_steps", "reason",
]


def human_bytes(n: float | None, estimate: bool = False) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            text = f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            return ("~" if estimate and n else "") + text
        n /= 1024
    return str(n)


def _cell(row: dict, key: str, width: int, fmt: str | None) -> str:
    value = row.get(key)
    if key == "comm_bytes_per_step":
        text = human_bytes(value, estimate=str(row.get("comm_method", "")).startswith("estimate"))
    else:
        text = "-" if value is None or value == "" else fmt.format(value)
    return text.ljust(width) if key in TEXT else text.rjust(width)


def table(rows: list[dict], meta: dict) -> str:
    """The stdout table: a header saying what was measured and how, then one line per row."""
    config = meta.get("config", {})
    header = "  ".join((h.format(metric=meta.get("metric_name", "metric"))).ljust(w) if k in TEXT
                       else h.format(metric=meta.get("metric_name", "metric")).rjust(w) for h, k, w, _ in TABLE)
    lines = [
        f"ringtrain bench: {meta.get('describe', meta.get('workload'))}",
        f"  {meta.get('parameters', 0):,} parameters; global batch {meta.get('global_batch')} per optimizer step in "
        f"every mode; {meta.get('timed_steps')} timed steps ({meta.get('steps_per_epoch')} per epoch) after "
        f"{config.get('warmup')} warm-up steps; median of {config.get('repeats')} repeats in alternating order",
        f"  torch {meta.get('torch')} on {meta.get('device_name') or meta.get('device')} "
        f"({meta.get('cpu_count')} cores; {meta.get('threads_per_rank')} torch thread(s) per rank on CPU)",
        *(["  SyncBatchNorm in every mode (--sync-bn)"] if config.get("sync_bn") else []),
        *([f"  ranks behind --link {meta['link']}: a shaped loopback, that rate per direction of each connection"]
          if meta.get("link") else []),
        "",
        header,
        "-" * len(header),
    ]
    for row in rows:
        if row["status"] == "ok":
            lines.append("  ".join(_cell(row, k, w, f) for _, k, w, f in TABLE))
        else:
            lines.append(f"{row['mode']:<14}  {row['status'].upper()} (W={row['world_size']}, precision "
                         f"{row['precision']}): {row['reason']}")
    return "\n".join(lines)


# Seed 004's names for the ways of training (its table: DP, DP+apex, DDP, DDP+apex).
METHOD = {"single": "single process", "dp": "DP", "ddp": "DDP", "ddp+accumulate": "DDP+accumulate", "fsdp": "FSDP",
          "ddp+ac": "DDP+activation checkpointing", "tp": "tensor parallel (x DDP)",
          "ddp+bf16": "DDP+bf16 allreduce", "ddp+powersgd": "DDP+PowerSGD", "ddp+auto": "DDP+auto compression",
          "hvd": "Horovod-style", "hvd+fp16": "Horovod-style+fp16 allreduce", "pipeline": "pipeline",
          "raw-ddp": "DDP (hand-written loop)"}
# Mixed precision is what seed 004 did with apex (amp.initialize); ringtrain does it with torch.amp.
AMP = {"32": "", "bf16-mixed": "+AMP bf16", "16-mixed": "+AMP fp16"}


def training_method(row: dict) -> str:
    """``DDP x2+AMP fp16``: the mode in the seed's words, the process count, the precision."""
    world = row.get("world_size")
    count = f" x{world}" if row["mode"] != "single" and world is not None else ""
    return f"{METHOD.get(row['mode'], row['mode'])}{count}{AMP.get(row['precision'], '+' + str(row['precision']))}"


def seed_table(rows: list[dict], meta: dict) -> str:
    """The measured rows in seed 004's shape: | model | dataset | training method | time(seconds/epoch) | metric |."""
    metric = "Top-1 accuracy" if meta.get("metric_name", "accuracy") == "accuracy" else "Dice"
    syncbn = "SyncBatchNorm on in every mode" if meta.get("config", {}).get("sync_bn") else "plain BatchNorm"
    lines = [f"In seed 004's shape ({syncbn}; {meta.get('device_name') or meta.get('device')}):",
             f"|model|dataset|training method|time(seconds/epoch)|{metric}",
             "|:---:|:---:|:---:|:---:|:---:"]
    model, dataset = meta.get("model") or meta.get("workload"), meta.get("dataset") or ""
    for row in rows:
        if row["status"] != "ok":
            continue
        value = "-" if row.get("metric") is None else f"{row['metric']:.3f}"
        lines.append(f"|{model}|{dataset}|{training_method(row)}|{row['epoch_s']:.2f}s|{value}")
    return "\n".join(lines)


def write_csv(rows: list[dict], meta: dict, path: str, columns: list[str] | None = None) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            flat = {k: _flat(v) for k, v in row.items()}
            writer.writerow({"workload": meta.get("workload"), "metric_name": meta.get("metric_name"),
                             "link": meta.get("link") or "", **flat})


def _flat(value: Any) -> Any:
    return ";".join(map(str, value)) if isinstance(value, list) else value


def write_json(rows: list[dict], meta: dict, records: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": records}, f, indent=1, default=str)
        f.write("\n")


def write_all(rows: list[dict], meta: dict, records: list[dict], out: str, columns: list[str] | None = None) -> list[str]:
    """``results.csv`` (one line per row) and ``results.json`` (meta, rows and every run) in ``out``."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, name) for name in ("results.csv", "results.json")]
    write_csv(rows, meta, paths[0], columns)
    write_json(rows, meta, records, paths[1])
    return paths
