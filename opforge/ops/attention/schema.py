"""The attention ops' argument positions, looked up by name in their registered schemas
(csrc/registration.cpp), so that no position is written down by hand here."""

from __future__ import annotations

import torch


class Schema:
    """One op's positional arguments by name (keyword-only ones excluded)."""

    def __init__(self, name: str):
        self.name = name
        schema = getattr(torch.ops.opforge, name).default._schema
        self.names = [a.name for a in schema.arguments if not a.kwarg_only]
        # causal .. block_k: the pattern, which the forward and the backward take alike
        first, last = self.index("causal"), self.index("block_k")
        self.pattern = slice(first, last + 1)
        self.pattern_len = last + 1 - first

    def index(self, name: str) -> int:
        """The position of argument `name` (a ValueError if the op has none of that name)."""
        return self.names.index(name)

    def get(self, args, name: str):
        """The argument `name` of a call's positional arguments (None when not passed)."""
        i = self.index(name)
        return args[i] if i < len(args) else None

    def pattern_of(self, args) -> tuple:
        return tuple(args[self.pattern])

    def offsets_of(self, args) -> tuple:
        return self.get(args, "cu_seqlens_q"), self.get(args, "cu_seqlens_k")


ATTENTION = Schema("attention")
BACKWARD = Schema("attention_backward")
