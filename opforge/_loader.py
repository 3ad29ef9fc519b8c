"""Load the compiled extension, or fail with a message that says what to do."""

from __future__ import annotations

import importlib

import torch

REBUILD = "rebuild it against this torch: pip install --no-build-isolation -e . (or: make build)"


def _build_config():
    try:
        return importlib.import_module("opforge._build_config")
    except ImportError:
        return None


def _same_torch(built: str, running: str) -> bool:
    # The C++ ABI is only promised within one release: compare major.minor.patch and the
    # local build tag (+cu130, +cpu), which changes the library set.
    return built == running


def load_extension() -> None:
    """Import opforge._C, whose load registers the ops in torch.ops.opforge."""
    config = _build_config()
    built = getattr(config, "TORCH_VERSION", None)
    running = torch.__version__
    if built is not None and not _same_torch(built, running):
        raise ImportError(
            f"opforge was built against torch {built} but torch {running} is installed; {REBUILD}"
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
