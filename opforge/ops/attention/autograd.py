"""The attention ops' fake kernels and autograd: the registered backward (opforge::attention_backward
for opforge::attention), and for the torch.func transforms and forward-mode AD, which a registered
autograd formula cannot serve, a Python autograd.Function with the same backward, dense tangents and
a differentiable backward (double backward)."""

from __future__ import annotations

import torch

from opforge.ops.attention import dense
from opforge.ops.attention.checks import BACKWARD_OP, OP, check_qkv, empty_like_output, lse_dtype
from opforge.ops.attention.schema import ATTENTION


@torch.library.register_fake("opforge::attention")
def _(
    q,
    k,
    v,
    scale,
    softcap,
    causal,
    window_left,
    window_right,
    prefix_len,
    q_segments,
    kv_segments,
    mask_kinds,
    mask_index,
    mask_bits,
    block_q,
    block_k,
    kv_lens=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    *,
    variant="auto",
    deterministic=None,
):
    check_qkv(OP, q, k, v)
    out = empty_like_output(q, varlen=cu_seqlens_q is not None)
    return out, q.new_empty(q.shape[:3], dtype=lse_dtype(q))


@torch.library.register_fake("opforge::attention_paged")
def _(q, k_cache, v_cache, kv_lens, block_table, *rest):
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise RuntimeError(
            f"{OP}: with block_table, q must be 4-D and k, v paged caches (num_pages, page_size, kv_heads, "
            f"head_dim) of one shape, got {list(q.shape)}, {list(k_cache.shape)} and {list(v_cache.shape)}"
        )
    for name, t in (("k", k_cache), ("v", v_cache), ("kv_lens", kv_lens), ("block_table", block_table)):
        if t.device != q.device:
            raise RuntimeError(f"{OP}: {name} must be on the same device as q ({q.device}), got {t.device}")
    return empty_like_output(q), q.new_empty(q.shape[:3], dtype=lse_dtype(q))


