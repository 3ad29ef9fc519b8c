"""opforge.attention: every pattern against a float64 reference with an explicit boolean mask,
dtypes, odd lengths, Sq != Sk, GQA, fully masked rows, block masks, softcap, gradients (gradcheck,
against the reference, determinism, the LSE's gradient), layouts, errors, opcheck, compile,
training; opforge.block_mask; packed variable-length sequences (opforge.attention_varlen)."""

from __future__ import annotations

import math
import time
from functools import partial

import pytest
import torch

import opforge
from opforge import reference
from opforge.masks import BlockMask, attention_mask, block_mask

# The CPU kernels' tests; the CUDA kernels' (float16/bfloat16) are in test_attention_cuda.py.
DEVICES = ["cpu"]

PATTERNS = {
    "full": {},
    "causal": dict(causal=True),
    "sliding": dict(causal=True, window=(9, 0)),
    "window both sides": dict(window=(5, 3)),
    "window right only": dict(window=(None, 4)),
    "prefix": dict(causal=True, prefix_len=13),
    "documents": dict(causal=True, segments=True),
    "documents, window": dict(causal=True, window=(6, 0), segments=True),
    "block mask": dict(mask=True),
    "block mask, causal": dict(mask=True, causal=True),
    "softcap": dict(causal=True, softcap=3.0),
}
# (B, Hq, Hkv, Sq, Sk, D): one token, odd lengths, Sq != Sk both ways, GQA, multi-tile rows.
SHAPES = [
    (1, 1, 1, 1, 1, 8),
    (2, 2, 2, 17, 17, 16),
    (1, 4, 2, 127, 127, 32),
    (2, 4, 1, 33, 150, 24),
    (1, 2, 2, 150, 40, 8),
    (1, 3, 3, 200, 200, 64),
]
# Decode: few queries (x the GQA group) against many keys (the CPU's decode path: the group's rows
# together, the keys split into chunks merged afterwards); rows = Hq / Hkv * Sq up to 32.
DECODE_SHAPES = [
    (2, 4, 1, 1, 700, 64),
    (1, 8, 2, 3, 1000, 40),
    (2, 2, 2, 16, 300, 32),
    (1, 32, 1, 1, 2000, 16),
]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}
# The raw ops' pattern arguments for no pattern (causal .. block_k).
NO_PATTERN = (False, -1, -1, 0, None, None, None, None, None, 128, 128)


def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.float32, device="cpu"):
    q = torch.randn(B, Hq, Sq, D, dtype=dtype, device=device)
    k = torch.randn(B, Hkv, Sk, D, dtype=dtype, device=device)
    v = torch.randn(B, Hkv, Sk, D, dtype=dtype, device=device)
    return q, k, v


def random_segments(B, S):
    """Packed documents: sorted ids, random lengths (some of one token)."""
    cuts = torch.sort(torch.randint(0, S + 1, (B, 3))).values
    pos = torch.arange(S)[None, :]
    return (pos[:, :, None] >= cuts[:, None, :]).sum(-1)


def random_block_mask(B, H, Sq, Sk, block=64, density=0.5):
    """A function mask over random data: some blocks empty, some full, most partial."""
    table = torch.rand(B, H, Sq, Sk) < density
    blocks = torch.rand(B, H, -(-Sq // block), -(-Sk // block))
    table[..., :, :] &= (blocks > 0.2).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    table |= (blocks > 0.85).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    return block_mask(lambda b, h, q, kv: table[b, h, q, kv], B, H, Sq, Sk, block_size=block)


def pattern_kwargs(name, B, H, Sq, Sk):
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        # One (B, Sk) tensor covers the queries (the last Sq keys' ids) only when Sq <= Sk.
        kw["segment_ids"] = (
            random_segments(B, Sk) if Sq <= Sk else (random_segments(B, Sq), random_segments(B, Sk))
        )
    if kw.pop("mask", False):
        kw["mask"] = random_block_mask(B, H, Sq, Sk)
    return kw


def errors(got, want, low):
    """Max |got - want| and max |low - want| (low: the reference in the test's dtype)."""
    return (got.double() - want).abs().max().item(), (low.double() - want).abs().max().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES + DECODE_SHAPES, ids=str)
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_forward_matches_reference(device, dtype, name, shape):
    B, Hq, _, Sq, Sk, _ = shape
    q, k, v = qkv(*shape, dtype=dtype, device=device)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
    want, want_lse = reference.attention(q.double(), k.double(), v.double(), return_lse=True, **kw)
    assert (
        out.shape == q.shape
        and out.dtype == dtype
        and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    )
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())  # exactly the rows that see nothing
    finite = want_lse.isfinite()
    lse_err = (lse.double() - want_lse)[finite].abs().max().item() if finite.any() else 0.0
    if dtype in TOL:
        assert errors(out, want, want)[0] <= TOL[dtype] and lse_err <= TOL[dtype] * 10
    else:  # 16-bit: within 2x the error of PyTorch's own attention in that dtype
        low = reference.attention(q, k, v, **kw)
        err, torch_err = errors(out, want, low)
        assert err <= 2 * torch_err + 1e-3, (err, torch_err)
        assert lse_err <= 1e-3 * max(1.0, want_lse[finite].abs().max().item() if finite.any() else 0.0)
    if not finite.all():  # fully masked rows: zeros
        assert (out.double()[~finite] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_16_bit(dtype):
    q, k, v = qkv(2, 4, 2, 130, 70, 32, dtype=dtype)
    for kw in (dict(causal=True), dict(window=(20, 20)), dict(prefix_len=10, causal=True, softcap=5.0)):
        want = reference.attention(q.double(), k.double(), v.double(), **kw)
        err, torch_err = errors(opforge.attention(q, k, v, **kw), want, reference.attention(q, k, v, **kw))
        assert err <= 2 * torch_err + 1e-3, (kw, err, torch_err)


def test_fully_masked_rows_and_their_gradients():
    """Rows that see no key: zeros, LSE -inf, no NaN in the output or any gradient; keys no query
    sees get zero dK and dV."""
    B, H, S, D = 1, 2, 70, 16
    dense = torch.rand(B, H, S, S) < 0.3
    dense[:, :, 5] = False  # query 5 sees nothing
    dense[:, :, :, 9] = False  # key 9 is seen by nobody
    mask = BlockMask.from_dense(dense, block_size=64)
    q, k, v = (t.double().requires_grad_() for t in qkv(B, H, H, S, S, D))
    out, lse = opforge.attention(q, k, v, mask=mask, return_lse=True)
    assert (out[:, :, 5] == 0).all() and (lse[:, :, 5] == -math.inf).all()
    (out.sum() + lse[lse.isfinite()].sum()).backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all()
    assert (q.grad[:, :, 5] == 0).all() and (k.grad[:, :, 9] == 0).all() and (v.grad[:, :, 9] == 0).all()
    # Sk = 0: every row sees nothing
    out, lse = opforge.attention(*qkv(1, 2, 2, 4, 0, 8), return_lse=True)
    assert out.shape == (1, 2, 4, 8) and (out == 0).all() and (lse == -math.inf).all()


@pytest.mark.parametrize(
    "name", ["full", "causal", "sliding", "prefix", "documents", "block mask", "softcap"]
)
def test_gradcheck(name):
    B, Hq, Hkv, Sq, Sk, D = 1, 2, 1, 11, 13, 4
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    q, k, v = (t.double().requires_grad_() for t in qkv(B, Hq, Hkv, Sq, Sk, D))

    def f(q, k, v):
        out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("shape", [(2, 4, 2, 150, 140, 32), (2, 4, 2, 2, 600, 32)], ids=["tiles", "decode"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gradients_match_reference(name, shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, D)
    go = torch.randn(B, Hq, Sq, D)
    grads = torch.autograd.grad(
        opforge.attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), **kw), (q, k, v), go
    )
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(reference.attention(qd, kd, vd, **kw), (qd, kd, vd), go.double())
    for g, w in zip(grads, want, strict=True):
        assert (g.double() - w).abs().max().item() <= 1e-4 * max(1.0, w.abs().max().item())


def test_backward_is_deterministic():
    q, k, v = (t.requires_grad_() for t in qkv(2, 8, 2, 200, 200, 32))
    go = torch.randn_like(q)
    kw = dict(causal=True, window=(50, 0))
    a = torch.autograd.grad(opforge.attention(q, k, v, **kw), (q, k, v), go)
    b = torch.autograd.grad(opforge.attention(q, k, v, **kw), (q, k, v), go)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_lse_gradient():
    q, k, v = (t.double().requires_grad_() for t in qkv(1, 2, 2, 20, 30, 8))
    _, lse = opforge.attention(q, k, v, causal=True, return_lse=True)
    g = torch.autograd.grad(lse.sum(), (q, k))
    qd, kd = (t.detach().clone().requires_grad_() for t in (q, k))
    _, want = reference.attention(qd, kd, v.detach(), causal=True, return_lse=True)
    w = torch.autograd.grad(want.sum(), (qd, kd))
    for a, b in zip(g, w, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


def test_layouts():
    """(B, S, H, D) tensors viewed as (B, H, S, D) are read in place and the output is laid out
    like q; sliced and expanded inputs work too."""
    B, S, H, D = 2, 50, 4, 16
    qs, ks, vs = (torch.randn(B, S, H, D) for _ in range(3))
    q, k, v = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
    out = opforge.attention(q, k, v, causal=True)
    assert out.stride(1) < out.stride(2)  # (B, S, H, D) underneath
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert (out.double() - want).abs().max() < 2e-5
    big = torch.randn(B, H, 2 * S, 2 * D)
    sliced = big[:, :, ::2, 3 : 3 + D]
    out = opforge.attention(sliced, k, v)
    assert (out.double() - reference.attention(sliced.double(), k.double(), v.double())).abs().max() < 2e-5
    kx = torch.randn(B, 1, S, D).expand(B, H, S, D)
    out = opforge.attention(q, kx, kx)
    assert (out.double() - reference.attention(q.double(), kx.double(), kx.double())).abs().max() < 2e-5


@pytest.mark.parametrize("name", ["causal", "sliding", "softcap", "documents"])
def test_decode_row_layouts(name):
    """Decoding from caches whose rows hold every kv head ((B, S, Hkv, D) views, and heads expanded
    from one): the decode kernel then takes all kv heads of a key block in one task; the same result
    as the reference, with per-sequence key counts too."""
    torch.manual_seed(1)
    B, H, Hkv, Sq, Sk, D = 3, 8, 4, 3, 900, 32
    q, k, v = qkv(B, H, Hkv, Sq, Sk, D)
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        kw["segment_ids"] = (torch.randint(0, 3, (B, Sq)), torch.randint(0, 3, (B, Sk)))
    ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))  # (B, S, Hkv, D) underneath
    k1 = torch.randn(B, 1, Sk, D).expand(B, Hkv, Sk, D)
    lens = torch.tensor([Sk, 17, 600])
    for kk, vv, extra in ((ks, vs, {}), (ks, vs, {"kv_lens": lens}), (k1, k1, {})):
        if "kv_lens" in extra and "segment_ids" in kw:
            continue
        assert torch.ops.opforge._attention_kernel("cpu", H, Hkv, Sq, Sk, D) == "decode"
        out = opforge.attention(q, kk, vv, **kw, **extra)
        want = reference.attention(q.double(), kk.double(), vv.double(), **kw, **extra)
        assert (out.double() - want).abs().max().item() <= 2e-5


