"""Bad input to the attention ops: every documented error, raised by the wrapper, the raw op and the
fake kernel with the same type and words (RuntimeError for tensors that do not fit together,
ValueError for values out of range, TypeError for wrong Python types)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from attention_cases import (
    NO_PATTERN,
    qkv,
    to_pages,
    varlen_case,
)

import opforge
from opforge import reference
from opforge.masks import block_mask

ERRORS = [
    ("q 3-D", lambda q, k, v: (q[0], k, v, {}), RuntimeError, r"opforge.attention: q must be 4-D"),
    (
        "int dtype",
        lambda q, k, v: (q.int(), k.int(), v.int(), {}),
        RuntimeError,
        r"q must be one of \(float16",
    ),
    ("k dtype", lambda q, k, v: (q, k.double(), v, {}), RuntimeError, r"k must have the same dtype as q"),
    ("head dims", lambda q, k, v: (q, k[..., :8], v[..., :8], {}), RuntimeError, r"same head_dim"),
    (
        "k v shapes",
        lambda q, k, v: (q, k, v[:, :, :5], {}),
        RuntimeError,
        r"k and v must have the same shape",
    ),
    (
        "gqa ratio",
        lambda q, k, v: (q[:, :3], k[:, :2], v[:, :2], {}),
        RuntimeError,
        r"multiple of k's and v's heads",
    ),
    ("batch", lambda q, k, v: (q, k[:1], v[:1], {}), RuntimeError, r"same batch size"),
    (
        "window",
        lambda q, k, v: (q, k, v, dict(window=(-2, 0))),
        ValueError,
        r"window sides must be ints >= 0",
    ),
    ("window shape", lambda q, k, v: (q, k, v, dict(window=(3,))), ValueError, r"window must be a pair"),
    ("window type", lambda q, k, v: (q, k, v, dict(window=3)), TypeError, r"window must be a pair"),
    (
        "window side type",
        lambda q, k, v: (q, k, v, dict(window=(2.0, 0))),
        TypeError,
        r"window sides must be ints >= 0 or None, got \(2.0, 0\)",
    ),
    (
        "window side bool",
        lambda q, k, v: (q, k, v, dict(window=(True, 0))),
        TypeError,
        r"window sides must be ints >= 0 or None",
    ),
    ("prefix", lambda q, k, v: (q, k, v, dict(prefix_len=-1)), ValueError, r"prefix_len must be an int >= 0"),
    (
        "segments",
        lambda q, k, v: (q, k, v, dict(segment_ids=torch.zeros(2, 5))),
        RuntimeError,
        r"segment_ids must be",
    ),
    (
        "segment dtype",
        lambda q, k, v: (q, k, v, dict(segment_ids=torch.zeros(2, 20))),
        RuntimeError,
        r"segment_ids must be one of \(int32, int64\), got float32",
    ),
    (
        "mask shape",
        lambda q, k, v: (q, k, v, dict(mask=block_mask(lambda b, h, i, j: i >= j, None, None, 30, 20))),
        RuntimeError,
        r"the mask was made for",
    ),
    (
        "mask type",
        lambda q, k, v: (q, k, v, dict(mask=torch.ones(20, 20, dtype=torch.bool))),
        TypeError,
        r"BlockMask",
    ),
    (
        "softcap",
        lambda q, k, v: (q, k, v, dict(softcap=-1.0)),
        ValueError,
        r"softcap must be a positive number",
    ),
    (
        "scale",
        lambda q, k, v: (q, k, v, dict(scale=float("nan"))),
        ValueError,
        r"scale must be finite, got nan",
    ),
    ("not a tensor", lambda q, k, v: ([1.0], k, v, {}), TypeError, r"q must be a torch.Tensor"),
    ("causal type", lambda q, k, v: (q, k, v, dict(causal=1)), TypeError, r"causal must be a bool"),
]


@pytest.mark.parametrize("name,make,err,msg", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(name, make, err, msg):
    q, k, v = qkv(2, 4, 4, 20, 20, 16)
    q, k, v, kw = make(q, k, v)
    with pytest.raises(err, match=msg):
        opforge.attention(q, k, v, **kw)


def test_errors_raw_op():
    q, k, v = qkv(1, 2, 2, 10, 10, 8)
    raw = torch.ops.opforge.attention.default
    base = (False, -1, -1, 0, None, None, None, None, None, 128, 128)
    with pytest.raises(ValueError, match=r"window sides must be >= 0 \(-1: unbounded\)"):
        raw(q, k, v, 1.0, 0.0, False, -5, -1, 0, None, None, None, None, None, 128, 128)
    with pytest.raises(ValueError, match=r"softcap must be positive"):
        raw(q, k, v, 1.0, -1.0, *base)
    m = block_mask(lambda b, h, i, j: i >= j, None, None, 10, 10, block_size=64)
    bad = m.index.clone().fill_(7)  # past the one partial block's bits
    with pytest.raises(ValueError, match=r"mask_index 7 of a partial block is outside mask_bits' 1 blocks"):
        raw(q, k, v, 1.0, 0.0, False, -1, -1, 0, None, None, m.kinds, bad, m.bits, 64, 64)
    with pytest.raises(ValueError, match=r"mask_kinds holds 5"):
        raw(
            q, k, v, 1.0, 0.0, False, -1, -1, 0, None, None, m.kinds.clone().fill_(5), m.index, m.bits, 64, 64
        )
    with pytest.raises(ValueError, match=r"block sizes must be multiples of 64"):
        raw(q, k, v, 1.0, 0.0, False, -1, -1, 0, None, None, m.kinds, m.index, m.bits, 32, 64)
    with pytest.raises(ValueError, match=r"q_segments and kv_segments go together"):
        raw(
            q,
            k,
            v,
            1.0,
            0.0,
            False,
            -1,
            -1,
            0,
            torch.zeros(1, 10, dtype=torch.int32),
            None,
            None,
            None,
            None,
            128,
            128,
        )


def test_error_messages_name_the_callers_arguments():
    q, k, v = qkv(2, 1, 1, 20, 20, 8)
    with pytest.raises(RuntimeError, match=r"segment_ids must be \(batch, keys\) = \(2, 20\)"):
        opforge.attention(q, k, v, segment_ids=torch.zeros(1, 20, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"q must be 4-D"):
        opforge.attention(q[0], k, v, segment_ids=torch.zeros(2, 20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"block_size must be a positive multiple of 64"):
        block_mask(lambda b, h, i, j: i >= j, 1, 1, 10, 10, block_size=(64, 64, 64))
    with pytest.raises(ValueError, match=r"needs Sq <= Sk"):
        reference.attention(*qkv(1, 1, 1, 40, 30, 8), segment_ids=torch.zeros(1, 30, dtype=torch.long))


def test_paged_attention_op_checks():
    """opforge::attention_paged called directly names what is wrong."""
    q, k, v = qkv(2, 4, 2, 1, 32, 16)
    lens = torch.tensor([20, 32])
    kc, vc, table = to_pages(k, v, lens, 8)
    op = torch.ops.opforge.attention_paged.default
    args = (0.25, 0.0, True, -1, 0, 0)
    with pytest.raises(RuntimeError, match=r"block_table must be one of \(int32, int64\), got float32"):
        op(q, kc, vc, lens, table.float(), *args)
    with pytest.raises(RuntimeError, match="must be paged caches"):
        op(q, kc, vc[:-1], lens, table, *args)
    with pytest.raises(RuntimeError, match=r"block_table must be \(batch, max_pages\)"):
        op(q, kc, vc, lens, table[:1], *args)
    with pytest.raises(RuntimeError, match="q must be"):
        op(q[0], kc, vc, lens, table, *args)
    with pytest.raises(RuntimeError, match="block_table must be on the same device as q"):
        op(q, kc, vc, lens, table.to("meta"), *args)
    out = op(q, kc, vc, lens, table, *args)[0]
    assert torch.equal(out, opforge.attention(q, k, v, kv_lens=lens, causal=True, scale=0.25))
    assert torch.equal(op(q, kc, vc, lens, table.long(), *args)[0], out)  # (int64 tables too)
    qg = q.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="attention_paged has no backward"):
        op(qg, kc, vc, lens, table, *args)[0].sum().backward()
    # a sequence's pages past 2^31 keys (its index arithmetic is 32-bit): refused, not wrapped
    big = torch.zeros(2, 2**15 + 1, dtype=torch.int32)
    small_k = torch.randn(2, 2**16, 2, 16)
    with pytest.raises(RuntimeError, match="at most 2\\^31 - 1 keys"):
        op(q, small_k, small_k, lens, big, *args)
    with pytest.raises(RuntimeError, match="at most 2\\^31 - 1 keys"):
        opforge.attention(q, small_k, small_k, kv_lens=lens, block_table=big)
    # no heads: the empty result the general path gives
    q0 = torch.randn(2, 0, 1, 16)
    assert opforge.attention(q0, kc, vc, kv_lens=lens, block_table=table).shape == (2, 0, 1, 16)


def test_paged_errors():
    q, k, v = qkv(2, 4, 2, 1, 32, 16)
    lens = torch.tensor([20, 32])
    kc, vc, table = to_pages(k, v, lens, 8)
    with pytest.raises(ValueError, match="block_table needs kv_lens"):
        opforge.attention(q, kc, vc, block_table=table)
    with pytest.raises(RuntimeError, match=r"block_table must be one of \(int32, int64\)"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=table.float())
    with pytest.raises(RuntimeError, match=r"block_table must be \(batch, max_pages\)"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=table[:1])
    with pytest.raises(RuntimeError, match="must be a paged cache"):
        opforge.attention(q, k, v[0], kv_lens=lens, block_table=table)
    bad = table.clone()
    bad[0, 1] = 10**6  # a page sequence 0 needs (20 keys: pages 0-2)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 1000000 is not a page"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=bad)
    new = torch.randn(2, 2, 3, 16)
    with pytest.raises(RuntimeError, match="q must be 4-D"):
        opforge.attention(q[0], kc, vc, kv_lens=lens, block_table=table)
    with pytest.raises(
        ValueError, match=r"token 0 goes to position 32: past its block_table row \(4 pages x 8"
    ):
        opforge.paged_kv_append(kc, vc, new, new, table[:, :4], lens)
    with pytest.raises(ValueError, match=r"kv_lens\[0\] = -1 is negative"):
        opforge.paged_kv_append(kc, vc, new, new, table, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 1000000 is not a page of the caches"):
        opforge.paged_kv_append(kc, vc, new, new, bad, torch.tensor([7, 0]))
    with pytest.raises(RuntimeError, match="k_cache must be one of"):
        opforge.paged_kv_append(kc.int(), vc.int(), new.int(), new.int(), table, lens)
    with pytest.raises(RuntimeError, match="k_cache requires grad"):
        opforge.paged_kv_append(kc.clone().requires_grad_(), vc, new, new, table, lens)
    with pytest.raises(RuntimeError, match="with the caches' kv_heads"):
        opforge.paged_kv_append(kc, vc, new[:, :1], new[:, :1], table, lens)
    with pytest.raises(RuntimeError, match=r"kv_lens must be one of \(int32, int64\)"):
        opforge.paged_kv_append(kc, vc, new, new, table, lens.float())


KV_LENS_ERRORS = [
    (dict(kv_lens=[3, 4]), TypeError, r"opforge.attention: kv_lens must be a torch.Tensor"),
    (
        dict(kv_lens=torch.tensor([3.0, 4.0])),
        RuntimeError,
        r"kv_lens must be one of \(int32, int64\), got float32",
    ),
    (dict(kv_lens=torch.tensor([3])), RuntimeError, r"kv_lens must be \(batch,\) = \(2,\), got shape \[1\]"),
    (dict(kv_lens=torch.tensor([[3, 4]])), RuntimeError, r"kv_lens must be \(batch,\)"),
    (
        dict(kv_lens=torch.tensor([3, 4]), segment_ids=torch.zeros(2, 20, dtype=torch.long)),
        ValueError,
        r"with kv_lens, segment_ids must be a pair",
    ),
]


@pytest.mark.parametrize("kw,err,msg", KV_LENS_ERRORS, ids=[str(i) for i in range(len(KV_LENS_ERRORS))])
def test_kv_lens_errors(kw, err, msg):
    q, k, v = qkv(2, 4, 4, 1, 20, 16)
    with pytest.raises(err, match=msg):
        opforge.attention(q, k, v, **kw)


def test_kv_lens_raw_op_errors():
    q, k, v = qkv(2, 4, 4, 1, 20, 16)
    raw = torch.ops.opforge.attention.default
    base = (False, -1, -1, 0, None, None, None, None, None, 128, 128)
    with pytest.raises(RuntimeError, match=r"opforge.attention: kv_lens must be \(batch,\) = \(2,\)"):
        raw(q, k, v, 0.25, 0.0, *base, torch.tensor([1]))
    with pytest.raises(RuntimeError, match=r"opforge.attention: kv_lens must be one of \(int32, int64\)"):
        raw(q, k, v, 0.25, 0.0, *base, torch.tensor([1.0, 2.0]))
    # More query rows than the decode kernel takes (a chunk of new tokens): the tiled kernel bounds
    # each sequence's keys itself; the slots past a count may hold anything (inf / nan here)
    q40 = torch.randn(2, 4, 40, 16)
    lens = torch.tensor([3, 17])
    kp, vp = k.clone(), v.clone()
    kp[0, :, 3:], vp[1, :, 17:] = float("inf"), float("nan")
    for variant in ("auto", "tiled"):
        out, _ = raw(q40, kp, vp, 0.25, 0.0, True, *base[1:], lens, variant=variant)
        want = reference.attention(
            q40.double(), k.double(), v.double(), scale=0.25, causal=True, kv_lens=lens
        )
        assert (out.double() - want).abs().max().item() < 1e-5
    # No gradient through the raw op with counts
    qg = q.clone().requires_grad_()
    out, _ = raw(qg, k, v, 0.25, 0.0, *base, torch.tensor([5, 20]))
    with pytest.raises(NotImplementedError, match=r"no gradient through kv_lens"):
        out.sum().backward()


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(scale=1e38), r"scale = 1e\+38 is too large for the float32 arithmetic the kernels use for"),
        (dict(scale=-3e19), r"scale = -3e\+19 is too large .* without a softcap"),
        (dict(scale=1e39, softcap=1e30), r"scale = 1e\+39 is outside the range of the float32 arithmetic"),
        (dict(scale=1e-40), r"scale = 1e-40 is outside"),
        (dict(softcap=1e39), r"softcap = 1e\+39 is outside"),
        (dict(softcap=1e-46), r"softcap = 1e-46 is outside"),
        (dict(softcap=1e38), r"1 / \(softcap \* log2\(e\)\) = 6.93.*e-39 is outside"),
        (dict(scale=1e30, softcap=1e-10), r"scale / softcap = 1e\+40 is outside"),
    ],
)
def test_numbers_beyond_float32(kw, msg):
    """Scales and softcaps the float32 kernels cannot hold are refused (they gave zeros with an LSE
    of -inf, NaN rows from overflowing scores, or a softcap silently dropped), by the wrapper and the
    raw op alike; float64 inputs compute in double and take them."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = qkv(1, 2, 2, 8, 8, 4, dtype=dtype)
        with pytest.raises(ValueError, match=r"opforge.attention: " + msg):
            opforge.attention(q, k, v, **kw)
        with pytest.raises(ValueError, match=r"opforge.attention: " + msg):
            torch.ops.opforge.attention(
                q, k, v, kw["scale"] if "scale" in kw else 0.5, kw.get("softcap", 0.0), *NO_PATTERN
            )
    q, k, v = (t.double() for t in qkv(1, 2, 2, 8, 8, 4))
    torch.testing.assert_close(opforge.attention(q, k, v, **kw), reference.attention(q, k, v, **kw))