@torch.library.register_fake("opforge::attention_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, *rest, **options):
    check_qkv(BACKWARD_OP, q, k, v)
    return empty_like_output(q), empty_like_output(k), empty_like_output(v)


def backward_variant(variant: str) -> str:
    """The backward's kernel for the forward's variant (decoding has no backward kernel)."""
    return "auto" if variant == "decode" else variant


def _save(ctx, scale, softcap, pattern, variant, deterministic, cu_seqlens, kv_lens) -> None:
    """What a backward needs of the forward's call, from either autograd path."""
    ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, tuple(pattern)
    ctx.variant = backward_variant(variant)
    ctx.deterministic = deterministic
    ctx.cu_seqlens = cu_seqlens
    ctx.kv_lens = kv_lens


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    _save(
        ctx,
        ATTENTION.get(inputs, "scale"),
        ATTENTION.get(inputs, "softcap"),
        ATTENTION.pattern_of(inputs),
        keyword_only_inputs.get("variant", "auto"),
        keyword_only_inputs.get("deterministic"),
        ATTENTION.offsets_of(inputs),
        ATTENTION.get(inputs, "kv_lens"),
    )
    ctx.inputs = len(inputs)
    ctx.set_materialize_grads(False)


def _gradients(ctx, grad_out, grad_lse):
    """(dq, dk, dv) by the backward kernels; differentiable again (double backward) when the
    gradients are being recorded (create_graph=True, torch.func)."""
    if ctx.kv_lens is not None:
        raise NotImplementedError(
            f"{BACKWARD_OP}: no gradient through kv_lens' kernels; call opforge.attention, which builds "
            "the exact block mask when q, k or v require grad"
        )
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    cu_q, cu_k = ctx.cu_seqlens
    args = (grad_out, q, k, v, out, lse, grad_lse, ctx.scale, ctx.softcap, ctx.variant, ctx.deterministic)
    if torch.is_grad_enabled():
        return _AttentionBackward.apply(*args, cu_q, cu_k, *ctx.pattern)
    return _AttentionBackward.forward(*args, cu_q, cu_k, *ctx.pattern)  # (the op itself)


def _backward(ctx, grad_out, grad_lse):
    return (*_gradients(ctx, grad_out, grad_lse), *(None,) * (ctx.inputs - 3))


def _not_differentiable(ctx, *grads):
    raise RuntimeError(
        f"{BACKWARD_OP} is not differentiable when called directly; differentiate opforge.attention's "
        "gradients instead (create_graph=True), which opforge.attention supports"
    )


def _no_context(ctx, inputs, keyword_only_inputs, output):
    pass


def _no_paged_context(ctx, inputs, output):  # (attention_paged has no keyword-only arguments)
    pass


def _paged_not_differentiable(ctx, *grads):
    raise RuntimeError(
        f"{OP}: torch.ops.opforge.attention_paged has no backward; opforge.attention with block_table "
        "differentiates (it gathers the pages when an input requires grad)"
    )


torch.library.register_autograd("opforge::attention", _backward, setup_context=_setup_context)
torch.library.register_autograd("opforge::attention_backward", _not_differentiable, setup_context=_no_context)
torch.library.register_autograd(
    "opforge::attention_paged", _paged_not_differentiable, setup_context=_no_paged_context
)


class Attention(torch.autograd.Function):
    """opforge.attention under the torch.func transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and
    forward-mode AD, which the op's registered autograd cannot serve: the same backward, the tangent
    computed densely (dense.tangent) and vmap by the ops' own rules (vmap.py)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, scale, softcap, variant, deterministic, cu_seqlens_q, cu_seqlens_k, *pattern):
        out, lse = torch.ops.opforge.attention.default(
            q,
            k,
            v,
            scale,
            softcap,
            *pattern,
            variant=variant,
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
        )
        # Forward-mode AD gives an output that is a view (the (B, S, H, D) layout a transposed q
        # asks for) a tangent PyTorch cannot attach to a view made inside a Function: return plain
        # tensors then, with the same strides.
        if out._base is not None:
            out = _own(out)
        return out, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, scale, softcap, variant, deterministic, cu_q, cu_k, *pattern = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.save_for_forward(q, k, v, out, lse)
        _save(
            ctx,
            scale,
            softcap,
            pattern[: ATTENTION.pattern_len],
            variant,
            deterministic,
            (cu_q, cu_k),
            pattern[ATTENTION.pattern_len] if len(pattern) > ATTENTION.pattern_len else None,
        )
        ctx.inputs = len(inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (*_gradients(ctx, grad_out, grad_lse), *(None,) * (ctx.inputs - 3))

    @staticmethod
    def jvp(ctx, dq, dk, dv, *_):
        q, k, v, out, lse = ctx.saved_tensors
        return dense.tangent(
            q, k, v, out, lse, dq, dk, dv, ctx.scale, ctx.softcap, ctx.pattern, ctx.kv_lens, ctx.cu_seqlens
        )


def _own(t: torch.Tensor) -> torch.Tensor:
    """A tensor of t's values and strides that is not a view (t: a dense tensor, or a permutation of
    one)."""
    fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return fresh.copy_(t)


class _AttentionBackward(torch.autograd.Function):
    """opforge.attention's backward as a function that can be differentiated again (double backward):
    the forward is the backward kernels; its own backward is the vector-Jacobian product of a dense
    recomputation of the first backward (dense.backward), in float32 (float64 for float64 inputs).

    out and lse are q, k and v's forward: the recomputation differentiates through them, so they get
    no gradient of their own (they would count the same path twice), and the recomputation sees its
    five inputs as independent variables (torch.func.vjp): grad_out is usually a function of out,
    whose path autograd follows outside this function, not inside it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        grad_lse,
        scale,
        softcap,
        variant,
        deterministic,
        cu_seqlens_q,
        cu_seqlens_k,
        *pattern,
    ):
        return torch.ops.opforge.attention_backward.default(
            grad_out,
            q,
            k,
            v,
            out,
            lse,
            grad_lse,
            scale,
            softcap,
            *pattern,
            variant=variant,
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad_out, q, k, v, _out, _lse, grad_lse, scale, softcap, _variant, _deterministic, cu_q, cu_k = (
            inputs[:13]
        )
        ctx.save_for_backward(grad_out, q, k, v, grad_lse)
        ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, tuple(inputs[13:])
        ctx.cu_seqlens = (cu_q, cu_k)
        ctx.inputs = len(inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, ggq, ggk, ggv):
        grad_out, q, k, v, grad_lse = ctx.saved_tensors
        if ggq is None and ggk is None and ggv is None:
            return (None,) * ctx.inputs
        with_lse = grad_lse is not None

        def first(grad_out, q, k, v, *lse_cotangent):
            gl = lse_cotangent[0] if with_lse else None
            return dense.backward(grad_out, q, k, v, gl, ctx.scale, ctx.softcap, ctx.pattern, ctx.cu_seqlens)

        primals = (grad_out, q, k, v, *((grad_lse,) if with_lse else ()))
        firsts, pull = torch.func.vjp(first, *primals)
        cots = tuple(
            torch.zeros_like(g) if gg is None else gg.to(g.dtype)
            for g, gg in zip(firsts, (ggq, ggk, ggv), strict=True)
        )
        grads = pull(cots)
        d_go, d_q, d_k, d_v = grads[:4]
        d_gl = grads[4] if with_lse else None
        return (d_go, d_q, d_k, d_v, None, None, d_gl, *(None,) * (ctx.inputs - 7))

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(
            "opforge.attention: forward-mode AD of its gradients (e.g. torch.func.hessian / jacfwd of "
            "jacrev) is not supported; reverse-over-reverse (torch.autograd.grad with create_graph=True, "
            "jacrev of jacrev) is"
        )
