"""``python -m ringtrain.horovod script.py [args ...]``: run a Horovod script as ``python script.py args`` would,
with ``import horovod`` / ``import horovod.torch`` resolving to ringtrain's (the ``_alias`` folder first on
``sys.path`` and on ``PYTHONPATH``, for the processes it starts). For scripts that start their own processes
with ``horovod.run(...)`` (Horovod's ``pytorch_mnist.py --num-proc 2``). Nothing is installed.

``python -m ringtrain.horovod --path`` prints that folder instead, for
``PYTHONPATH=$(python -m ringtrain.horovod --path) python script.py --num-proc 2``.
"""

import os
import runpy
import sys

ALIAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_alias")
USAGE = ("usage: python -m ringtrain.horovod script.py [args ...] | --path\n"
         "HINT: give the Horovod script to run (e.g. python -m ringtrain.horovod pytorch_mnist.py --num-proc 2).")


def main(argv: list) -> None:
    if argv[:1] == ["--path"]:
        print(ALIAS)
        return
    if not argv or argv[0].startswith("-") or not os.path.isfile(argv[0]):
        sys.exit(USAGE if not argv or argv[0].startswith("-") else
                 f"python -m ringtrain.horovod: {argv[0]!r} is not a file\nHINT: give the path of the script to run.")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ALIAS + (os.pathsep + old if old else "")
    sys.argv = list(argv)
    sys.path[0:1] = [os.path.dirname(os.path.realpath(argv[0])), ALIAS]  # as `python script.py`, alias next
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
