"""python -m opforge.bench: the same as ``opforge bench``."""

import sys

from opforge.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