def test_block_mask_round_trip():
    dense = torch.rand(2, 3, 150, 260) < 0.5
    dense[:, :, :64, :64] = True  # a full block
    dense[:, :, 64:128, 64:128] = False  # an empty block
    m = BlockMask.from_dense(dense, block_size=64)
    assert torch.equal(m.to_dense(), dense)
    assert m.kinds[0, 0, 0, 0] == 1 and m.kinds[0, 0, 1, 1] == 0
    f = block_mask(lambda b, h, q, kv: dense[b, h, q, kv], 2, 3, 150, 260, block_size=(64, 128))
    assert torch.equal(f.to_dense(), dense) and f.block_size == (64, 128)
    # B, H None: one mask for every batch row and head
    causal = block_mask(lambda b, h, q, kv: kv <= q, None, None, 300, 300)
    assert causal.shape == (1, 1, 300, 300)
    assert torch.equal(causal.to_dense()[0, 0], torch.ones(300, 300, dtype=torch.bool).tril())
    counts = causal.block_counts()
    assert counts == {"empty": 3, "full": 3, "partial": 3}


def test_block_mask_equals_builtin_patterns():
    B, H, S = 2, 2, 300
    q, k, v = qkv(B, H, H, S, S, 16)
    m = block_mask(lambda b, h, qi, kv: (kv <= qi) & (kv >= qi - 40), None, None, S, S)
    a = opforge.attention(q, k, v, mask=m)
    b = opforge.attention(q, k, v, causal=True, window=(40, 0))
    assert (a - b).abs().max() < 1e-6


def test_new_mask_compiles_nothing():
    """A new function mask costs its evaluation: well under FlexAttention's ~2 s compile."""
    q, k, v = qkv(1, 4, 4, 512, 512, 32)
    t0 = time.perf_counter()
    m = block_mask(lambda b, h, qi, kv: (qi // 64 + kv // 32) % 3 != 0, None, 4, 512, 512)
    opforge.attention(q, k, v, mask=m)
    assert time.perf_counter() - t0 < 1.0


def test_matches_sdpa():
    q, k, v = qkv(2, 4, 4, 100, 100, 32)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert (opforge.attention(q, k, v, causal=True) - sdpa(q, k, v, is_causal=True)).abs().max() < 1e-5
    dense = attention_mask(2, 4, 100, 100, window=(7, 7))
    assert (opforge.attention(q, k, v, window=(7, 7)) - sdpa(q, k, v, attn_mask=dense)).abs().max() < 1e-5
    kg, vg = k[:, :2], v[:, :2]
    assert (opforge.attention(q, kg, vg) - sdpa(q, kg, vg, enable_gqa=True)).abs().max() < 1e-5
    assert (opforge.attention(q, k, v, scale=0.3) - sdpa(q, k, v, scale=0.3)).abs().max() < 1e-5


def opcheck_patterns(q, k, v, seg, mask, scale):
    """torch.library.opcheck of the forward op under a band, a prefix + window, and segments with a
    block mask and a softcap (the CPU and CUDA tests share it)."""
    for kw in (
        dict(causal=True),
        dict(window=(3, 5), prefix_len=4),
        dict(segment_ids=seg, mask=mask, softcap=2.0),
    ):
        args = opforge.ops.attention._pattern_args(
            q,
            k,
            kw.get("causal", False),
            kw.get("window"),
            kw.get("prefix_len"),
            kw.get("segment_ids"),
            kw.get("mask"),
        )
        torch.library.opcheck(
            torch.ops.opforge.attention.default, (q, k, v, scale, kw.get("softcap", 0.0), *args)
        )


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 37, 45, 16))
    opcheck_patterns(q, k, v, random_segments(1, 45), random_block_mask(1, 4, 37, 45), 0.25)


def test_torch_compile_fullgraph():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 64, 64, 16))
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True, window=(8, 0)), fullgraph=True)
    out = f(q, k, v)
    assert torch.allclose(out, opforge.attention(q, k, v, causal=True, window=(8, 0)))
    out.sum().backward()
    assert q.grad is not None and k.grad is not None


