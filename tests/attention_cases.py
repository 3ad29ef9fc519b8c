"""Shared case builders of the attention tests (CPU and CUDA): patterns, shapes, random inputs,
segment ids and block masks, key counts and paged caches, packed sequences, tolerances. No test
module imports another; they all import this."""

from __future__ import annotations

import math

import torch

import opforge
from opforge import reference
from opforge.masks import block_mask

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


def opcheck_patterns(q, k, v, seg, mask, scale):
    """torch.library.opcheck of the forward op under a band, a prefix + window, and segments with a
    block mask and a softcap (the CPU and CUDA tests share it)."""
    for kw in (
        dict(causal=True),
        dict(window=(3, 5), prefix_len=4),
        dict(segment_ids=seg, mask=mask, softcap=2.0),
    ):
        args = opforge.ops.attention.checks.pattern_args(
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
    vc = torch.full((pages, page_size, Hkv, v.shape[-1]), float("nan"), dtype=v.dtype, device=v.device)
    for b in range(B):
        for j in range(P):
            lo, hi = j * page_size, min(Sk, (j + 1) * page_size)
            if lo < hi:
                kc[table[b, j], : hi - lo] = k[b, :, lo:hi].transpose(0, 1)
                vc[table[b, j], : hi - lo] = v[b, :, lo:hi].transpose(0, 1)
        used = (int(lens[b]) + page_size - 1) // page_size
        table[b, used:] = torch.tensor([-7, pages + 5])[torch.arange(P - used) % 2]
    return kc, vc, table.to(torch.int32).to(k.device)


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


def ran(fn, prefix="opforge.attention"):
    """The names of opforge's kernel scopes a call ran (profiler events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith(prefix + ".")}


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


def fp8_op(q, k, v, causal=False):
    """torch.ops.opforge.attention_fp8 itself (no descales, scale 0.1, no softcap, no pattern but
    `causal`), for the tests of what the registered op checks."""
    no_pattern = (-1, -1, 0, None, None, None, None, None, 128, 128)
    return torch.ops.opforge.attention_fp8(q, k, v, None, None, None, 0.1, 0.0, causal, *no_pattern)
