"""The repository's scripts/ as modules, for the tests that check what they write (docs/api.md, the site)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"


def script(name: str) -> ModuleType:
    """``scripts/<name>.py``, loaded once (registered under its name: a dataclass in it looks its module up)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