def test_trains_like_sdpa():
    """A small attention model's loss goes down with opforge attention as it does with SDPA."""

    class Model(torch.nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.attn = attn
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(x).view(B, S, 3, 4, 8).permute(2, 0, 3, 1, 4)
            return self.out(self.attn(q, k, v).transpose(1, 2).reshape(B, S, 32))

    x, y = torch.randn(8, 40, 32), torch.randn(8, 40, 32)
    losses = {}
    for name, attn in {
        "opforge": lambda q, k, v: opforge.attention(q, k, v, causal=True),
        "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }.items():
        torch.manual_seed(1)
        model = Model(attn)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        curve = []
        for _ in range(30):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[name] = curve
    assert losses["opforge"][-1] < 0.8 * losses["opforge"][0]
    assert abs(losses["opforge"][-1] - losses["sdpa"][-1]) < 1e-3 * losses["sdpa"][0]


ERRORS = [
    ("q 3-D", lambda q, k, v: (q[0], k, v, {}), ValueError, r"opforge.attention: q must be 4-D"),
    (
        "int dtype",
        lambda q, k, v: (q.int(), k.int(), v.int(), {}),
        RuntimeError,
        r"q must be one of \(float16",
    ),
    ("k dtype", lambda q, k, v: (q, k.double(), v, {}), RuntimeError, r"k must have the same dtype as q"),
    ("head dims", lambda q, k, v: (q, k[..., :8], v[..., :8], {}), ValueError, r"same head_dim"),
    ("k v shapes", lambda q, k, v: (q, k, v[:, :, :5], {}), ValueError, r"k and v must have the same shape"),
    (
        "gqa ratio",
        lambda q, k, v: (q[:, :3], k[:, :2], v[:, :2], {}),
        ValueError,
        r"multiple of k's and v's heads",
    ),
    ("batch", lambda q, k, v: (q, k[:1], v[:1], {}), ValueError, r"same batch size"),
    (
        "window",
        lambda q, k, v: (q, k, v, dict(window=(-2, 0))),
        ValueError,
        r"window sides must be ints >= 0",
    ),
    ("window shape", lambda q, k, v: (q, k, v, dict(window=3)), ValueError, r"window must be a pair"),
    ("prefix", lambda q, k, v: (q, k, v, dict(prefix_len=-1)), ValueError, r"prefix_len must be an int >= 0"),
    (
        "segments",
        lambda q, k, v: (q, k, v, dict(segment_ids=torch.zeros(2, 5))),
        ValueError,
        r"segment_ids must be",
    ),
    (
        "segment dtype",
        lambda q, k, v: (q, k, v, dict(segment_ids=torch.zeros(2, 20))),
        TypeError,
        r"segment_ids must be int32 or int64, got float32",
    ),
    (
        "mask shape",
        lambda q, k, v: (q, k, v, dict(mask=block_mask(lambda b, h, i, j: i >= j, None, None, 30, 20))),
        ValueError,
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
        r"scale must be a finite number",
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


def test_block_mask_errors():
    with pytest.raises(TypeError, match=r"opforge.block_mask: fn must be callable"):
        block_mask(3, 1, 1, 10, 10)
    with pytest.raises(TypeError, match=r"fn must return a bool tensor"):
        block_mask(lambda b, h, q, kv: q - kv, 1, 1, 10, 10)
    with pytest.raises(ValueError, match=r"block_size must be a positive multiple of 64"):
        block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 10, 10, block_size=48)
    with pytest.raises(ValueError, match=r"Sq must be a non-negative int"):
        block_mask(lambda b, h, q, kv: q >= kv, 1, 1, -1, 10)
    with pytest.raises(TypeError, match=r"from_dense: mask must be a bool tensor"):
        BlockMask.from_dense(torch.ones(4, 4))


def test_int64_segment_ids_beyond_int32():
    """Ids that differ only above 32 bits stay different segments."""
    q, k, v = (t.double() for t in qkv(1, 1, 1, 4, 4, 8))
    seg = torch.tensor([[0, 0, 2**32, 2**32]])
    want = reference.attention(q, k, v, segment_ids=seg)
    assert (opforge.attention(q, k, v, segment_ids=seg) - want).abs().max() < 1e-12
    assert (want - reference.attention(q, k, v)).abs().max() > 1e-3  # the segments matter here


@pytest.mark.parametrize(
    "kw", [dict(window=(None, 2**63 - 1)), dict(window=(2**70, 2**63 - 1)), dict(prefix_len=2**70)]
)
def test_huge_window_and_prefix(kw):
    """Sides and prefixes beyond the sequence mean 'everything', without an overflow."""
    q, k, v = (t.double() for t in qkv(1, 2, 2, 7, 11, 8))
    want = reference.attention(q, k, v)
    assert (opforge.attention(q, k, v, **kw) - want).abs().max() < 1e-12
    assert (reference.attention(q, k, v, **kw) - want).abs().max() < 1e-12


def test_torch_compile_dynamic():
    """dynamic=True: the default scale of a symbolic head_dim and a traced scale argument."""
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True), fullgraph=True, dynamic=True)
    g = torch.compile(lambda q, k, v, s: opforge.attention(q, k, v, scale=s), fullgraph=True, dynamic=True)
    for D in (8, 16):
        q, k, v = qkv(1, 2, 1, 10, 12, D)
        assert torch.allclose(f(q, k, v), opforge.attention(q, k, v, causal=True))
        assert torch.allclose(g(q, k, v, 0.3), opforge.attention(q, k, v, scale=0.3))


def test_block_mask_without_keys():
    m = block_mask(lambda b, h, q, kv: q >= kv, None, None, 10, 0)
    assert m.to_dense().shape == (1, 1, 10, 0)
    assert BlockMask.from_dense(torch.ones(0, 0, dtype=torch.bool)).shape == (1, 1, 0, 0)
    out = opforge.attention(*qkv(1, 1, 1, 10, 0, 8), mask=m)
    assert out.shape == (1, 1, 10, 8) and (out == 0).all()


def test_error_messages_name_the_callers_arguments():
    q, k, v = qkv(2, 1, 1, 20, 20, 8)
    with pytest.raises(ValueError, match=r"segment_ids must be \(batch, keys\) = \(2, 20\)"):
        opforge.attention(q, k, v, segment_ids=torch.zeros(1, 20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        opforge.attention(q[0], k, v, segment_ids=torch.zeros(2, 20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"block_size must be a positive multiple of 64"):
        block_mask(lambda b, h, i, j: i >= j, 1, 1, 10, 10, block_size=(64, 64, 64))
    with pytest.raises(ValueError, match=r"needs Sq <= Sk"):
        reference.attention(*qkv(1, 1, 1, 40, 30, 8), segment_ids=torch.zeros(1, 30, dtype=torch.long))


def test_unsorted_segment_ids():
    """Segment ids need not be sorted or contiguous (tokens of one id may be scattered)."""
    B, H, S, D = 2, 2, 150, 16
    q, k, v = (t.requires_grad_() for t in qkv(B, H, H, S, S, D))
    seg = torch.randint(0, 3, (B, S))
    for kw in (dict(segment_ids=seg), dict(segment_ids=seg, causal=True, window=(40, 0))):
        out = opforge.attention(q, k, v, **kw)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        want = reference.attention(qd, kd, vd, **kw)
        assert (out.double() - want).abs().max() < 2e-5
        go = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), go)
        ref = torch.autograd.grad(want, (qd, kd, vd), go.double())
        for g, w in zip(got, ref, strict=True):
            assert (g.double() - w).abs().max() <= 1e-4 * max(1.0, w.abs().max().item())


# ---- per-sequence key counts (kv_lens): batched decoding against a preallocated cache ----------

KV_LENS_PATTERNS = [
    "full",
    "causal",
    "sliding",
    "window both sides",
    "prefix",
    "documents",
    "block mask",
    "softcap",
]


def kv_lens_case(shape, name, device="cpu", dtype=torch.float32):
    """q, k, v with the cache slots past each sequence's count filled with NaN (nothing may read
    them), random counts including 0 and Sk, and the pattern's arguments (segments as a pair)."""
    B, Hq, _, Sq, Sk, _ = shape
    q, k, v = qkv(*shape, dtype=dtype, device=device)
    lens = torch.randint(0, Sk + 1, (B,))
    lens[0] = Sk
    if B > 1:
        lens[1] = 0 if B > 2 else max(1, Sk // 3)
    past = torch.arange(Sk)[None, :] >= lens[:, None]
    k[past[:, None, :, None].expand_as(k).to(device)] = float("nan")
    v[past[:, None, :, None].expand_as(v).to(device)] = float("nan")
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        kw["segment_ids"] = (torch.randint(0, 3, (B, Sq)).to(device), torch.randint(0, 3, (B, Sk)).to(device))
    if kw.pop("mask", False):
        kw["mask"] = random_block_mask(B, Hq, Sq, Sk)
        if device != "cpu":
            kw["mask"] = kw["mask"].to(device)
    return q, k, v, lens.to(device), kw


def check_kv_lens(q, k, v, lens, kw, tol):
    out, lse = opforge.attention(q, k, v, kv_lens=lens, return_lse=True, **kw)
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    want, want_lse = reference.attention(q.double(), kd, vd, kv_lens=lens, return_lse=True, **kw)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())
    finite = want_lse.isfinite()
    assert (out.double() - want).abs().max().item() <= tol
    if finite.any():
        assert (lse.double() - want_lse)[finite].abs().max().item() <= tol * 10
    if not finite.all():
        assert (out.double()[~finite] == 0).all()
    return out


# (B, Hq, Hkv, Sq, Sk, D): decode-kernel calls (rows <= 32, short caches too), and chunks of new
# queries with more rows than the decode kernel takes (64 and 80: the tiled kernel takes the counts)
KV_LENS_SHAPES = [
    (3, 4, 1, 1, 700, 64),
    (2, 8, 2, 4, 300, 40),
    (3, 2, 2, 3, 90, 16),
    (2, 16, 2, 8, 200, 32),
    (3, 8, 2, 20, 150, 16),
]


@pytest.mark.parametrize("shape", KV_LENS_SHAPES, ids=str)
@pytest.mark.parametrize("name", KV_LENS_PATTERNS)
def test_kv_lens_matches_reference(name, shape):
    check_kv_lens(*kv_lens_case(shape, name), tol=2e-5)


# ---- paged KV caches (block_table) and paged_kv_append ----------------------------------------


def to_pages(k, v, lens, page_size, spare=3):
    """The (B, Hkv, Sk, D) caches k, v scattered over the pages of (num_pages, page_size, Hkv, D)
    caches in a random order (NaN in every slot no sequence owns), and the block table: one column
    more than the longest sequence needs, the entries past each sequence's pages garbage (-7, a page
    number past the caches) that nothing may read."""
    B, Hkv, Sk, D = k.shape
    P = (Sk + page_size - 1) // page_size + 1
    pages = B * P + spare
    table = torch.randperm(pages)[: B * P].view(B, P)
    kc = torch.full((pages, page_size, Hkv, D), float("nan"), dtype=k.dtype, device=k.device)
    vc = kc.clone()
    for b in range(B):
        for j in range(P):
            lo, hi = j * page_size, min(Sk, (j + 1) * page_size)
            if lo < hi:
                kc[table[b, j], : hi - lo] = k[b, :, lo:hi].transpose(0, 1)
                vc[table[b, j], : hi - lo] = v[b, :, lo:hi].transpose(0, 1)
        used = (int(lens[b]) + page_size - 1) // page_size
        table[b, used:] = torch.tensor([-7, pages + 5])[torch.arange(P - used) % 2]
    return kc, vc, table.to(torch.int32).to(k.device)


@pytest.mark.parametrize("page_size", [16, 7, 256])
@pytest.mark.parametrize("shape", [*KV_LENS_SHAPES[:3], KV_LENS_SHAPES[-1]], ids=str)
@pytest.mark.parametrize("name", ["full", "causal", "sliding", "softcap"])
def test_paged_cache_matches_reference(name, shape, page_size):
    """attention(q, k_cache, v_cache, kv_lens=, block_table=) reads sequence b's key j from its
    page: the result of the contiguous cache's call, against the float64 reference."""
    q, k, v, lens, kw = kv_lens_case(shape, name)
    kc, vc, table = to_pages(k, v, lens, page_size)
    out, lse = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, return_lse=True, **kw)
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    want, want_lse = reference.attention(q.double(), kd, vd, kv_lens=lens, return_lse=True, **kw)
    assert not out.isnan().any()
    assert (out.double() - want).abs().max().item() <= 2e-5
    assert torch.equal(lse.isinf(), want_lse.isinf())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [7, 16, 256])