@pytest.mark.parametrize(
    "variant,shape,err,msg",
    [
        (
            "hopper",
            (1, 2, 2, 8, 8, 4),
            ValueError,
            r"variant 'hopper' has no kernel here; on the CPU the variants are: "
            r"auto, tiled, decode",
        ),
        ("mma_sync", (1, 2, 2, 8, 8, 4), ValueError, r"variant 'mma_sync' has no kernel here"),
        ("fast", (1, 2, 2, 8, 8, 4), ValueError, r"variant 'fast' is unknown"),
        (
            "decode",
            (1, 2, 2, 40, 8, 4),
            ValueError,
            r"variant 'decode' takes at most 32 query rows \(Sq x the GQA group\) "
            r"per kv head, got 40",
        ),
        (3, (1, 2, 2, 8, 8, 4), TypeError, r"opforge.attention: variant must be a str, got int"),
    ],
)
def test_variant_errors(variant, shape, err, msg):
    q, k, v = qkv(*shape)
    with pytest.raises(err, match=msg):
        opforge.attention(q, k, v, variant=variant)


def test_variant_errors_backward_and_kv_lens():
    q, k, v = qkv(2, 2, 2, 3, 20, 4)
    with pytest.raises(
        ValueError,
        match=r"opforge.attention_backward: variant 'decode' has no kernel here; on the "
        r"CPU the backward's variants are: auto, tiled",
    ):
        torch.ops.opforge.attention_backward.default(
            q, q, k, v, q, torch.zeros(2, 2, 3), None, 0.5, 0.0, *NO_PATTERN, variant="decode"
        )
    lens = torch.tensor([3, 20])
    raw = torch.ops.opforge.attention.default
    # The tiled kernel takes the counts itself (the raw op and the wrapper alike)
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, scale=0.5)
    got, _ = raw(q, k, v, 0.5, 0.0, *NO_PATTERN, lens, variant="tiled")
    assert (got.double() - want).abs().max() < 2e-5
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, causal=True)
    got = opforge.attention(q, k, v, kv_lens=lens, causal=True, variant="tiled")
    assert (got.double() - want).abs().max() < 2e-5


