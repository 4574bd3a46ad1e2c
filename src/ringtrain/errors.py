"""The one error type users see, and how it is worded.

Every user-facing error says what was asked, what was found, and ends with
``HINT: <what to do>`` (docs/architecture.md, "Principles"). A command line's own mistakes (an unknown
flag, a missing value) are worded the same way: ``HintingParser``.
"""

from __future__ import annotations

import argparse
import sys


class RingtrainError(RuntimeError):
    """A mistake in how ringtrain was asked to run, with the fix in ``hint``."""

    def __init__(self, message: str, hint: str):
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\nHINT: {hint}")


def one_line(error: BaseException, limit: int = 500) -> str:
    """``ValueError: boom``: an exception's type and the first line of its message, for a report or a post
    (the rest of a long message, torch's advice included, is for the traceback)."""
    lines = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__)[:limit]


class HintingParser(argparse.ArgumentParser):
    """The subcommands' parser: argparse's own errors (unknown flag, missing value) also end with a
    HINT, and exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nHINT: see `{self.prog} --help`.\n")