@pytest.mark.parametrize("name", ["causal", "sliding", "softcap", "prefix"])
def test_paged_decode_reads_the_pages_in_place(name, page_size, dtype):
    """A decoding call on paged caches runs the decode kernel on the pages themselves (no gathered
    copy: no index_select in the profile) and gives the contiguous cache's result (the same kernel
    and key blocks; the split into chunks may differ with the table's length); q with gradients
    gathers the pages instead."""
    torch.manual_seed(page_size)
    q, k, v, lens, kw = kv_lens_case((3, 8, 2, 2, 700, 32), name, dtype=dtype)
    kc, vc, table = to_pages(k, v, lens, page_size)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, return_lse=True, **kw)
    ops = {e.name for e in prof.events()}
    assert "opforge::attention_paged" in ops and not any("index_select" in n for n in ops)
    want, want_lse = opforge.attention(q, k, v, kv_lens=lens, return_lse=True, **kw)
    tight = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=8e-3, rtol=0)
    torch.testing.assert_close(out, want, **tight)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-6)
    qg = q.detach().clone().requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = opforge.attention(qg, kc, vc, kv_lens=lens, block_table=table, **kw)
    assert any("index_select" in e.name for e in prof.events())
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    ref = reference.attention(q.double(), kd, vd, kv_lens=lens, **kw)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert (got.double() - ref).abs().max().item() <= tol


def test_paged_attention_op_checks():
    """opforge::attention_paged called directly names what is wrong."""
    q, k, v = qkv(2, 4, 2, 1, 32, 16)
    lens = torch.tensor([20, 32])
    kc, vc, table = to_pages(k, v, lens, 8)
    op = torch.ops.opforge.attention_paged.default
    args = (0.25, 0.0, True, -1, 0, 0)
    with pytest.raises(TypeError, match="block_table must be int32 here"):
        op(q, kc, vc, lens, table.long(), *args)
    with pytest.raises(ValueError, match="must be paged caches"):
        op(q, kc, vc[:-1], lens, table, *args)
    with pytest.raises(ValueError, match=r"block_table must be \(batch, max_pages\)"):
        op(q, kc, vc, lens, table[:1], *args)
    with pytest.raises(ValueError, match="q must be"):
        op(q[0], kc, vc, lens, table, *args)
    with pytest.raises(RuntimeError, match="block_table must be on the same device as q"):
        op(q, kc, vc, lens, table.to("meta"), *args)
    out = op(q, kc, vc, lens, table, *args)[0]
    assert torch.equal(out, opforge.attention(q, k, v, kv_lens=lens, causal=True, scale=0.25))
    qg = q.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="attention_paged has no backward"):
        op(qg, kc, vc, lens, table, *args)[0].sum().backward()
    # a sequence's pages past 2^31 keys (its index arithmetic is 32-bit): refused, not wrapped
    big = torch.zeros(2, 2**15 + 1, dtype=torch.int32)
    small_k = torch.randn(2, 2**16, 2, 16)
    with pytest.raises(ValueError, match="at most 2\\^31 - 1 keys"):
        op(q, small_k, small_k, lens, big, *args)
    with pytest.raises(ValueError, match="at most 2\\^31 - 1 keys"):
        opforge.attention(q, small_k, small_k, kv_lens=lens, block_table=big)
    # no heads: the empty result the general path gives
    q0 = torch.randn(2, 0, 1, 16)
    assert opforge.attention(q0, kc, vc, kv_lens=lens, block_table=table).shape == (2, 0, 1, 16)