VARLEN_ERRORS = [
    (
        "q 4-D",
        lambda a: a.update(q=a["q"][None]),
        RuntimeError,
        r"opforge.attention_varlen: q must be 3-D \(total tokens, heads, head_dim\), got 4-D",
    ),
    ("v 2-D", lambda a: a.update(v=a["v"][:, 0]), RuntimeError, r"opforge.attention_varlen: v must be 3-D"),
    (
        "cu float",
        lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].float()),
        RuntimeError,
        r"opforge.attention_varlen: cu_seqlens_q must be one of \(int32, int64\), got float32",
    ),
    (
        "cu 2-D",
        lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][None]),
        RuntimeError,
        r"opforge.attention_varlen: cu_seqlens_k must be 1-D \(number of sequences \+ 1,\), "
        r"got shape \[1, 4\]",
    ),
    (
        "cu not a tensor",
        lambda a: a.update(cu_seqlens_q=[0, 5]),
        TypeError,
        r"opforge.attention_varlen: cu_seqlens_q must be a torch.Tensor, got list",
    ),
    (
        "cu lengths",
        lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][:3]),
        RuntimeError,
        r"opforge.attention_varlen: cu_seqlens_q and cu_seqlens_k must have the same length "
        r"\(sequences \+ 1\), got 4 and 3",
    ),
    (
        "cu start",
        lambda a: a["cu_seqlens_q"].add_(1),
        ValueError,
        r"opforge.attention_varlen: cu_seqlens_q must start at 0, got 1",
    ),
    (
        "cu decreasing",
        lambda a: a["cu_seqlens_k"].copy_(torch.tensor([0, 9, 4, 20])),
        ValueError,
        r"opforge.attention_varlen: cu_seqlens_k must not decrease, got 9 then 4 at index 2",
    ),
    (
        "cu end",
        lambda a: a["cu_seqlens_q"][-1].add_(1),
        ValueError,
        r"opforge.attention_varlen: cu_seqlens_q must end at most at the packed length 17 \(rows past its "
        r"last offset belong to no sequence\), got 18",
    ),
    (
        "q dtype",
        lambda a: a.update(q=a["q"].int(), k=a["k"].int(), v=a["v"].int()),
        RuntimeError,
        r"q must be one of \(float16",
    ),
    ("k dtype", lambda a: a.update(k=a["k"].double()), RuntimeError, r"k must have the same dtype as q"),
    ("gqa ratio", lambda a: a.update(q=a["q"][:, :3]), RuntimeError, r"multiple of k's and v's heads"),
    (
        "v shorter than k",
        lambda a: a.update(v=a["v"][:-1]),
        RuntimeError,
        r"opforge.attention_varlen: k and v must have the same shape \(total_k, kv_heads, head_dim\) but for the "
        r"head dim, got "
        r"\[20, 2, 8\] and \[19, 2, 8\]",
    ),
    (
        "head_dim",
        lambda a: a.update(q=a["q"][..., :4]),
        RuntimeError,
        r"opforge.attention_varlen: q and k must have the same head_dim, got 4 and 8",
    ),
    (
        "scale tensor",
        lambda a: a.update(scale=torch.ones(2)),
        TypeError,
        r"opforge.attention_varlen: scale must be a number or a one-element real tensor",
    ),
    (
        "window",
        lambda a: a.update(window=(-1, 0)),
        ValueError,
        r"opforge.attention_varlen: window sides must be ints >= 0 or None",
    ),
    (
        "softcap",
        lambda a: a.update(softcap=-2.0),
        ValueError,
        r"opforge.attention_varlen: softcap must be a positive number",
    ),
    (
        "scale",
        lambda a: a.update(scale=math.inf),
        ValueError,
        r"opforge.attention_varlen: scale must be finite, got inf",
    ),
    (
        "causal",
        lambda a: a.update(causal=None),
        TypeError,
        r"opforge.attention_varlen: causal must be a bool, got NoneType",
    ),
    (
        "max_seqlen negative",
        lambda a: a.update(max_seqlen_q=-1),
        ValueError,
        r"opforge.attention_varlen: max_seqlen_q must be >= 0, got -1",
    ),
    (
        "max_seqlen type",
        lambda a: a.update(max_seqlen_k=2.5),
        TypeError,
        r"opforge.attention_varlen: max_seqlen_k must be an int or None, got float",
    ),
    (
        "deterministic",
        lambda a: a.update(deterministic="yes"),
        TypeError,
        r"opforge.attention_varlen: deterministic must be a bool or None, got str",
    ),
    (
        "variant decode",
        lambda a: a.update(variant="decode"),
        ValueError,
        r"opforge.attention_varlen: variant 'decode' does not take packed sequences \(cu_seqlens\); on the "
        r"CPU they run on: auto, tiled",
    ),
]


