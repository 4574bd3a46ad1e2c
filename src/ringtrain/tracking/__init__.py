"""One log for the whole job: ``ring.log`` (run_log.py), its collective (reduce.py), the run folder's CSV
files (table.py), one adapter per backend (adapter.py, to_*.py) and ``ringtrain plot`` (plot.py)."""

from .run_log import RunLog, default_folder

__all__ = ["RunLog", "default_folder"]