def test_paged_kv_append_then_attend():
    """Prompts written by paged_kv_append (a sequence alone, then chunks for the whole batch from
    different lengths), then decode steps of one token: the caches hold each token at its page and
    slot (nothing else written), and attention over them equals the contiguous cache's."""
    torch.manual_seed(0)
    B, H, Hkv, D, ps = 3, 4, 2, 16, 8
    table = torch.randperm(40)[:24].view(B, 8).to(torch.int32)
    kc = torch.full((40, ps, Hkv, D), float("nan"))
    vc = kc.clone()
    full_k, full_v = torch.randn(B, Hkv, 64, D), torch.randn(B, Hkv, 64, D)
    lens = torch.tensor([3, 0, 10])
    for b in range(B):  # each sequence's first tokens on its own
        n = int(lens[b])
        opforge.paged_kv_append(
            kc,
            vc,
            full_k[b : b + 1, :, :n],
            full_v[b : b + 1, :, :n],
            table[b : b + 1],
            torch.zeros(1, dtype=torch.int64),
        )
    for n in (5, 9, 16):  # then chunks for all, each at its own length
        idx = lens[:, None] + torch.arange(n)[None, :]
        k_new = torch.stack([full_k[b][:, idx[b]] for b in range(B)])
        v_new = torch.stack([full_v[b][:, idx[b]] for b in range(B)])
        opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens.to(torch.int32))
        lens += n
    for _ in range(3):  # decode: one new token a sequence, then attend
        k_new = torch.stack([full_k[b, :, int(lens[b]) : int(lens[b]) + 1] for b in range(B)])
        v_new = torch.stack([full_v[b, :, int(lens[b]) : int(lens[b]) + 1] for b in range(B)])
        opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens)
        lens += 1
        q = torch.randn(B, H, 1, D)
        out = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True)
        want = opforge.attention(q, full_k, full_v, kv_lens=lens, causal=True)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    written = torch.zeros(40, ps, dtype=torch.bool)
    for b in range(B):
        for pos in range(int(lens[b])):
            page, slot = table[b, pos // ps], pos % ps
            written[page, slot] = True
            assert torch.equal(kc[page, slot], full_k[b, :, pos]) and torch.equal(
                vc[page, slot], full_v[b, :, pos]
            )
    assert kc[~written].isnan().all() and vc[~written].isnan().all()


def test_paged_errors():
    q, k, v = qkv(2, 4, 2, 1, 32, 16)
    lens = torch.tensor([20, 32])
    kc, vc, table = to_pages(k, v, lens, 8)
    with pytest.raises(ValueError, match="block_table needs kv_lens"):
        opforge.attention(q, kc, vc, block_table=table)
    with pytest.raises(TypeError, match="block_table must be int32 or int64"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=table.float())
    with pytest.raises(ValueError, match=r"block_table must be \(batch, max_pages\)"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=table[:1])
    with pytest.raises(ValueError, match="must be a paged cache"):
        opforge.attention(q, k, v[0], kv_lens=lens, block_table=table)
    bad = table.clone()
    bad[0, 1] = 10**6  # a page sequence 0 needs (20 keys: pages 0-2)
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 1000000 is not a page"):
        opforge.attention(q, kc, vc, kv_lens=lens, block_table=bad)
    new = torch.randn(2, 2, 3, 16)
    with pytest.raises(ValueError, match="q must be 4-D"):
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
    with pytest.raises(ValueError, match="with the caches' kv_heads"):
        opforge.paged_kv_append(kc, vc, new[:, :1], new[:, :1], table, lens)
    with pytest.raises(TypeError, match="kv_lens must be int32 or int64"):
        opforge.paged_kv_append(kc, vc, new, new, table, lens.float())


def test_kv_lens_full_counts_equal_no_counts():
    q, k, v = qkv(2, 4, 2, 2, 500, 32)
    lens = torch.tensor([500, 500])
    for kw in (dict(causal=True), dict(causal=True, window=(99, 0)), {}):
        assert torch.allclose(
            opforge.attention(q, k, v, kv_lens=lens, **kw), opforge.attention(q, k, v, **kw), atol=1e-6
        )


def test_kv_lens_is_a_prefix_of_the_cache():
    """Sequence b with kv_lens equals the same sequence with its cache cut to its count."""
    q, k, v = qkv(3, 8, 2, 2, 600, 32)
    lens = torch.tensor([600, 257, 33])
    out = opforge.attention(q, k, v, kv_lens=lens, causal=True, window=(127, 0))
    for b, n in enumerate(lens.tolist()):
        one = opforge.attention(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=True, window=(127, 0)
        )
        assert torch.allclose(out[b : b + 1], one, atol=1e-6)


def test_kv_lens_gradients_match_reference():
    q, k, v, lens, kw = kv_lens_case((2, 4, 2, 3, 150, 16), "sliding", dtype=torch.float64)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = opforge.attention(q, k, v, kv_lens=lens, **kw)
    want = reference.attention(q, k, v, kv_lens=lens, **kw)
    g = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    assert (out - want).abs().max().item() < 1e-10
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a - b).abs().max().item() < 1e-9


def test_kv_lens_compiles_without_graph_break():
    q, k, v = qkv(2, 8, 2, 1, 400, 32)
    lens = torch.tensor([400, 123])
    f = torch.compile(lambda q, k, v, n: opforge.attention(q, k, v, kv_lens=n, causal=True), fullgraph=True)
    assert torch.allclose(f(q, k, v, lens), opforge.attention(q, k, v, kv_lens=lens, causal=True))
    lens[1] = 7  # the counts are data: no recompilation, new result
    assert torch.allclose(
        f(q, k, v, lens), reference.attention(q, k, v, kv_lens=lens, causal=True), atol=1e-5
    )