@pytest.mark.parametrize("name,change,err,msg", VARLEN_ERRORS, ids=[e[0] for e in VARLEN_ERRORS])
def test_varlen_errors(name, change, err, msg):
    q, k, v, cu_q, cu_k = varlen_case([(5, 9), (2, 4), (10, 7)], 4, 2, 8)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    change(args)
    with pytest.raises(err, match=msg):
        opforge.attention_varlen(**args)


def test_varlen_errors_raw_op():
    """The raw ops' checks: a batch of one, offsets in pairs, what combines with them, the
    backward's offsets."""
    q, k, v, cu_q, cu_k = varlen_case([(5, 9), (2, 4)], 2, 2, 8)
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    raw = torch.ops.opforge.attention.default
    offsets = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    with pytest.raises(
        RuntimeError,
        match=r"opforge.attention: with cu_seqlens, q, k and v hold the packed sequences in a batch of "
        r"one, got a batch of 2",
    ):
        raw(*(t.expand(2, -1, -1, -1) for t in (q4, k4, v4)), 0.5, 0.0, *NO_PATTERN, **offsets)
    with pytest.raises(ValueError, match=r"cu_seqlens_q and cu_seqlens_k go together"):
        raw(q4, k4, v4, 0.5, 0.0, *NO_PATTERN, cu_seqlens_q=cu_q)
    combine = r"cu_seqlens \(packed sequences\) combine with causal, a window and softcap only, not with "
    seg_q, seg_k = torch.zeros(1, 7, dtype=torch.long), torch.zeros(1, 13, dtype=torch.long)
    with pytest.raises(ValueError, match=combine + "segment ids"):
        raw(q4, k4, v4, 0.5, 0.0, False, -1, -1, 0, seg_q, seg_k, None, None, None, 128, 128, **offsets)
    with pytest.raises(ValueError, match=combine + "a prefix"):
        raw(q4, k4, v4, 0.5, 0.0, True, -1, -1, 3, *(None,) * 5, 128, 128, **offsets)
    m = block_mask(lambda b, h, i, j: i >= j, None, None, 7, 13, block_size=64)
    with pytest.raises(ValueError, match=combine + "a block mask"):
        raw(q4, k4, v4, 0.5, 0.0, False, -1, -1, 0, None, None, m.kinds, m.index, m.bits, 64, 64, **offsets)
    with pytest.raises(ValueError, match=combine + "kv_lens"):
        raw(q4, k4, v4, 0.5, 0.0, *NO_PATTERN, torch.tensor([13]), **offsets)
    with pytest.raises(RuntimeError, match=r"cu_seqlens_k must be one of \(int32, int64\), got float32"):
        raw(q4, k4, v4, 0.5, 0.0, *NO_PATTERN, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k.float())
    out, lse = raw(q4, k4, v4, 0.5, 0.0, *NO_PATTERN, **offsets)
    bad = cu_k.clone()
    bad[1] = 20
    with pytest.raises(
        ValueError, match=r"opforge.attention_backward: cu_seqlens_k must not decrease, got 20 then 13"
    ):
        torch.ops.opforge.attention_backward.default(
            out, q4, k4, v4, out, lse, None, 0.5, 0.0, *NO_PATTERN, cu_seqlens_q=cu_q, cu_seqlens_k=bad
        )


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (torch.compile, meta tensors) raise the same type
    with the same words for tensors that do not fit: RuntimeError, as PyTorch's own ops do."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = qkv(2, 4, 2, 8, 8, 16)
    bad = [(q, k, v[:, :, :5]), (q, k[:1], v[:1]), (q, k[..., :8], v[..., :8]), (q[:, :3], k, v)]
    raw = torch.ops.opforge.attention.default
    for qb, kb, vb in bad:
        with pytest.raises(RuntimeError) as wrapper:
            opforge.attention(qb, kb, vb)
        with pytest.raises(RuntimeError) as real:
            raw(qb, kb, vb, 0.25, 0.0, *NO_PATTERN)
        with FakeTensorMode() as mode, pytest.raises(RuntimeError) as fake:
            raw(*(mode.from_tensor(t) for t in (qb, kb, vb)), 0.25, 0.0, *NO_PATTERN)
        assert str(wrapper.value) == str(real.value) == str(fake.value)
        with pytest.raises(RuntimeError, match=re.escape(str(real.value))):  # (the Meta kernel: the fake)
            raw(*(t.to("meta") for t in (qb, kb, vb)), 0.25, 0.0, *NO_PATTERN)


