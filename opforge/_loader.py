"""Load the compiled extension, or fail with a message that says what to do."""

from __future__ import annotations

import importlib

import torch

REBUILD = (
    "rebuild opforge against this torch from a source checkout: pip install --no-build-isolation -e . "
    "(or: make build)"
)


def _build_config():
    try:
        return importlib.import_module("opforge._build_config")
    except ImportError:
        return None


def _same_torch(built: str, running: str) -> bool:
    # The C++ ABI is only promised within one release: compare major.minor.patch and the
    # local build tag (+cu130, +cpu), which changes the library set.
    return built == running


def _install_hint(built: str) -> str:
    # A requirement can't name a local version: torch==2.14.1 is what pip takes, and the index
    # decides whether that is the +cu130 or the +cpu build.
    release, _, local = built.partition("+")
    return f"pip install torch=={release}" + (f" (its +{local} build)" if local else "")


def load_extension() -> None:
    """Import opforge._C, whose load registers the ops in torch.ops.opforge."""
    config = _build_config()
    built = getattr(config, "TORCH_VERSION", None)
    running = torch.__version__
    if built is not None and not _same_torch(built, running):
        raise ImportError(
            f"opforge was built against torch {built} but torch {running} is installed, and its compiled "
            f"extension only works with the torch it was built against. Install that torch: "
            f"{_install_hint(built)}; or {REBUILD}"
        )
    try:
        importlib.import_module("opforge._C")
    except ImportError as e:
        if config is None:
            raise ImportError(f"opforge's compiled extension (opforge._C) is not built; {REBUILD}") from e
        raise ImportError(
            f"opforge's compiled extension failed to load ({e}). It was built against torch {built}; "
            f"torch {running} is installed. If they differ, {REBUILD}"
        ) from e
    if not hasattr(torch.ops.opforge, "vector_add"):
        raise ImportError(f"opforge._C loaded but registered no operators; {REBUILD}")


def built_with_cuda() -> bool:
    config = _build_config()
    return bool(getattr(config, "WITH_CUDA", False))
