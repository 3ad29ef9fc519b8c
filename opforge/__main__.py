"""python -m opforge: the same as the ``opforge`` command (opforge/cli.py)."""

import sys

from opforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
