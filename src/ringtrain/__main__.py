"""``python -m ringtrain ...`` is the ``ringtrain`` console script."""

import sys

from ringtrain.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
