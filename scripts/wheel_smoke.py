"""Smoke test of an installed opforge wheel: it imports, says what it was built against, and a few
ops match their plain-PyTorch references on every device it can use. Exits non-zero on a mismatch.

Usage (from outside the source tree, in the environment the wheel was installed into):
    python /path/to/scripts/wheel_smoke.py
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

import torch

import opforge
from opforge import _build_config, reference

checks: list[tuple[str, bool]] = []


def check(name: str, ok: bool) -> None:
    checks.append((name, ok))
    print(f"{'ok' if ok else 'MISMATCH':8} {name}", flush=True)


def close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float = 0.0) -> bool:
    return got.shape == want.shape and torch.allclose(got.double().cpu(), want.double().cpu(), atol, rtol)


def ops(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    low = torch.bfloat16 if device == "cuda" else torch.float32  # CUDA attention: fp16/bf16 only
    tol = 5e-2 if low == torch.bfloat16 else 1e-4

    a, b = (torch.randn(1000, generator=g).to(device) for _ in range(2))
    check(f"{device} vector_add == a + b", torch.equal(opforge.vector_add(a, b), a + b))

    a, b = torch.randn(64, 96, generator=g), torch.randn(96, 80, generator=g)
    got = opforge.matmul(a.to(device, low), b.to(device, low))
    check(f"{device} matmul ~ a @ b", close(got, a.to(low).double() @ b.to(low).double(), tol, tol))

    q, k, v = (torch.randn(2, 4, 48, 64, generator=g).to(low) for _ in range(3))
    got = opforge.attention(q.to(device), k.to(device), v.to(device), causal=True)
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    check(f"{device} attention(causal=True) ~ reference", close(got, want, tol, tol))

    xy = torch.rand(300, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(300, 2, generator=g) * 30], dim=1)
    scores = torch.rand(300, generator=g)
    got = opforge.nms(boxes.to(device), scores.to(device), 0.5)
    check(f"{device} nms == reference", torch.equal(got.cpu(), reference.nms(boxes, scores, 0.5)))

    frames = torch.randint(0, 256, (2, 45, 77, 3), dtype=torch.uint8, generator=g)
    kw = dict(size=64, letterbox=True, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    got, info = opforge.preprocess_frames(frames.to(device), out_dtype=torch.float32, **kw)
    want, want_info = reference.preprocess_frames(frames, out_dtype=torch.float32, **kw)
    check(f"{device} preprocess_frames ~ reference", close(got, want, 1e-4, 1e-5) and info == want_info)


def main() -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"opforge {opforge.__version__} from {os.path.dirname(opforge.__file__)}")
    print(f"built against torch {_build_config.TORCH_VERSION}, CUDA kernels: {opforge.built_with_cuda()}")
    print(f"running torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    # The source tree's opforge shadows the installed one when the checkout is on sys.path (its
    # root as the working directory, for one): then this would test the checkout, not the wheel.
    check(
        "opforge is the installed one, not a source tree's",
        os.path.dirname(os.path.abspath(opforge.__file__)) != os.path.join(here, "opforge"),
    )
    try:
        version, requires = importlib.metadata.version("opforge"), importlib.metadata.requires("opforge")
    except importlib.metadata.PackageNotFoundError:
        version, requires = None, None
    check("opforge.__version__ is the installed package's", opforge.__version__ == version)
    requires = [r for r in requires or [] if "extra ==" not in r]
    print(f"requires {', '.join(requires)}")
    pin = f"torch=={_build_config.TORCH_VERSION.split('+')[0]}"
    check(f"requires {pin} (the torch it was built against)", pin in requires)
    check("runs under the torch it was built against", _build_config.TORCH_VERSION == torch.__version__)

    ops("cpu")
    if opforge.built_with_cuda() and torch.cuda.is_available():
        ops("cuda")

    failed = sum(not ok for _, ok in checks)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