KV_LENS_ERRORS = [
    (dict(kv_lens=[3, 4]), TypeError, r"opforge.attention: kv_lens must be a torch.Tensor"),
    (dict(kv_lens=torch.tensor([3.0, 4.0])), TypeError, r"kv_lens must be int32 or int64, got float32"),
    (dict(kv_lens=torch.tensor([3])), ValueError, r"kv_lens must be \(batch,\) = \(2,\), got shape \[1\]"),
    (dict(kv_lens=torch.tensor([[3, 4]])), ValueError, r"kv_lens must be \(batch,\)"),
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
    with pytest.raises(ValueError, match=r"opforge.attention: kv_lens must be \(batch,\) = \(2,\)"):
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


# ---- autograd transforms, double backward, numbers, prefix-LM, kernel choice --------------------

# Patterns for the transforms' tests (every mask mechanism: band, prefix, segments, block mask, softcap).
TRANSFORM_PATTERNS = ["full", "causal", "sliding", "prefix", "documents", "block mask", "softcap"]


def small_case(name, B=1, Hq=2, Hkv=1, Sq=9, Sk=11, D=4):
    q, k, v = (t.double() for t in qkv(B, Hq, Hkv, Sq, Sk, D))
    # (a random block mask of one block a head leaves nothing visible once in 25 draws: drawn
    # again then, so that the transforms' tangents and gradients are not zero by construction)
    for _ in range(100):
        kw = pattern_kwargs(name, B, Hq, Sq, Sk)
        if reference.attention(q, k, v, return_lse=True, **kw)[1].isfinite().any():
            break
    return q, k, v, kw


@pytest.mark.parametrize("name", TRANSFORM_PATTERNS)
def test_forward_mode_ad(name):
    """torch.func.jvp and torch.autograd.forward_ad give the reference's tangents (output and LSE)."""
    import torch.autograd.forward_ad as fwad

    q, k, v, kw = small_case(name)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))

    def ours(q, k, v):
        return opforge.attention(q, k, v, return_lse=True, **kw)

    def ref(q, k, v):
        out, lse = reference.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    (_, lse), (t_out, t_lse) = torch.func.jvp(ours, (q, k, v), tangents)
    _, (w_out, w_lse) = torch.func.jvp(ref, (q, k, v), tangents)
    assert t_out.abs().max() > 0  # a tangent, not zeros
    seen = lse.isfinite()  # (the reference's tangent is NaN on rows that see nothing; ours 0)
    torch.testing.assert_close(t_out[seen], w_out[seen], atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(t_lse[seen], w_lse[seen], atol=1e-9, rtol=1e-7)
    assert (t_out[~seen] == 0).all() and (t_lse[~seen] == 0).all()
    with fwad.dual_level():
        duals = [fwad.make_dual(t, d) for t, d in zip((q, k, v), tangents, strict=True)]
        tangent = fwad.unpack_dual(opforge.attention(*duals, **kw)).tangent
    torch.testing.assert_close(tangent[seen], w_out[seen], atol=1e-9, rtol=1e-7)


def test_forward_mode_ad_one_operand_and_float32():
    """A tangent for v alone (the others None), and float32 inputs (tangents in float32)."""
    q, k, v = qkv(2, 4, 2, 20, 30, 8)
    dv = torch.randn_like(v)
    _, t = torch.func.jvp(lambda v: opforge.attention(q, k, v, causal=True), (v,), (dv,))
    _, w = torch.func.jvp(
        lambda v: reference.attention(q.double(), k.double(), v, causal=True), (v.double(),), (dv.double(),)
    )
    assert t.dtype == torch.float32
    assert (t.double() - w).abs().max() < 1e-5


@pytest.mark.parametrize("name", TRANSFORM_PATTERNS)
def test_func_grad_vjp_jacrev_jacfwd(name):
    q, k, v, kw = small_case(name, Sq=5, Sk=6, D=3)
    w = torch.randn(1, 2, 5, 3, dtype=torch.float64)

    def loss(f):
        return lambda q, k, v: (f(q, k, v, **kw) * w).sum()

    got = torch.func.grad(loss(opforge.attention), argnums=(0, 1, 2))(q, k, v)
    want = torch.func.grad(loss(reference.attention), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    _, pull = torch.func.vjp(lambda q, k, v: opforge.attention(q, k, v, **kw), q, k, v)
    _, ref_pull = torch.func.vjp(lambda q, k, v: reference.attention(q, k, v, **kw), q, k, v)
    for a, b in zip(pull(w), ref_pull(w), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        got = jac(lambda k: opforge.attention(q, k, v, **kw))(k)
        want = jac(lambda k: reference.attention(q, k, v, **kw))(k)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_vmap():
    """vmap over q alone, and over q, k, v with segments and a block mask (the mapped dimension joins
    the batch); in_dims other than 0."""
    qs, ks, vs = (torch.randn(3, *t.shape) for t in qkv(2, 4, 2, 30, 40, 8))
    seg = random_segments(2, 40)
    mask = random_block_mask(2, 4, 30, 40)
    for kw in (dict(causal=True), dict(segment_ids=seg, mask=mask, softcap=2.0)):
        got = torch.func.vmap(partial(opforge.attention, **kw))(qs, ks, vs)
        want = torch.stack([reference.attention(qs[i], ks[i], vs[i], **kw) for i in range(3)])
        assert (got - want).abs().max() < 2e-5
    got = torch.func.vmap(lambda q: opforge.attention(q, ks[0], vs[0], causal=True), in_dims=2)(
        qs.movedim(0, 2)
    )
    want = torch.stack([reference.attention(qs[i], ks[0], vs[0], causal=True) for i in range(3)])
    assert (got - want).abs().max() < 2e-5


@pytest.mark.parametrize("name", ["causal", "prefix", "documents", "block mask", "softcap"])
def test_gradgradcheck(name):
    q, k, v, kw = small_case(name, Sq=5, Sk=7, D=3)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def f(q, k, v):
        out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradgradcheck(f, (q, k, v))


def test_double_backward_matches_reference():
    """A gradient penalty: d/dk of |d out/dq . g|^2 equals the reference's, float32 inputs (the dense
    recomputation in float32) and fully masked rows (no NaN)."""
    B, H, S, D = 1, 2, 70, 16
    dense = torch.rand(B, H, S, S) < 0.3
    dense[:, :, 5] = False
    mask = BlockMask.from_dense(dense, block_size=64)
    q, k, v = (t.requires_grad_() for t in qkv(B, H, H, S, S, D))
    g = torch.randn(B, H, S, D)

    def penalty(f, q, k, v):
        (dq,) = torch.autograd.grad(f(q, k, v, mask=mask), q, g, create_graph=True)
        return torch.autograd.grad(dq.pow(2).sum(), (k, v))

    got = penalty(opforge.attention, q, k, v)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = penalty(reference.attention, qd, kd, vd)
    for a, b in zip(got, want, strict=True):
        assert a.isfinite().all()
        assert (a.double() - b).abs().max() <= 1e-4 * max(1.0, b.abs().max().item())


def test_backward_op_alone_is_not_differentiable():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 6, 6, 4))
    out, lse = torch.ops.opforge.attention.default(
        q, k, v, 0.5, 0.0, False, -1, -1, 0, *(None,) * 5, 128, 128
    )
    dq, _, _ = torch.ops.opforge.attention_backward.default(
        torch.ones_like(out), q, k, v, out.detach(), lse.detach(), None, 0.5, 0.0, *NO_PATTERN
    )
    with pytest.raises(
        RuntimeError, match=r"opforge.attention_backward is not differentiable when called directly"
    ):
        dq.sum().backward()


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(scale=1e39), r"scale = 1e\+39 is outside the range of the float32 arithmetic"),
        (dict(scale=1e-40), r"scale = 1e-40 is outside"),
        (dict(softcap=1e39), r"softcap = 1e\+39 is outside"),
        (dict(softcap=1e-46), r"softcap = 1e-46 is outside"),
        (dict(softcap=1e38), r"1 / \(softcap \* log2\(e\)\) = 6.93.*e-39 is outside"),
        (dict(scale=1e30, softcap=1e-10), r"scale / softcap = 1e\+40 is outside"),
    ],
)
def test_numbers_beyond_float32(kw, msg):
    """Scales and softcaps the float32 kernels cannot hold are refused (they gave zeros with an LSE
    of -inf, or a softcap silently dropped); float64 inputs compute in double and take them."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = qkv(1, 2, 2, 8, 8, 4, dtype=dtype)
        with pytest.raises(ValueError, match=r"opforge.attention: " + msg):
            opforge.attention(q, k, v, **kw)
    q, k, v = (t.double() for t in qkv(1, 2, 2, 8, 8, 4))
    torch.testing.assert_close(opforge.attention(q, k, v, **kw), reference.attention(q, k, v, **kw))


def test_small_and_large_numbers_in_range():
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    for kw in (dict(scale=0.0), dict(scale=1e-30), dict(softcap=1e-30, scale=1e-20), dict(softcap=1e30)):
        want = reference.attention(q.double(), k.double(), v.double(), **kw)
        assert (opforge.attention(q, k, v, **kw).double() - want).abs().max() < 1e-5, kw


def test_prefix_alone_is_prefix_lm():
    """prefix_len without causal or a window: prefix-LM (bidirectional over the prefix, causal after),
    never full attention; the raw op refuses a prefix with no band."""
    q, k, v = qkv(1, 2, 2, 40, 40, 8)
    got = opforge.attention(q, k, v, prefix_len=10)
    assert torch.equal(got, opforge.attention(q, k, v, prefix_len=10, causal=True))
    want = reference.attention(q.double(), k.double(), v.double(), prefix_len=10)
    assert (got.double() - want).abs().max() < 2e-5
    assert (got - opforge.attention(q, k, v)).abs().max() > 1e-3
    visible = attention_mask(1, 1, 40, 40, prefix_len=10)[0, 0]
    assert visible[0, :10].all() and not visible[0, 10:].any() and visible[20, :21].all()
    # With a window the prefix adds to it (no causal implied)
    got = opforge.attention(q, k, v, prefix_len=5, window=(3, 3))
    want = reference.attention(q.double(), k.double(), v.double(), prefix_len=5, window=(3, 3))
    assert (got.double() - want).abs().max() < 2e-5
    raw = torch.ops.opforge.attention.default
    with pytest.raises(ValueError, match=r"prefix_len \(10\) without causal or a window would see every key"):
        raw(q, k, v, 0.25, 0.0, False, -1, -1, 10, *(None,) * 5, 128, 128)


def test_block_mask_device_copy_is_kept():
    """A mask used on another device is copied there once and the copy kept on the mask."""
    m = block_mask(lambda b, h, qi, kv: kv <= qi, None, None, 100, 100, block_size=64)
    first = m.tensors_on(torch.device("meta"))
    assert all(t.device.type == "meta" for t in first)
    assert all(a is b for a, b in zip(first, m.tensors_on("meta"), strict=True))
    assert all(a is b for a, b in zip(m.tensors_on("cpu"), (m.kinds, m.index, m.bits), strict=True))


def test_block_mask_fn_shape_and_empty_fraction():
    with pytest.raises(
        ValueError,
        match=r"opforge.block_mask: fn must return a bool tensor that broadcasts to "
        r"\(B, H, rows, Sk\) = \(1, 2, 10, 12\).*got shape \(3, 12\)",
    ):
        block_mask(lambda b, h, qi, kv: torch.ones(3, 12, dtype=torch.bool), 1, 2, 10, 12)
    assert block_mask(lambda b, h, qi, kv: qi >= kv, 1, 1, 0, 10).visible_fraction() == 0.0
    assert block_mask(lambda b, h, qi, kv: qi >= kv, 1, 1, 10, 0).visible_fraction() == 0.0
    half = block_mask(lambda b, h, qi, kv: kv < 5, 1, 1, 10, 10).visible_fraction()
    assert half == 0.5


def ran(fn, prefix="opforge.attention"):
    """The names of opforge's kernel scopes a call ran (profiler events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith(prefix + ".")}


def test_variants_cpu():
    """variant= names the kernel; "auto" follows the rule (decode for few rows against many keys);
    the profiler shows which kernel ran; a named kernel gives the same numbers."""
    q, k, v = qkv(2, 8, 2, 1, 700, 16)  # 4 rows a kv head, 700 keys: auto decodes
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert ran(lambda: opforge.attention(q, k, v, causal=True)) == {"opforge.attention.decode"}
    assert ran(lambda: opforge.attention(q, k, v, causal=True, variant="tiled")) == {
        "opforge.attention.tiled"
    }
    for variant in ("auto", "tiled", "decode"):
        assert (opforge.attention(q, k, v, causal=True, variant=variant).double() - want).abs().max() < 2e-5
    q2, k2, v2 = qkv(1, 2, 2, 50, 60, 16)  # 50 rows: auto tiles, decode takes up to 32
    assert ran(lambda: opforge.attention(q2, k2, v2)) == {"opforge.attention.tiled"}
    assert ran(lambda: opforge.attention(q2[:, :, :3], k2, v2, variant="decode")) == {
        "opforge.attention.decode"
    }
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 700, 16) == "decode"
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 100, 16) == "tiled"
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 100, 16, kv_lens=True) == "decode"
    # The backward after a decode forward runs the tiled backward
    qg = q.clone().requires_grad_()
    out = opforge.attention(qg, k, v, causal=True, variant="decode")
    assert ran(lambda: out.sum().backward(), "opforge.attention_backward") == {
        "opforge.attention_backward.tiled"
    }


