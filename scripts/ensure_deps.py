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
    # av (PyAV: opforge[video]) and OpenCV: the video tests write and read clips, and compare the
    # resize with cv2.resize; the benchmarks time OpenCV's CPU preprocessing. transformers
    # (opforge[transformers]): the model tests run small Hugging Face models on opforge attention.
    "test": [
        ("pytest", "pytest>=7"),
        ("numpy", "numpy"),
        ("torchvision", None),
        ("av", "av"),
        ("cv2", "opencv-python-headless"),
        ("transformers", "transformers>=5"),
    ],
    "bench": [
        ("matplotlib", "matplotlib"),
        ("numpy", "numpy"),
        ("torchvision", None),
        ("av", "av"),
        ("cv2", "opencv-python-headless"),
    ],
    # clang-format pinned: another release formats some lines differently, and `make lint` checks them.
    "dev": [("ruff", "ruff==0.17.*"), ("clang_format", "clang-format==19.1.7")],
}


def pip_install(*specs: str) -> None:
    print(f"installing missing packages: {' '.join(specs)}", flush=True)
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *specs])
    if rc != 0:
        sys.exit(f"ensure_deps: `pip install {' '.join(specs)}` failed (exit {rc})")


def torch_version() -> tuple[int, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__); print(torch.version.cuda)"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"ensure_deps: torch is installed but does not import:\n{out.stderr}")
    version, cuda = out.stdout.split()[:2]
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    return major, minor, cuda


def torchvision_spec() -> str | None:
    """The torchvision release built for the installed torch (0.(minor + 15) for torch 2.x): a bare
    `pip install torchvision` would replace torch with the newest release. PyPI's Linux wheels of
    torchvision are CUDA builds, which do not load beside a CPU-only torch: then none is installed
    and the comparisons against torchvision are skipped."""
    major, minor, cuda = torch_version()
    if cuda == "None" and sys.platform.startswith("linux"):
        print(
            "ensure_deps: this torch is a CPU-only build; PyPI has no matching torchvision, so tests and "
            "benchmarks against torchvision will be skipped",
            flush=True,
        )
        return None
    return f"torchvision=={major - 2}.{minor + 15}.*" if major == 2 else "torchvision"


def main(groups: list[str]) -> int:
    wanted: dict[str, str | None] = {}
    for group in ["build", *groups]:
        for module, spec in NEEDS[group]:
            if importlib.util.find_spec(module) is None:
                wanted[module] = spec
    if "torch" in wanted:  # first: the torchvision to install depends on it
        pip_install(wanted.pop("torch"))
    major, minor, _ = torch_version()
    if (major, minor) < (2, 8):
        sys.exit(f"ensure_deps: opforge needs torch >= 2.8, found {major}.{minor}")
    if "torchvision" in wanted:
        wanted["torchvision"] = torchvision_spec()
    specs = [spec for spec in wanted.values() if spec]
    if specs:
        pip_install(*specs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
