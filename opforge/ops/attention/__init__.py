"""opforge.attention and its companions, one module per concern:

- api: attention(), attention_varlen() (what users call, with their documentation);
- checks: argument checks and the schema's pattern arguments;
- kv_cache: kv_lens and paged caches (routing, gathering), paged_kv_append;
- autograd: fake kernels, the registered backward, the torch.func / forward-mode AD Function and the
  double backward (dense: the plain-PyTorch attention they differentiate);
- vmap: the ops' vmap rules;
- schema: argument positions looked up in the registered schemas;
- sharded: the refusal of sequence-sharded calls (DTensor operands, torch's context_parallel()),
  which point to opforge.distributed.ring_attention.
"""

from opforge.ops.attention import vmap  # noqa: F401  (registers the vmap rules)
from opforge.ops.attention.api import attention, attention_varlen
from opforge.ops.attention.kv_cache import paged_kv_append

__all__ = ["attention", "attention_varlen", "paged_kv_append"]
