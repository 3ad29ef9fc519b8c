"""opforge.copy_async and opforge.to_device_async: copies ordered on the current CUDA stream,
with no host synchronization (the tutorial's ``async_operation``, without its
``cudaStreamSynchronize``)."""

from __future__ import annotations

import torch

from opforge.ops._common import check_same_dtype, check_same_shape, has_internal_overlap, require_tensor

OP = "opforge.copy_async"


def copy_async(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst <- src`` on the current CUDA stream, without synchronizing the host. Returns ``dst``.

    ``dst`` and ``src``: same shape and dtype, any strides, each on the CPU or a CUDA device.

    - pinned host -> device, device -> device (also across GPUs), device -> pinned host: fully
      asynchronous, one ``cudaMemcpyAsync`` when both sides share a dense layout (else reordered
      by a copy kernel on the same stream). Capturable in a CUDA graph.
    - pageable host -> device: packed into a pinned staging buffer by a parallel host memcpy, then
      the same asynchronous transfer; the call returns after the host memcpy (about the cost of
      reading the source once), not after the transfer. Not capturable.
    - device -> pageable host: CUDA completes the transfer before the call returns.

    Memory stays valid for the copy: CUDA tensors are recorded on the stream (the caching
    allocator will not reuse a block allocated on another stream before the copy ran), pinned
    blocks from the caching host allocator are not handed out again before their transfer ends.
    The data itself is yours to leave alone until the stream reaches the copy: read ``dst`` on
    this stream (or after an event), and do not write a pinned ``src`` before then.

    A mutating op (``dst`` is ``Tensor(a!)`` in the schema), so ``torch.compile`` and
    functionalization see the write. Under autograd it behaves as ``Tensor.copy_``: ``dst``'s
    version counter moves on (a backward that saved its old values raises), a leaf that requires
    grad is refused outside ``torch.no_grad()``, and the gradient flows to ``src``.
    """
    require_tensor(OP, "dst", dst)
    require_tensor(OP, "src", src)
    torch.ops.opforge.copy_async.default(dst, src)
    return dst


def to_device_async(src: torch.Tensor, device: torch.device | str | int) -> torch.Tensor:
    """A copy of ``src`` on ``device``, made with :func:`copy_async` (so: asynchronous from pinned
    memory and between GPUs). The result has ``src``'s layout when ``src`` is dense; a copy to the
    CPU from a GPU goes into pinned memory, so it is asynchronous too (synchronize before reading it).
    Always a new tensor, also when ``src`` is already on ``device``."""
    require_tensor("opforge.to_device_async", "src", src)
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if src.device.type == "meta" and device.type != "meta":
        raise NotImplementedError(
            f"opforge.to_device_async: src is a meta tensor, it has no data to copy to {device} "
            "(Tensor.to refuses the same)"
        )
    return torch.ops.opforge.to_device_async.default(src, device)


def check_not_from_meta(op: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    """Raise NotImplementedError, as ``Tensor.copy_`` does, for a meta ``src`` and a ``dst`` with
    data: the call dispatches to the meta kernel then, which would return without writing ``dst``.
    A meta ``dst`` is allowed whatever ``src`` is, as with ``copy_``: it holds no data to write.
    Fake tensors (torch.compile) report their fake device, so this reads the same there."""
    if src.device.type == "meta" and dst.device.type != "meta":
        raise NotImplementedError(
            f"{op}: src is a meta tensor, it has no data to copy into dst (on {dst.device}); "
            "Tensor.copy_ refuses the same"
        )


@torch.library.register_fake("opforge::copy_async")
def _(dst: torch.Tensor, src: torch.Tensor) -> None:
    # Also the op's Meta kernel: a call with a meta tensor on either side dispatches here (the C++
    # entry and torch.ops as well), so a meta source is refused here for every entry.
    # check_copy_async_inputs (csrc/copy_async/copy_async.cpp) otherwise, with its types: tensors
    # that do not fit, memory overlap included, raise RuntimeError (as Tensor.copy_ does). (A
    # partial overlap of dst and src needs their addresses, which fake tensors do not have.)
    check_not_from_meta(OP, dst, src)
    check_same_dtype(OP, "src", src, "dst", dst)
    check_same_shape(OP, "src", src, "dst", dst)
    if has_internal_overlap(dst):
        raise RuntimeError(
            f"{OP}: dst has elements that share memory (an expanded or overlapping view); it cannot be "
            "written element by element"
        )
    return None
