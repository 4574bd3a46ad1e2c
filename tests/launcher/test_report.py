"""The launcher's report files (launcher/report.py): the workers' native crash dumps are read for the
report and never left behind in the temp folder, also when an earlier launcher was killed before its end."""

from __future__ import annotations

import os
import subprocess
import sys

from ringtrain.launcher.report import native_crash, remove_native_dumps
from ringtrain.launcher.worker import native_dump_path


def _touch(path: str, text: str = "") -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def test_dumps_of_this_launcher_and_of_dead_launchers_go_live_ones_stay():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that has exited
    live = os.getppid()  # alive, and not this launcher
    own, gone, kept = (_touch(native_dump_path(pid, 0)) for pid in (os.getpid(), int(dead), live))
    try:
        remove_native_dumps()
        assert not os.path.exists(own) and not os.path.exists(gone)
        assert os.path.exists(kept)
    finally:
        if os.path.exists(kept):
            os.unlink(kept)


def test_a_dump_names_the_crashed_ranks_user_line():
    text = ("Fatal Python error: Aborted\n\n"
            "Thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
            "Current thread 0x00007f0000000002 (most recent call first):\n"
            f'  File "{os.path.abspath("train.py")}", line 40 in main\n'
            '  File "/usr/lib/python3.11/runpy.py", line 88 in _run_code\n')
    path = _touch(native_dump_path(os.getpid(), 3), text)
    try:
        site, stack = native_crash(3)
        assert site == "train.py:40 in main"
        assert stack.startswith("Current thread") and "line 40 in main" in stack
        assert native_crash(4) is None  # no dump for that rank
    finally:
        os.unlink(path)