def test_deterministic_argument():
    """deterministic= (None, True, False) reaches the backward through every path (the op's
    autograd, the torch.func Function, double backward); the CPU backward is deterministic in every
    mode; anything but a bool or None is refused."""
    q, k, v = qkv(1, 4, 2, 40, 70, 16)
    go = torch.randn_like(q)
    got = []
    for det in (None, True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        got.append(
            torch.autograd.grad(opforge.attention(*leaves, causal=True, deterministic=det), leaves, go)
        )
        grad_q = torch.func.grad(
            lambda x, d=det: (opforge.attention(x, k, v, causal=True, deterministic=d) * go).sum()
        )
        assert torch.equal(grad_q(q), got[-1][0])
    for a in got[1:]:
        for x, y in zip(got[0], a, strict=True):
            assert torch.equal(x, y)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    first = torch.autograd.grad(
        opforge.attention(*leaves, causal=True, deterministic=True), leaves, go, create_graph=True
    )
    assert first[0].requires_grad
    pattern = (True, -1, -1, 0, None, None, None, None, None, 128, 128)  # causal .. block_k
    out, lse = torch.ops.opforge.attention.default(q, k, v, 0.25, 0.0, *pattern, deterministic=True)
    raw_backward = torch.ops.opforge.attention_backward.default
    dq, _, _ = raw_backward(go, q, k, v, out, lse, None, 0.25, 0.0, *pattern, deterministic=False)
    assert dq.shape == q.shape
    for bad in (1, "yes", torch.tensor(True)):
        with pytest.raises(TypeError, match=r"opforge.attention: deterministic must be a bool or None, got"):
            opforge.attention(q, k, v, deterministic=bad)


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


# ---- packed variable-length sequences (opforge.attention_varlen, cu_seqlens) --------------------

VARLEN_PATTERNS = {
    "full": {},
    "causal": dict(causal=True),
    "sliding": dict(causal=True, window=(9, 0)),
    "window both sides": dict(window=(5, 3)),
    "softcap": dict(causal=True, softcap=3.0),
}
# Per-sequence (queries, keys): Sq != Sk both ways, empty on either side and on both, one token,
# sequences of more than one query tile (96) and key tile (128).
VARLEN_LENGTHS = [(5, 9), (0, 4), (130, 100), (7, 0), (1, 1), (0, 0), (150, 270), (3, 3)]


def cu_seqlens(lengths, dtype=torch.int32):
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=dtype)


def varlen_case(lengths, Hq, Hkv, D, dtype=torch.float32, index_dtype=torch.int32):
    """Packed q (total_q, Hq, D), k and v (total_k, Hkv, D) and their offsets."""
    lq, lk = [n for n, _ in lengths], [n for _, n in lengths]
    q = torch.randn(sum(lq), Hq, D, dtype=dtype)
    k = torch.randn(sum(lk), Hkv, D, dtype=dtype)
    v = torch.randn(sum(lk), Hkv, D, dtype=dtype)
    return q, k, v, cu_seqlens(lq, index_dtype), cu_seqlens(lk, index_dtype)


