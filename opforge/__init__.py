"""opforge: fast custom PyTorch operators in C++ and CUDA.

Every op is registered with PyTorch's dispatcher (``torch.ops.opforge.<op>``) and wrapped here
with a typed, documented Python function that works with autograd and ``torch.compile``.
"""

from opforge._loader import built_with_cuda, load_extension

load_extension()

from opforge import distributed  # noqa: E402  (ring_attention, shard, unshard: opforge.distributed.*)
from opforge.masks import BlockMask, block_mask  # noqa: E402
from opforge.ops.attention import attention, attention_varlen, paged_kv_append  # noqa: E402
from opforge.ops.copy_async import copy_async, to_device_async  # noqa: E402
from opforge.ops.matmul import matmul  # noqa: E402
from opforge.ops.nms import batched_nms, nms, nms_padded  # noqa: E402
from opforge.ops.preprocess_frames import FrameInfo, preprocess_frames  # noqa: E402
from opforge.ops.vector_add import vector_add  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "BlockMask",
    "FrameInfo",
    "__version__",
    "attention",
    "attention_varlen",
    "batched_nms",
    "block_mask",
    "built_with_cuda",
    "copy_async",
    "distributed",
    "matmul",
    "nms",
    "nms_padded",
    "paged_kv_append",
    "preprocess_frames",
    "to_device_async",
    "vector_add",
]
