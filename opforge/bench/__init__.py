"""Benchmarks: one harness (harness.py) and one spec per op. ``opforge bench`` runs them."""

from opforge.bench.attention import SPEC as ATTENTION
from opforge.bench.harness import Case, CaseBuilder, Spec
from opforge.bench.matmul import SPEC as MATMUL
from opforge.bench.nms import SPEC as NMS
from opforge.bench.serving import SPEC as SERVING
from opforge.bench.transformers import GENERATE_SPEC as TRANSFORMERS_GENERATE
from opforge.bench.transformers import SPEC as TRANSFORMERS
from opforge.bench.vector_add import SPEC as VECTOR_ADD
from opforge.bench.video import SPEC as VIDEO

SPECS: dict[str, Spec] = {
    spec.op: spec
    for spec in [VECTOR_ADD, NMS, MATMUL, VIDEO, ATTENTION, SERVING, TRANSFORMERS, TRANSFORMERS_GENERATE]
}

__all__ = ["SPECS", "Case", "CaseBuilder", "Spec"]
