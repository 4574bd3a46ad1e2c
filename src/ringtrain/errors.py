"""The one error type users see, and how it is worded.

Every user-facing error says what was asked, what was found, and ends with
``HINT: <what to do>`` (docs/architecture.md, "Principles"). A command line's own mistakes (an unknown
flag, a missing value) are worded the same way: ``HintingParser``. A part that needs a package ringtrain does
not install by itself (matplotlib for pictures, scikit-learn for the digits, tensorboard) says which extra
brings it: ``missing_extra`` / ``import_extra``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from types import ModuleType


class RingtrainError(RuntimeError):
    """A mistake in how ringtrain was asked to run, with the fix in ``hint``."""

    def __init__(self, message: str, hint: str):
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\nHINT: {hint}")


def on_rank(error: RingtrainError, rank: int) -> RingtrainError:
    """``error``, marked as what happened on ``rank`` and is raised on every rank (a save rank 0 could not write):
    the others' failure posts then name that rank as the cause (liveness/membership.post_failure)."""
    error.on_rank = rank  # type: ignore[attr-defined]
    return error


def one_line(error: BaseException, limit: int = 500) -> str:
    """``ValueError: boom``: an exception's type and the first line of its message, for a report or a post
    (the rest of a long message, torch's advice included, is for the traceback)."""
    lines = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__)[:limit]


# The extras of pyproject.toml's [project.optional-dependencies] that ringtrain's optional parts name, and the
# package each brings for a module (tests/cli/test_commands.py checks both against pyproject.toml and every command).
EXTRA_PACKAGES = {"matplotlib": "matplotlib", "sklearn": "scikit-learn", "tensorboard": "tensorboard"}


def missing_extra(module: str, extra: str, what: str) -> RingtrainError | None:
    """None when ``module`` can be imported; else the error that names the extra bringing it. Only looks
    (``find_spec``, no import): what a command asks before it starts work that would need the module."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a module set to None
        found = False
    return None if found else _extra_error(module, extra, what)


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """``import module``; when it is not installed (or does not import), the error that names the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _extra_error(module, extra, what, e) from e


def pyplot(extra: str, what: str) -> ModuleType:
    """``matplotlib.pyplot`` drawing to files (Agg: CI machines and ssh sessions have no display); where matplotlib
    is missing, the error that names ``extra``."""
    import_extra("matplotlib", extra, what).use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _package(module: str) -> str:
    top = module.split(".")[0]
    return EXTRA_PACKAGES.get(top, top)


def extra_hint(module: str, extra: str) -> str:
    """``pip install "ringtrain[plot]" (it brings matplotlib; or pip install matplotlib).``"""
    package = _package(module)
    return f'pip install "ringtrain[{extra}]" (it brings {package}; or pip install {package}).'


def _extra_error(module: str, extra: str, what: str, error: ImportError | None = None) -> RingtrainError:
    absent = error is None or isinstance(error, ModuleNotFoundError) and error.name in (module.split(".")[0], module)
    found = "is not installed" if absent else f"does not import ({one_line(error)})"
    return RingtrainError(f"{what} needs {_package(module)}, which {found}", extra_hint(module, extra))


class HintingParser(argparse.ArgumentParser):
    """The subcommands' parser: argparse's own errors (unknown flag, missing value) also end with a
    HINT, and exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nHINT: see `{self.prog} --help`.\n")
