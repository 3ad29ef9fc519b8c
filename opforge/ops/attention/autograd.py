"""The attention ops' fake kernels and autograd: the registered backward (opforge::attention_backward
for opforge::attention), and for the torch.func transforms and forward-mode AD, which a registered
autograd formula cannot serve, a Python autograd.Function with the same backward, dense tangents and
a differentiable backward (double backward)."""

from __future__ import annotations

import torch

from opforge.ops.attention import dense
from opforge.ops.attention.checks import BACKWARD_OP, OP, check_paged, check_qkv, empty_like_output, lse_dtype
from opforge.ops.attention.schema import ATTENTION, BACKWARD
from opforge.ops.attention.sinks import sink_gradient


@torch.library.register_fake("opforge::attention")
def _(q, k, v, *rest, variant="auto", deterministic=None, check_offsets=True):
    check_qkv(OP, q, k, v)
    # The op's own checks of everything else that reads no data (one error a condition, fake or not),
    # where the sizes are numbers: C++ reading a symbolic size (torch.compile's dynamic shapes) would
    # specialise the graph on it, a recompilation a shape (the wrapper checks those calls anyway).
    tensors = (q, k, v, *(t for t in rest if isinstance(t, torch.Tensor)))
    if not any(isinstance(n, torch.SymInt) for t in tensors for n in t.shape):
        torch.ops.opforge._attention_check(q, k, v, *rest, variant=variant, deterministic=deterministic)
    varlen = ATTENTION.get((q, k, v, *rest), "cu_seqlens_q") is not None
    return empty_like_output(q, varlen=varlen, head_dim=v.shape[-1]), q.new_empty(
        q.shape[:3], dtype=lse_dtype(q)
    )


@torch.library.register_fake("opforge::attention_fp8")
def _(q, k, v, q_descale, k_descale, v_descale, scale, softcap, *rest, variant="auto", check_offsets=True):
    # (the sizes' checks; the dtypes', descales' and patterns' run in the op and its Python callers)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn:
            raise RuntimeError(
                f"{OP}: FP8 attention takes q, k and v in float8_e4m3fn, got {name} in {t.dtype}"
            )
    varlen = len(rest) > 12 and rest[12] is not None  # (cu_seqlens_q, the schema's 13th pattern argument)
    out = empty_like_output(q, varlen=varlen, head_dim=v.shape[-1], dtype=torch.bfloat16)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake("opforge::attention_paged")
def _(q, k_cache, v_cache, kv_lens, block_table, *rest):
    check_paged(q, k_cache, v_cache, block_table, kv_lens)  # (the wrapper's: sizes, dtypes, devices)
    return empty_like_output(q, head_dim=v_cache.shape[-1]), q.new_empty(q.shape[:3], dtype=lse_dtype(q))


