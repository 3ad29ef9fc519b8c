"""Install what `make` targets need and the current Python lacks (nothing when all is there).

Usage: python3 scripts/ensure_deps.py [test|bench|dev]...
torch is installed only when missing: the extension is built against whatever torch is present.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

NEEDS = {
    "build": [
        ("torch", "torch>=2.8"),
        ("ninja", "ninja"),
        ("setuptools", "setuptools>=64"),
        ("wheel", "wheel"),
    ],
    "test": [("pytest", "pytest>=7"), ("numpy", "numpy")],
    "bench": [("matplotlib", "matplotlib"), ("numpy", "numpy")],
    "dev": [("ruff", "ruff")],
}


def main(groups: list[str]) -> int:
    wanted = {}
    for group in ["build", *groups]:
        for module, spec in NEEDS[group]:
            if importlib.util.find_spec(module) is None:
                wanted[module] = spec
    if not wanted:
        return 0
    print(f"installing missing packages: {' '.join(wanted.values())}", flush=True)
    return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *wanted.values()])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
