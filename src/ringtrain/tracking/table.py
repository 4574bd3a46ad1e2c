"""One CSV file of rows keyed by ``step``, written by one process, that survives a ``kill -9``.

Rows are appended and flushed one call at a time: what a killed process already wrote is in the
operating system's hands and stays (only a machine crash can lose the last rows; ``close`` fsyncs).
The file is rewritten whole (a temporary file, fsynced, then ``os.replace``: never half old, half new)
only when it must change shape: a new column appears, or a restarted run drops the rows past the step it
resumed from. A last line cut off mid-write by a kill is dropped when the file is opened again.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from ..errors import RingtrainError


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # every digit: a CSV read back gives the same float
    return str(value)


def read_rows(path: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the complete rows of ``path`` (a cut-off last line is left out)."""
    with open(path, newline="") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a line a kill cut off
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def step_of(row: dict[str, str], path: str) -> float:
    try:
        return float(row["step"])
    except (KeyError, TypeError, ValueError) as e:
        raise RingtrainError(f"the log file {path!r} has a row without a numeric step: {row}",
                             "move the file out of the run folder (ringtrain writes a new one), or give Ring another "
                             "log_dir.") from e


class Table:
    """``path`` with ``first`` columns leading (``step`` first of all), others added as rows bring them."""

    def __init__(self, path: str, first: tuple[str, ...] = ("step",)):
        self.path = path
        self.columns: list[str] = list(first)
        self._file: Any = None
        self._writer: Any = None

    def open(self, keep_through: float | None) -> int:
        """Continue the file: rows with a step past ``keep_through`` (None: keep all) are dropped, as is a line
        cut off by a kill. Returns how many rows were dropped."""
        rows: list[dict[str, str]] = []
        dropped, rewrite = 0, False
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                raw = f.read()
            header, rows = read_rows(self.path)
            if header[:1] != ["step"]:
                raise RingtrainError(f"{self.path!r} is not a ringtrain log (its first column is not 'step')",
                                     "move it away, or give Ring another log_dir.")
            kept = [r for r in rows if keep_through is None or step_of(r, self.path) <= keep_through]
            dropped, rows = len(rows) - len(kept), kept
            self.columns += [c for c in header if c not in self.columns]
            rewrite = bool(dropped) or not raw.endswith(b"\n")
        if rewrite or not os.path.exists(self.path):
            self._rewrite(rows)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)
        return dropped

    def append(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.columns]
        if new:  # a metric logged for the first time: the header grows, the old rows get empty cells
            self.columns += new
            _, rows = read_rows(self.path)
            self._file.close()
            self._rewrite(rows)
            self._file = open(self.path, "a", newline="")
            self._writer = csv.writer(self._file)
        self._writer.writerow([_cell(row.get(c)) for c in self.columns])
        self._file.flush()  # in the kernel's page cache now: a kill -9 of this process cannot lose it

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        folder = os.path.dirname(self.path) or "."
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.tmp-{os.getpid()}")
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            for r in rows:
                writer.writerow([_cell(r.get(c)) for c in self.columns])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