def poison_cpu_allocator(nbytes: int) -> None:
    """Leave NaN in memory the CPU allocator hands out next (glibc reuses a freed block of a similar
    size), so that an output element a kernel fails to write shows up as NaN instead of a lucky
    zero (in 32- and 16-bit dtypes; as float64 the pattern reads about 2e307, still not zero)."""
    blocks = [torch.full((max(nbytes, 4) // 4 + 64,), 0x7FC07FC0, dtype=torch.int32) for _ in range(3)]
    del blocks


def assert_varlen_rows(out, lse, lengths, cu_q):
    """Queries of sequences without keys: zeros and an LSE of -inf, exactly."""
    for b, (sq, sk) in enumerate(lengths):
        if sq and not sk:
            rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
            assert (out[rows] == 0).all() and (lse[:, rows] == -math.inf).all()


@pytest.mark.parametrize("heads", [(4, 2, 80), (3, 3, 13)], ids=["gqa d80", "d13"])
@pytest.mark.parametrize("name", list(VARLEN_PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_varlen_matches_reference(dtype, name, heads):
    """Forward (output, LSE) and backward (dq, dk, dv) against the float64 reference run one
    sequence at a time; outputs poisoned before the kernels write them."""
    Hq, Hkv, D = heads
    kw = VARLEN_PATTERNS[name]
    q, k, v, cu_q, cu_k = varlen_case(VARLEN_LENGTHS, Hq, Hkv, D, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    poison_cpu_allocator(q.numel() * q.element_size())
    out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = reference.attention_varlen(qd, kd, vd, cu_q, cu_k, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (Hq, q.shape[0]) and lse.dtype == (
        torch.float64 if dtype == torch.float64 else torch.float32
    )
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())
    assert_varlen_rows(out, lse, VARLEN_LENGTHS, cu_q)
    finite = want_lse.isfinite()
    lse_err = (lse.double() - want_lse)[finite].abs().max().item()
    go = torch.randn_like(out)
    poison_cpu_allocator(k.numel() * k.element_size())
    grads = torch.autograd.grad(out, (q, k, v), go)
    wants = torch.autograd.grad(want, (qd, kd, vd), go.double())
    for g in grads:
        assert not g.isnan().any()
    if dtype in TOL:
        assert (out.double() - want).abs().max().item() <= TOL[dtype] and lse_err <= TOL[dtype] * 10
        for g, w in zip(grads, wants, strict=True):
            assert (g.double() - w).abs().max().item() <= 10 * TOL[dtype] * max(1.0, w.abs().max().item())
    else:  # 16-bit: within 2x the error of PyTorch's own arithmetic in that dtype (the reference in bf16)
        ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
        low = reference.attention_varlen(ql, kl, vl, cu_q, cu_k, **kw)
        err, torch_err = errors(out, want, low)
        assert err <= 2 * torch_err + 1e-3, (err, torch_err)
        assert lse_err <= 1e-3 * max(1.0, want_lse[finite].abs().max().item())
        lows = torch.autograd.grad(low, (ql, kl, vl), go)
        for g, w, lg in zip(grads, wants, lows, strict=True):
            err, torch_err = errors(g, w, lg)
            assert err <= 2 * torch_err + 1e-3 * max(1.0, w.abs().max().item()), (err, torch_err)
    # Keys of sequences without queries get exactly zero gradients.
    for b, (sq, sk) in enumerate(VARLEN_LENGTHS):
        if sk and not sq:
            rows = slice(int(cu_k[b]), int(cu_k[b + 1]))
            assert (grads[1][rows] == 0).all() and (grads[2][rows] == 0).all()


def test_varlen_random_lengths():
    """Many sequences of random lengths (fresh every run; int64 offsets), sliding window, float32."""
    B = 12
    lengths = [(int(a), int(b)) for a, b in torch.randint(0, 160, (B, 2))]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 4, 1, 32, index_dtype=torch.int64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(causal=True, window=(40, 0))
    poison_cpu_allocator(q.numel() * 4)
    out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = reference.attention_varlen(qd, kd, vd, cu_q, cu_k, return_lse=True, **kw)
    assert (out.double() - want).abs().max() < 2e-5 and torch.equal(lse.isinf(), want_lse.isinf())
    assert_varlen_rows(out, lse, lengths, cu_q)
    go = torch.randn_like(out)
    poison_cpu_allocator(k.numel() * 4)
    for g, w in zip(
        torch.autograd.grad(out, (q, k, v), go),
        torch.autograd.grad(want, (qd, kd, vd), go.double()),
        strict=True,
    ):
        assert (g.double() - w).abs().max().item() <= 1e-4 * max(1.0, w.abs().max().item())


def test_varlen_one_sequence_is_attention():
    """One packed sequence is opforge.attention of the (1, H, S, D) view (Sq != Sk: the end of the
    keys); each sequence of several is opforge.attention of that sequence alone."""
    q, k, v, cu_q, cu_k = varlen_case([(70, 150)], 4, 2, 16)
    got = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True, window=(30, 5))
    view = [t.transpose(0, 1)[None] for t in (q, k, v)]
    want = opforge.attention(*view, causal=True, window=(30, 5))[0].transpose(0, 1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    lengths = [(40, 60), (100, 20), (17, 17)]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 2, 2, 24)
    got = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    for b in range(len(lengths)):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        alone = opforge.attention(
            q[rq].transpose(0, 1)[None], k[rk].transpose(0, 1)[None], v[rk].transpose(0, 1)[None], causal=True
        )
        torch.testing.assert_close(got[rq], alone[0].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_varlen_layouts_and_arguments():
    """Strided inputs (q, k, v as views of one packed (total, 3, H, D) tensor), int64 offsets,
    max_seqlen_* accepted and changing nothing, the LSE's layout (Hq, total_q), deterministic=."""
    lengths = [(30, 30), (0, 0), (50, 50), (9, 9)]
    total = sum(n for n, _ in lengths)
    qkv_packed = torch.randn(total, 3, 4, 16)
    q, k, v = qkv_packed.unbind(1)
    cu = cu_seqlens([n for n, _ in lengths])
    out, lse = opforge.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
    want, want_lse = reference.attention_varlen(
        q.double(), k.double(), v.double(), cu, cu, causal=True, return_lse=True
    )
    assert (out.double() - want).abs().max() < 2e-5
    assert lse.shape == (4, total) and lse.is_contiguous()
    assert (lse.double() - want_lse).abs().max() < 1e-4
    for kw in (dict(max_seqlen_q=50, max_seqlen_k=50), dict(max_seqlen_q=1, max_seqlen_k=0)):
        assert torch.equal(opforge.attention_varlen(q, k, v, cu.long(), cu.long(), causal=True, **kw), out)
    go = torch.randn_like(out)
    got = []
    for det in (None, True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = opforge.attention_varlen(*leaves, cu, cu, causal=True, deterministic=det)
        got.append(torch.autograd.grad(o, leaves, go))
    for a in got[1:]:
        for x, y in zip(got[0], a, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize(
    "kw", [dict(causal=True), dict(window=(2, 1), softcap=1.5)], ids=["causal", "window softcap"]
)
def test_varlen_gradcheck(kw):
    q, k, v, cu_q, cu_k = varlen_case([(3, 5), (0, 2), (4, 4), (2, 0), (2, 1)], 2, 1, 4, torch.float64)

    def f(q, k, v):
        out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in (q, k, v)))


def test_varlen_transforms():
    """torch.func.grad and jvp (forward mode) match the reference; vmap over q, k, v folds the mapped
    dimension into the heads; double backward (gradgradcheck); mapped offsets are refused."""
    lengths = [(3, 5), (0, 2), (4, 4), (2, 0)]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 2, 1, 3, torch.float64)
    kw = dict(causal=True, softcap=2.0)
    w = torch.randn_like(q)

    def loss(f):
        return lambda q, k, v: (f(q, k, v, cu_q, cu_k, **kw) * w).sum()

    got = torch.func.grad(loss(opforge.attention_varlen), argnums=(0, 1, 2))(q, k, v)
    want = torch.func.grad(loss(reference.attention_varlen), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    _, t_out = torch.func.jvp(
        lambda q, k, v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw), (q, k, v), tangents
    )
    _, w_out = torch.func.jvp(
        lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, **kw), (q, k, v), tangents
    )
    # (the last sequence has no keys: the reference's tangent is NaN there, ours 0)
    seen = torch.ones(q.shape[0], dtype=torch.bool)
    seen[int(cu_q[3]) : int(cu_q[4])] = False
    assert t_out.abs().max() > 0
    torch.testing.assert_close(t_out[seen], w_out[seen], atol=1e-9, rtol=1e-7)
    assert (t_out[~seen] == 0).all()
    qs, ks, vs = (torch.randn(3, *t.shape, dtype=torch.float64) for t in (q, k, v))
    mapped = torch.func.vmap(lambda q, k, v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw))(qs, ks, vs)
    loop = torch.stack([reference.attention_varlen(qs[i], ks[i], vs[i], cu_q, cu_k, **kw) for i in range(3)])
    torch.testing.assert_close(mapped, loop, atol=1e-10, rtol=1e-8)
    one_k = torch.func.vmap(lambda q: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw), in_dims=1)(
        qs.movedim(0, 1)
    )
    torch.testing.assert_close(
        one_k, torch.stack([reference.attention_varlen(qs[i], k, v, cu_q, cu_k, **kw) for i in range(3)])
    )
    jac = torch.func.jacrev(lambda v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw))(v)
    torch.testing.assert_close(
        jac, torch.func.jacrev(lambda v: reference.attention_varlen(q, k, v, cu_q, cu_k, **kw))(v)
    )

    def f(q, k, v):
        out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradgradcheck(f, tuple(t.clone().requires_grad_() for t in (q, k, v)))
    with pytest.raises(
        NotImplementedError, match=r"opforge.attention_varlen: vmap over cu_seqlens_q is not supported"
    ):
        torch.func.vmap(lambda c: opforge.attention_varlen(q, k, v, c, cu_k))(torch.stack([cu_q, cu_q]))


def test_varlen_torch_compile_fullgraph():
    q, k, v, cu_q, cu_k = varlen_case([(20, 30), (0, 5), (40, 40)], 4, 2, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def f(q, k, v, cu_q, cu_k):
        return opforge.attention_varlen(
            q, k, v, cu_q, cu_k, 40, 40, causal=True, window=(8, 0), return_lse=True
        )

    out, lse = torch.compile(f, fullgraph=True)(q, k, v, cu_q, cu_k)
    want, want_lse = f(q, k, v, cu_q, cu_k)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, want_lse)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    for a, b in zip(got, torch.autograd.grad(want, (q, k, v), go), strict=True):
        torch.testing.assert_close(a, b)


def test_varlen_opcheck():
    """torch.library.opcheck of the raw ops (forward and backward) with the offsets, on the (1, H,
    total, D) views of packed tensors."""
    q, k, v, cu_q, cu_k = varlen_case([(7, 11), (0, 3), (20, 9), (5, 0)], 4, 2, 16)
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2).requires_grad_() for t in (q, k, v))
    offsets = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for causal, left, right, softcap in ((True, -1, -1, 0.0), (False, 3, 2, 2.0)):
        args = (q4, k4, v4, 0.25, softcap, causal, left, right, 0, *(None,) * 5, 128, 128)
        torch.library.opcheck(torch.ops.opforge.attention.default, args, offsets)
    out, lse = torch.ops.opforge.attention.default(*args, **offsets)
    bwd = (torch.randn_like(out), q4.detach(), k4.detach(), v4.detach(), out.detach(), lse.detach(), None)
    torch.library.opcheck(
        torch.ops.opforge.attention_backward.default,
        (*bwd, 0.25, 2.0, False, 3, 2, 0, *(None,) * 5, 128, 128),
        offsets,
    )


VARLEN_ERRORS = [
    (
        "q 4-D",
        lambda a: a.update(q=a["q"][None]),
        ValueError,
        r"opforge.attention_varlen: q must be 3-D \(total tokens, heads, head_dim\), got 4-D",
    ),
    ("v 2-D", lambda a: a.update(v=a["v"][:, 0]), ValueError, r"opforge.attention_varlen: v must be 3-D"),
    (
        "cu float",
        lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].float()),
        TypeError,
        r"opforge.attention_varlen: cu_seqlens_q must be int32 or int64, got float32",
    ),
    (
        "cu 2-D",
        lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][None]),
        ValueError,
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
        ValueError,
        r"opforge.attention_varlen: cu_seqlens_q and cu_seqlens_k must have the same length "
        r"\(sequences \+ 1\), got 4 and 3",
    ),
    (
        "cu start",
        lambda a: a["cu_seqlens_q"].add_(1),
        ValueError,
        r"opforge.attention: cu_seqlens_q must start at 0, got 1",
    ),
    (
        "cu decreasing",
        lambda a: a["cu_seqlens_k"].copy_(torch.tensor([0, 9, 4, 20])),
        ValueError,
        r"opforge.attention: cu_seqlens_k must not decrease, got 9 then 4 at index 2",
    ),
    (
        "cu end",
        lambda a: a["cu_seqlens_q"][-1].sub_(1),
        ValueError,
        r"opforge.attention: cu_seqlens_q must end at the packed length 17 \(every row in one "
        r"sequence\), got 16",
    ),
    (
        "q dtype",
        lambda a: a.update(q=a["q"].int(), k=a["k"].int(), v=a["v"].int()),
        RuntimeError,
        r"q must be one of \(float16",
    ),
    ("k dtype", lambda a: a.update(k=a["k"].double()), RuntimeError, r"k must have the same dtype as q"),
    ("gqa ratio", lambda a: a.update(q=a["q"][:, :3]), ValueError, r"multiple of k's and v's heads"),
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
        r"opforge.attention_varlen: scale must be a finite number",
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
        r"opforge.attention: variant 'decode' does not take packed sequences \(cu_seqlens\); on the "
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
        ValueError,
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
