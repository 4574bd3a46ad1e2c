"""Put this folder first on PYTHONPATH and name modules in RINGTRAIN_TEST_HIDE (comma-separated): they are then
not importable in this interpreter and in every Python process it starts with that environment — as if they
were not installed (``import torch`` raises ModuleNotFoundError). The tests of missing extras and of commands
that must refuse a bad argument before torch loads (tests/cli/test_commands.py) use it."""

import os
import sys

for _name in filter(None, os.environ.get("RINGTRAIN_TEST_HIDE", "").split(",")):
    sys.modules[_name] = None