@torch.library.register_fake("opforge::attention_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, *rest, **options):
    check_qkv(BACKWARD_OP, q, k, v)
    sinks = options.get("sinks", BACKWARD.get((grad_out, q, k, v, out, lse, grad_lse, *rest), "sinks"))
    d_sinks = sinks.new_empty(sinks.shape) if sinks is not None else lse.new_empty((0,))
    return empty_like_output(q), empty_like_output(k), empty_like_output(v), d_sinks


def backward_variant(variant: str) -> str:
    """The backward's kernel for the forward's variant (decoding has no backward kernel)."""
    return "auto" if variant == "decode" else variant


def _save(ctx, scale, softcap, pattern, variant, deterministic, cu_seqlens, kv_lens) -> None:
    """What a backward needs of the forward's call, from either autograd path (the Function's calls
    have no sinks: apply_sinks composes them after it)."""
    ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, tuple(pattern)
    ctx.has_sinks = False
    ctx.variant = backward_variant(variant)
    ctx.deterministic = deterministic
    ctx.cu_seqlens = cu_seqlens
    ctx.kv_lens = kv_lens


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    sinks = ATTENTION.get(inputs, "sinks")
    ctx.save_for_backward(q, k, v, out, lse, *(() if sinks is None else (sinks,)))
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
    ctx.has_sinks = sinks is not None
    ctx.inputs = len(inputs)
    ctx.set_materialize_grads(False)


_NO_FORWARD_OVER_REVERSE = (
    f"{OP}: forward-mode AD of its gradients (e.g. torch.func.hessian / jacfwd of jacrev) is not "
    "supported; reverse-over-reverse (torch.autograd.grad with create_graph=True, jacrev of jacrev) is"
)


def _under_forward_mode() -> bool:
    """Whether a forward-mode transform encloses this call: torch.func.jvp / jacfwd (a Jvp level on
    functorch's interpreter stack)."""
    stack = torch._C._functorch.get_interpreter_stack() or []
    return any(ci.key() == torch._C._functorch.TransformType.Jvp for ci in stack)


def _gradients(ctx, grad_out, grad_lse):
    """(dq, dk, dv, d sinks or None) by the backward kernels (given the output and LSE with the sinks,
    they need nothing more; the op also returns the sinks' gradient, on CUDA from its prep pass's
    per-row values); differentiable again (double backward) when the gradients are being recorded
    (create_graph=True, torch.func: d sinks then by sinks.sink_gradient, in PyTorch ops)."""
    if torch.is_grad_enabled() and _under_forward_mode():
        # (the gradients would need the tangent of the backward, which is not implemented; under
        # jacfwd's vmap functorch fails inside before _AttentionBackward.jvp could say so)
        raise NotImplementedError(_NO_FORWARD_OVER_REVERSE)
    if ctx.kv_lens is not None:
        raise NotImplementedError(
            f"{BACKWARD_OP}: no gradient through kv_lens' kernels; call opforge.attention, which builds "
            "the exact block mask when q, k or v require grad"
        )
    q, k, v, out, lse, *rest = ctx.saved_tensors
    sinks = rest[0] if ctx.has_sinks else None
    # (dq, dk, dv need nothing of the sinks; their own gradient only where asked for. The double
    # backward's recomputation takes them either way.)
    want_sinks = sinks is not None and ctx.needs_input_grad[ATTENTION.index("sinks")]
    cu_q, cu_k = ctx.cu_seqlens
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if torch.is_grad_enabled():
        d_sinks = sink_gradient(sinks, grad_out, out, lse, grad_lse) if want_sinks else None
        args = (grad_out, q, k, v, out, lse, grad_lse, ctx.scale, ctx.softcap, ctx.variant, ctx.deterministic)
        return (*_AttentionBackward.apply(*args, cu_q, cu_k, sinks, *ctx.pattern), d_sinks)
    dq, dk, dv, d_sinks = torch.ops.opforge.attention_backward.default(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        grad_lse,
        ctx.scale,
        ctx.softcap,
        *ctx.pattern,
        cu_q,
        cu_k,
        sinks if want_sinks else None,
        variant=ctx.variant,
        deterministic=ctx.deterministic,
    )
    return dq, dk, dv, (d_sinks if want_sinks else None)


def _backward(ctx, grad_out, grad_lse):
    dq, dk, dv, d_sinks = _gradients(ctx, grad_out, grad_lse)
    grads = [dq, dk, dv, *(None,) * (ctx.inputs - 3)]
    if d_sinks is not None:
        grads[ATTENTION.index("sinks")] = d_sinks
    return tuple(grads)


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
        return (*_gradients(ctx, grad_out, grad_lse)[:3], *(None,) * (ctx.inputs - 3))

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
        sinks,
        *pattern,
    ):
        # (sinks: only the recomputation of the double backward reads them; the kernels take the
        # output and LSE that include them, and d sinks is computed outside this function)
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
        )[:3]

    @staticmethod
    def setup_context(ctx, inputs, output):
        (
            grad_out,
            q,
            k,
            v,
            _out,
            _lse,
            grad_lse,
            scale,
            softcap,
            _variant,
            _deterministic,
            cu_q,
            cu_k,
            sinks,
        ) = inputs[:14]
        ctx.save_for_backward(grad_out, q, k, v, grad_lse, sinks)
        ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, tuple(inputs[14:])
        ctx.cu_seqlens = (cu_q, cu_k)
        ctx.inputs = len(inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, ggq, ggk, ggv):
        grad_out, q, k, v, grad_lse, sinks = ctx.saved_tensors
        if ggq is None and ggk is None and ggv is None:
            return (None,) * ctx.inputs
        with_lse, with_sinks = grad_lse is not None, sinks is not None

        def first(grad_out, q, k, v, *extra):
            gl = extra[0] if with_lse else None
            s = extra[-1] if with_sinks else None
            return dense.backward(
                grad_out, q, k, v, gl, ctx.scale, ctx.softcap, ctx.pattern, ctx.cu_seqlens, sinks=s
            )

        primals = (grad_out, q, k, v, *((grad_lse,) if with_lse else ()), *((sinks,) if with_sinks else ()))
        firsts, pull = torch.func.vjp(first, *primals)
        cots = tuple(
            torch.zeros_like(g) if gg is None else gg.to(g.dtype)
            for g, gg in zip(firsts, (ggq, ggk, ggv), strict=True)
        )
        grads = pull(cots)
        d_go, d_q, d_k, d_v = grads[:4]
        d_gl = grads[4] if with_lse else None
        d_sinks = grads[-1] if with_sinks else None
        return (d_go, d_q, d_k, d_v, None, None, d_gl, *(None,) * 6, d_sinks, *(None,) * (ctx.inputs - 14))

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_NO_FORWARD_OVER_REVERSE)
