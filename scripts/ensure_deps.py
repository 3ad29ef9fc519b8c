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
    "test": [("pytest", "pytest>=7"), ("numpy", "numpy"), ("torchvision", None)],
    "bench": [("matplotlib", "matplotlib"), ("numpy", "numpy"), ("torchvision", None)],
    "dev": [("ruff", "ruff")],
}


def torchvision_spec() -> str:
    """The torchvision release built for the installed torch (0.(minor + 15) for torch 2.x):
    a bare `pip install torchvision` would replace torch with the newest release instead."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return f"torchvision=={major - 2}.{minor + 15}.*" if major == 2 else "torchvision"


def main(groups: list[str]) -> int:
    wanted = {}
    for group in ["build", *groups]:
        for module, spec in NEEDS[group]:
            if importlib.util.find_spec(module) is None:
                wanted[module] = spec
    if "torchvision" in wanted:
        if "torch" in wanted:  # install torch first, then the torchvision that matches it
            subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", wanted.pop("torch")])
        wanted["torchvision"] = torchvision_spec()
    if not wanted:
        return 0
    print(f"installing missing packages: {' '.join(wanted.values())}", flush=True)
    return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *wanted.values()])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
