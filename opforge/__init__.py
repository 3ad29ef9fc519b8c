"""opforge: fast custom PyTorch operators in C++ and CUDA.

Every op is registered with PyTorch's dispatcher (``torch.ops.opforge.<op>``) and wrapped here
with a typed, documented Python function that works with autograd and ``torch.compile``.
"""

from opforge._loader import built_with_cuda, load_extension

load_extension()

from opforge.ops.matmul import matmul  # noqa: E402
from opforge.ops.nms import batched_nms, nms, nms_padded  # noqa: E402
from opforge.ops.vector_add import vector_add  # noqa: E402

__version__ = "0.1.0"
__all__ = ["__version__", "batched_nms", "built_with_cuda", "matmul", "nms", "nms_padded", "vector_add"]