def test_fake_kernels_raise_the_ops_errors():
    """The registered ops' fake kernels (torch.compile's tracing, meta tensors) raise what the ops
    raise on real tensors, type and message, for conditions that read no data."""
    attention = torch.ops.opforge.attention.default
    paged = torch.ops.opforge.attention_paged.default
    append = torch.ops.opforge.paged_kv_append.default
    no_pattern = (None, None, None, None, None, 128, 128)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8)
    kc, table, lens = torch.randn(6, 4, 2, 8), torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([5, 9])
    new = torch.randn(2, 2, 1, 8)
    segments = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 7, dtype=torch.long))
    cases = [
        (attention, (q, k, k, 0.3, 0.0, False, -1, -1, 0, *no_pattern, torch.ones(2)), {}),
        (attention, (q, k, k, 0.3, 0.0, False, -1, -1, 0, *segments, None, None, None, 128, 128), {}),
        (attention, (q, k, k, float("nan"), 0.0, False, -1, -1, 0, *no_pattern), {}),
        (attention, (q, k, k, 0.3, 0.0, False, -5, -1, 0, *no_pattern), {}),
        (attention, (q[..., :0], k[..., :0], k[..., :0], 0.3, 0.0, False, -1, -1, 0, *no_pattern), {}),
        (paged, (q[:, :, :1], kc, kc, lens, table.float(), 0.3, 0.0, False, -1, -1, 0, "auto"), {}),
        (append, (kc.int(), kc.int(), new.int(), new.int(), table, lens), {}),
        (append, (kc.clone(), kc.clone(), new, new, table.float(), lens), {}),
        (
            append,
            (
                kc.clone(),
                kc.clone(),
                new[:, :1].expand(2, 3, 1, 8),
                new[:, :1].expand(2, 3, 1, 8),
                table,
                lens,
            ),
            {},
        ),
        (append, (kc.clone(), kc.clone(), new.double(), new.double(), table, lens), {}),
    ]
    for op, args, kwargs in cases:
        with pytest.raises(Exception) as real:
            op(*args, **kwargs)
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(type(real.value)) as fake:
            op(*meta, **kwargs)
        assert str(fake.value).splitlines()[0] == str(real.value).splitlines()[0], (op, str(real.value))
    # (a variant is checked against the device's kernels; on meta tensors, against every name)
    with pytest.raises(ValueError, match=r"opforge.attention: variant 'nope' is unknown"):
        attention(*(t.to("meta") for t in (q, k, k)), 0.3, 0.0, False, -1, -1, 0, *no_pattern, variant="nope")
