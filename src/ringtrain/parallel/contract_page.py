"""docs/environment.md and its zh-CN twin, generated from the launcher contract's table (contract.VARIABLES):
``python -m ringtrain.parallel.contract_page [zh-CN]``; tests/parallel/test_contract.py checks the pages are
up to date.
"""

from __future__ import annotations

from .contract import VARIABLES


def environment_table(language: str = "en") -> str:
    """``VARIABLES`` as a Markdown table (docs/environment.md, generated from it)."""
    head = {"en": ("Variable", "Settings field", "Type", "Unset means", "Set by", "Meaning"),
            "zh-CN": ("变量", "Settings 字段", "类型", "未设置时", "由谁设置", "含义")}[language]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in VARIABLES:
        names = ", ".join(f"`{name}`" for name in v.name.split(", "))
        field = f"`{v.field}`" if v.field else "—"
        rows.append(f"| {names} | {field} | {v.type} | {v.default} | {v.set_by} | {v.meaning} |")
    return "\n".join(rows) + "\n"



_PAGES = {
    "en": ("# The environment: what `ringtrain run` tells its workers\n\n"
           "Settings cross from `ringtrain run` (and `rt.launch`) to the workers as environment variables, as "
           "torchrun's own do. torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...) and the "
           "schedulers' (`SLURM_*`, `OMPI_*`) are read by the environment detectors "
           "(`src/ringtrain/parallel/environments.py`); every other variable ringtrain sets or reads is below. "
           "One module holds them, `src/ringtrain/parallel/contract.py`: its `VARIABLES` is this table. The rows "
           "with a `Settings` field are the launcher's settings for its workers: `read()` is their one reader (a "
           "bad value is refused with the variable's name and value), `to_environ()` their one writer, and a "
           "`Ring(...)` keyword (`timeline`, `preempt_signal`, `preempt_grace`, `stall_warning`, "
           "`debug_collectives`) wins over its variable. The rows without one (—) are other tools' variables "
           "ringtrain sets for the workers or reads where it works with that tool.\n\n"
           "<!-- generated from ringtrain.parallel.contract.VARIABLES: "
           "python -m ringtrain.parallel.contract_page > docs/environment.md -->\n\n"),
    "zh-CN": ("# 环境变量：`ringtrain run` 告诉 worker 的设置\n\n"
              "设置从 `ringtrain run`（以及 `rt.launch`）以环境变量传给 worker，与 torchrun 自己的变量一样。"
              "torchrun 的变量（`RANK`、`WORLD_SIZE`、`LOCAL_RANK`、`MASTER_ADDR` 等）和调度器的变量（`SLURM_*`、"
              "`OMPI_*`）由环境探测器（`src/ringtrain/parallel/environments.py`）读取；ringtrain 设置或读取的其他所有"
              "变量都在下表中。它们都在一个模块里：`src/ringtrain/parallel/contract.py`，其 `VARIABLES` 即此表。"
              "有 `Settings` 字段的行是 launcher 交给 worker 的设置：`read()` 是唯一的读取者（值不对时报错并指出变量名"
              "和值），`to_environ()` 是唯一的写入者，`Ring(...)` 的关键字（`timeline`、`preempt_signal`、"
              "`preempt_grace`、`stall_warning`、`debug_collectives`）优先于对应变量。没有字段（—）的行是其他工具的"
              "变量，ringtrain 为 worker 设置它们，或在与该工具打交道处读取它们。表中的说明为英文，与代码同源。\n\n"
              "<!-- generated from ringtrain.parallel.contract.VARIABLES: "
              "python -m ringtrain.parallel.contract_page zh-CN > docs/environment.zh-CN.md -->\n\n"),
}


def environment_page(language: str = "en") -> str:
    """docs/environment.md (or its zh-CN twin): the page, generated from ``VARIABLES``."""
    return _PAGES[language] + environment_table(language)


if __name__ == "__main__":
    import sys

    sys.stdout.write(environment_page(sys.argv[1] if len(sys.argv) > 1 else "en"))
