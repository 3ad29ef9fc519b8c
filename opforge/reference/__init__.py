"""Plain-PyTorch oracles: what each op means, used by tests and as the benchmarks' Python baseline."""

from opforge.reference.attention import attention, attention_varlen
from opforge.reference.matmul import matmul
from opforge.reference.nms import batched_nms, nms
from opforge.reference.preprocess_frames import preprocess_frames
from opforge.reference.vector_add import vector_add

__all__ = ["attention", "attention_varlen", "batched_nms", "matmul", "nms", "preprocess_frames", "vector_add"]
