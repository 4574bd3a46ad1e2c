"""One log for the whole job: ``ring.log`` (run_log.py), its collective (reduce.py), the run folder's CSV
files (table.py), one adapter per backend (adapter.py, to_*.py) and ``ringtrain plot`` (plot.py).

``RunLog`` and ``default_folder`` are loaded on first use (PEP 562): run_log imports torch, and the commands
that live here (``ringtrain plot``, ``ringtrain timeline``) refuse a wrong path before torch loads."""

from __future__ import annotations

from typing import Any

__all__ = ["RunLog", "default_folder"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import run_log  # imports torch: only when a ring logs (see the docstring)

        return getattr(run_log, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
