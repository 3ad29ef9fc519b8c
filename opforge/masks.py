"""Attention patterns, one definition each: what `opforge.attention` lets query i see.

A query i of Sq sits at key position ``i + Sk - Sq`` (queries aligned to the end of the keys, as
FlashAttention does, so that a KV cache's new tokens see all the old ones). Key j is visible when

- ``segments``: the two tokens' segment ids are equal (packed documents), and
- ``j < prefix_len`` (the prefix is seen by every query), or the band allows it:
  ``causal``: ``j <= pos``; ``window=(left, right)``: ``pos - left <= j <= pos + right`` (None: that
  side unbounded); a prefix with neither causal nor a window is prefix-LM (causal after the
  prefix, `prefix_means_causal`), and
- a block mask (`BlockMask`, from any ``fn(b, h, q, kv) -> bool``), when given, allows it.

Packed variable-length sequences (``cu_seqlens``, `varlen_mask`) apply the causal / window part
to each sequence on its own, queries aligned to the end of their sequence's keys.

`pattern_mask` and `BlockMask.to_dense` are the reference's masks; the kernels evaluate the same
rules (csrc/attention/attention_params.h) tile by tile.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch

OP = "opforge.block_mask"


def prefix_means_causal(
    causal: bool, window: tuple[int | None, int | None] | None, prefix_len: int | None
) -> bool:
    """Whether the pattern is causal: as asked, or implied by a prefix alone. ``prefix_len`` (any
    value, 0 included: an empty prompt) with neither ``causal`` nor a bounded ``window`` is prefix-LM
    (bidirectional over the prefix, causal after it): a prefix adds keys to a band, and without one
    every key is visible already. ``prefix_len=None`` is no prefix."""
    no_band = window is None or tuple(window) == (None, None)
    return causal or (prefix_len is not None and no_band)


def pattern_mask(
    sq: int,
    sk: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    prefix_len: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(Sq, Sk) bool: the causal / window / prefix part of the pattern."""
    q = torch.arange(sq, device=device)[:, None] + (sk - sq)
    kv = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window if window is not None else (None, None)
    if prefix_means_causal(causal, window, prefix_len):
        right = 0
    reach = sq + sk  # a side this long sees every key: clamped so that int64 positions cannot overflow
    if right is not None:
        ok &= kv <= q + min(right, reach)
    if left is not None:
        ok &= kv >= q - min(left, reach)
    if prefix_len:
        ok |= kv < min(prefix_len, reach)
    return ok


def varlen_mask(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    device: torch.device | str | None = None,
    total_q: int | None = None,
    total_k: int | None = None,
) -> torch.Tensor:
    """(total_q, total_k) bool: what each query of packed variable-length sequences sees
    (opforge.attention_varlen). Sequence b holds queries ``[cu_seqlens_q[b], cu_seqlens_q[b + 1])``
    and keys ``[cu_seqlens_k[b], cu_seqlens_k[b + 1])``; a query sees keys of its own sequence only,
    as `pattern_mask` of that sequence's lengths allows (its queries at the end of its keys).
    total_q / total_k (default: the last offsets) may be larger: rows past the last offset belong
    to no sequence and see nothing."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    total_q = cu_q[-1] if total_q is None else total_q
    total_k = cu_k[-1] if total_k is None else total_k
    ok = torch.zeros(total_q, total_k, dtype=torch.bool, device=device)
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        ok[q0:q1, k0:k1] = pattern_mask(q1 - q0, k1 - k0, causal=causal, window=window, device=device)
    return ok


def segment_mask(q_segments: torch.Tensor, kv_segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, Sq, Sk) bool: tokens see tokens of their own segment."""
    return (q_segments[:, None, :, None] == kv_segments[:, None, None, :]).bool()


def split_segments(segment_ids, sq: int, sk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_segments (B, Sq), kv_segments (B, Sk)) from attention's ``segment_ids``: one (B, Sk) tensor
    (the queries take the ids of their positions among the keys, the last Sq) or a pair."""
    if isinstance(segment_ids, (tuple, list)):
        if len(segment_ids) != 2:
            raise ValueError(
                "opforge.attention: segment_ids must be a (batch, keys) tensor or a pair (q_segments, kv_segments)"
            )
        return segment_ids[0], segment_ids[1]
    if sq > sk:
        raise ValueError(
            "opforge.attention: one segment_ids tensor (batch, keys) gives the queries the ids of the last Sq "
            f"keys, which needs Sq <= Sk (got {sq} > {sk}): pass a pair (q_segments, kv_segments)"
        )
    return segment_ids[:, sk - sq :], segment_ids


def attention_mask(
    B: int,
    H: int,
    sq: int,
    sk: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    prefix_len: int | None = None,
    segment_ids=None,
    mask: BlockMask | None = None,
    kv_lens: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(B, H, Sq, Sk) bool: everything opforge.attention's arguments let each query see."""
    if kv_lens is None:
        ok = pattern_mask(sq, sk, causal=causal, window=window, prefix_len=prefix_len, device=device)
        ok = ok[None, None].expand(B, H, sq, sk)
    else:  # sequence b: its first kv_lens[b] keys, its queries at their end
        ok = torch.zeros(B, 1, sq, sk, dtype=torch.bool, device=device)
        for b, n in enumerate(kv_lens.clamp(0, sk).tolist()):
            ok[b, 0, :, :n] = pattern_mask(
                sq, n, causal=causal, window=window, prefix_len=prefix_len, device=device
            )
        ok = ok.expand(B, H, sq, sk)
    if segment_ids is not None:
        q_seg, kv_seg = split_segments(segment_ids, sq, sk)
        ok = ok & segment_mask(q_seg.to(device), kv_seg.to(device))
    if mask is not None:
        ok = ok & mask.to_dense().to(device)
    return ok.expand(B, H, sq, sk)


class BlockMask:
    """A mask in blocks of ``block_size`` (queries, keys): each block empty (skipped), full (no mask
    arithmetic) or partial (a bitmask of its elements). Made by `block_mask` (from a function) or
    `BlockMask.from_dense` (from a bool tensor); a new mask never compiles anything.

    Attributes: ``kinds`` uint8 (B, H, nQ, nK) (0 empty, 1 full, 2 partial; B and H may be 1:
    broadcast), ``index`` int32 (same shape: the partial block's row of ``bits``, or -1), ``bits``
    int32 (partial blocks, block_q, block_k / 32) (bit c % 32 of word c // 32), ``shape`` (B, H, Sq,
    Sk) and ``block_size``.
    """

    def __init__(
        self,
        kinds: torch.Tensor,
        index: torch.Tensor,
        bits: torch.Tensor,
        shape: tuple[int, int, int, int],
        block_size: tuple[int, int],
    ):
        self.kinds, self.index, self.bits = kinds, index, bits
        self.shape = tuple(int(s) for s in shape)
        self.block_size = (int(block_size[0]), int(block_size[1]))
        self._copies: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_dense(cls, mask: torch.Tensor, block_size: int | tuple[int, int] = 128) -> BlockMask:
        """From a bool tensor (B, H, Sq, Sk), (H, Sq, Sk) or (Sq, Sk) (missing dims: broadcast).
        The mask is read about 16 MiB at a time and packed to bits before it is classified, so the
        temporaries stay a small fraction of its size (plus the partial blocks' bits, at most 1/8 of
        it, held twice while they are joined)."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"{OP}.from_dense: mask must be a bool tensor, got {_describe(mask)}")
        if not 2 <= mask.dim() <= 4:
            raise ValueError(
                f"{OP}.from_dense: mask must be (B, H, Sq, Sk), (H, Sq, Sk) or (Sq, Sk), got {mask.dim()}-D"
            )
        if mask.device.type == "meta":
            raise NotImplementedError(
                f"{OP}.from_dense: mask is a meta tensor; a block mask's contents are computed from the "
                "mask's values, so it cannot be built from one without data"
            )
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        bq, bk = _block_size(block_size, f"{OP}.from_dense")
        B, H, sq, sk = mask.shape
        kinds, index, bits = _classify(_dense_pieces(mask, bq), (B, H), sq, sk, bq, bk, mask.device)
        return cls(kinds, index, bits, (B, H, sq, sk), (bq, bk))

    def to(self, device: torch.device | str) -> BlockMask:
        return BlockMask(
            self.kinds.to(device), self.index.to(device), self.bits.to(device), self.shape, self.block_size
        )

    @property
    def device(self) -> torch.device:
        return self.kinds.device

    def tensors_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kinds, index, bits) on ``device``: the mask's own tensors there, else a copy made the
        first time and kept on the mask (a mask built on the CPU and used with CUDA inputs is moved
        once, not at every call). Under torch.compile the copy is part of the graph instead."""
        device = torch.device(device)
        if device == self.kinds.device:
            return self.kinds, self.index, self.bits
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if torch.compiler.is_compiling():
            return self.kinds.to(device), self.index.to(device), self.bits.to(device)
        copy = self._copies.get(device)
        if copy is None:
            copy = self._copies[device] = (self.kinds.to(device), self.index.to(device), self.bits.to(device))
        return copy

    def visible_fraction(self) -> float:
        """The share of (query, key) pairs visible (of B x H x Sq x Sk); 0.0 when there are none
        (Sq or Sk = 0)."""
        if 0 in self.shape:
            return 0.0
        return float(self.to_dense().float().mean())

    def block_counts(self) -> dict[str, int]:
        """How many blocks are empty, full and partial."""
        counts = torch.bincount(self.kinds.flatten().long(), minlength=3).tolist()
        return {"empty": counts[0], "full": counts[1], "partial": counts[2]}

    def to_dense(self) -> torch.Tensor:
        """(B, H, Sq, Sk) bool, the mask this block mask stands for."""
        B, H, sq, sk = self.shape
        bq, bk = self.block_size
        nq, nk = self.kinds.shape[2:]
        kinds = self.kinds.long()
        dense = (kinds == 1)[..., None, None].expand(*kinds.shape, bq, bk).clone()
        partial = kinds == 2
        if partial.any():
            words = self.bits[self.index[partial].long()].long() & 0xFFFFFFFF  # (P, bq, bk/32)
            shifts = torch.arange(32, device=words.device)
            elems = ((words[..., None] >> shifts) & 1).bool().reshape(-1, bq, bk)
            dense[partial] = elems
        dense = dense.permute(0, 1, 2, 4, 3, 5).reshape(kinds.shape[0], kinds.shape[1], nq * bq, nk * bk)
        return dense[..., :sq, :sk].expand(B, H, sq, sk)

    def __repr__(self) -> str:
        c = self.block_counts()
        return (
            f"BlockMask(shape={self.shape}, block_size={self.block_size}, empty={c['empty']}, "
            f"full={c['full']}, partial={c['partial']}, device={self.device})"
        )


def block_mask(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    B: int | None,
    H: int | None,
    Sq: int,
    Sk: int,
    *,
    block_size: int | tuple[int, int] = 128,
    device: torch.device | str | None = None,
) -> BlockMask:
    """A `BlockMask` from ``fn(b, h, q, kv) -> bool``, evaluated once on index tensors that broadcast
    ((B, 1, 1, 1), (1, H, 1, 1), (1, 1, rows, 1), (1, 1, 1, Sk)), a few block rows at a time.
    ``B`` or ``H`` None: the mask is the same for every batch row / head (fn sees index 0).
    Nothing is compiled: a new fn costs its evaluation only. ``device``: where fn is evaluated and
    the mask's tensors live (None: the default device); not meta, since what the mask holds (which
    blocks are partial, so even the size of its bits) depends on fn's values."""
    if not callable(fn):
        raise TypeError(f"{OP}: fn must be callable, got {_describe(fn)}")
    for name, value, allow_none in (("B", B, True), ("H", H, True), ("Sq", Sq, False), ("Sk", Sk, False)):
        if value is None and allow_none:
            continue
        kind = f"a {'positive ' if allow_none else 'non-negative '}int{' or None' if allow_none else ''}"
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{OP}: {name} must be {kind}, got {_describe(value)}")
        if value < (1 if allow_none else 0):
            raise ValueError(f"{OP}: {name} must be {kind}, got {value!r}")
    bq, bk = _block_size(block_size)
    target = torch.empty(0, device=device).device  # None: the default device (torch.device context)
    if target.type == "meta":
        raise NotImplementedError(
            f"{OP}: device is meta{' (the default device)' if device is None else ''}; a block mask's "
            "contents are computed (which blocks are empty, full or partial, and so how many partial "
            "blocks its bits hold, depend on fn's values), so it cannot be built on the meta device; "
            "build it on the CPU or the target device"
        )
    Sq, Sk = int(Sq), int(Sk)
    nb, nh = int(B or 1), int(H or 1)
    b = torch.arange(nb, device=device)[:, None, None, None]
    h = torch.arange(nh, device=device)[None, :, None, None]
    kv = torch.arange(Sk, device=device)[None, None, None, :]
    # Block rows per evaluation: about 2^24 elements at a time.
    step = max(1, (1 << 24) // max(1, nb * nh * bq * Sk)) * bq

    def chunks():
        for r0 in range(0, max(Sq, 1) if Sq else 0, step):
            q = torch.arange(r0, min(Sq, r0 + step), device=device)[None, None, :, None]
            out = fn(b, h, q, kv)
            if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
                raise TypeError(f"{OP}: fn must return a bool tensor, got {_describe(out)}")
            want = (nb, nh, q.shape[2], Sk)
            try:
                out = torch.broadcast_to(out, want)
            except RuntimeError:
                raise ValueError(
                    f"{OP}: fn must return a bool tensor that broadcasts to (B, H, rows, Sk) = {want} "
                    f"(it is called with b {tuple(b.shape)}, h {tuple(h.shape)}, q {tuple(q.shape)} and "
                    f"kv {tuple(kv.shape)}), got shape {tuple(out.shape)}"
                ) from None
            yield slice(None), slice(None), r0 // bq, out

    kinds, index, bits = _classify(chunks(), (nb, nh), Sq, Sk, bq, bk, target)
    return BlockMask(kinds, index, bits, (nb, nh, Sq, Sk), (bq, bk))


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    return type(value).__name__


def _block_size(block_size, op: str = OP) -> tuple[int, int]:
    """block_size (an int or a pair of ints, positive multiples of 64) as (bq, bk); op: the caller's
    name in the messages (a wrong Python type: TypeError; a wrong value: ValueError)."""
    what = "block_size must be a positive multiple of 64 (or a pair of them)"
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(f"{op}: {what}, got {block_size!r}")
        pair = tuple(block_size)
    else:
        pair = (block_size, block_size)
    for v in pair:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{op}: {what}, got {block_size!r}")
        if v <= 0 or v % 64:
            raise ValueError(f"{op}: {what}, got {block_size!r}")
    return int(pair[0]), int(pair[1])


# Mask elements packed at a time by from_dense (16 MiB of bool): the packing's temporaries are a
# fraction of a piece this size, so they stay a bounded amount whatever the mask's size.
_PIECE_ELEMS = 1 << 24


def _dense_pieces(mask: torch.Tensor, bq: int) -> Iterator[tuple[slice, slice, int, torch.Tensor]]:
    """A (B, H, Sq, Sk) mask as views of about _PIECE_ELEMS elements each, in the order of the
    blocks (b, h, block row, block column) row-major: whole (Sq, Sk) planes of several heads of one
    batch row at a time, else block rows of one (b, h). Views only: nothing is copied (an expanded
    mask stays expanded)."""
    B, H, sq, sk = mask.shape
    plane = sq * sk
    if plane <= _PIECE_ELEMS:
        heads = max(1, _PIECE_ELEMS // max(1, plane))
        for b in range(B):
            for h0 in range(0, H, heads):
                h1 = min(H, h0 + heads)
                yield slice(b, b + 1), slice(h0, h1), 0, mask[b : b + 1, h0:h1]
        return
    rows = max(1, _PIECE_ELEMS // (bq * sk)) * bq
    for b in range(B):
        for h in range(H):
            for r0 in range(0, sq, rows):
                yield slice(b, b + 1), slice(h, h + 1), r0 // bq, mask[b : b + 1, h : h + 1, r0 : r0 + rows]


def _pack_bits(m: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """uint8 (..., rows, cols / 8): m's elements 8 to a byte (element 8k + i in bit i of byte k),
    m (..., r, c) padded with False to (rows, cols) (cols a multiple of 64). A plain CPU tensor by
    numpy's packbits (one pass, no temporaries beyond the result); anything else (a GPU tensor, one
    under torch.func's transforms or being traced, which has no storage numpy could read)
    `_pack_bits_torch`."""
    array = _as_numpy(m)
    if array is None:
        return _pack_bits_torch(m, rows, cols)
    # (C order: packbits keeps a transposed view's order, and the callers view the bytes as words)
    packed = torch.from_numpy(np.ascontiguousarray(np.packbits(array, axis=-1, bitorder="little")))
    r, c8 = packed.shape[-2:]
    if (r, c8) == (rows, cols // 8):
        return packed
    out = torch.zeros(*packed.shape[:-2], rows, cols // 8, dtype=torch.uint8)
    out[..., :r, :c8] = packed
    return out


def _as_numpy(m: torch.Tensor) -> np.ndarray | None:
    """m's elements as a numpy array sharing its storage, or None where m has none numpy can read:
    another device, a tensor wrapped by torch.func's transforms or a fake one under tracing."""
    if m.device.type != "cpu" or torch.compiler.is_compiling():  # (Dynamo cannot trace numpy)
        return None
    try:
        return m.numpy()
    except (RuntimeError, TypeError):
        return None


def _pack_bits_torch(m: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """`_pack_bits` with torch ops (any device, little-endian: every GPU): eight bools read as one
    int64 (element i in bit 8 i) gathered into its low byte by three shift-ors. Temporaries: two
    tensors of m's padded size."""
    buf = torch.zeros(*m.shape[:-2], rows, cols, dtype=torch.bool, device=m.device)
    buf[..., : m.shape[-2], : m.shape[-1]] = m
    x = buf.view(torch.int64)  # bytes 0 / 1, so x < 2^57 and the shifts stay non-negative
    s = x >> 7
    x |= s  # byte k: element k in bit 0, element k + 1 in bit 1
    torch.bitwise_right_shift(x, 14, out=s)
    x |= s  # bits 2-3: elements k + 2, k + 3
    torch.bitwise_right_shift(x, 28, out=s)
    x |= s  # bits 4-7: elements k + 4 .. k + 7; byte 0 holds elements 0-7
    x &= 0xFF
    return x.to(torch.uint8)


def _classify(
    pieces: Iterator[tuple[slice, slice, int, torch.Tensor]],
    bh: tuple[int, int],
    sq: int,
    sk: int,
    bq: int,
    bk: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kinds, index, bits of a mask given as pieces (b slice, h slice, first block row, (b, h, rows,
    Sk) bool) of whole block rows; partial blocks are numbered in the pieces' order, row-major within
    each. A piece is packed to bits (1/8 of its bytes) and its blocks classified on the packed words:
    the temporaries are about the piece's packed size, the bits of the partial blocks kept."""
    nq, nk = -(-sq // bq), -(-sk // bk)
    kinds: torch.Tensor | None = None
    index: torch.Tensor | None = None
    parts: list[torch.Tensor] = []
    count = 0
    shape = (bh[0], bh[1], nq, nk)
    # The columns beyond Sk, as set bits of the packed rows' int64 words (laid out as the rows are).
    beyond = torch.arange(max(nk, 1) * bk) >= sk
    col_pad = _pack_bits(beyond[None], 1, max(nk, 1) * bk).view(torch.int64).reshape(-1)
    for bs, hs, q0, m in pieces:
        if kinds is None or index is None:
            kinds = torch.empty(shape, dtype=torch.uint8, device=m.device)
            index = torch.empty(shape, dtype=torch.int32, device=m.device)
            col_pad = col_pad.to(m.device)
        g, rows = m.shape[0] * m.shape[1], m.shape[2]
        if g * rows * nk == 0:  # no block in it
            continue
        rq = -(-rows // bq)
        packed = _pack_bits(m, rq * bq, nk * bk).reshape(g, rq * bq, nk * bk // 8)
        # Per int64 word of the rows (64 elements): any element set, every element set (the columns
        # beyond Sk count as set, the rows beyond Sq as full); reduced over each block's rows first
        # (a contiguous inner dimension), then over its words.
        words = packed.view(torch.int64).reshape(g, rq, bq, nk * bk // 64)
        some = (words != 0).any(2).reshape(g, rq, nk, bk // 64).any(-1)
        set_ = (words | col_pad[: nk * bk // 64]) == -1
        set_.view(g, rq * bq, -1)[:, rows:] = True
        full = set_.all(2).reshape(g, rq, nk, bk // 64).all(-1)
        kind = torch.where(full, 1, torch.where(some, 2, 0)).to(torch.uint8)
        partial = kind == 2
        n = int(partial.sum())
        idx = torch.full(kind.shape, -1, dtype=torch.int32, device=kind.device)
        if n:
            idx[partial] = torch.arange(count, count + n, dtype=torch.int32, device=kind.device)
            blocks = packed.reshape(g, rq, bq, nk, bk // 8).transpose(2, 3)[partial]  # (n, bq, bk / 8)
            if sys.byteorder == "big" and blocks.device.type == "cpu":  # int32 words read little-endian
                blocks = blocks.reshape(n, bq, bk // 32, 4).flip(-1)
            parts.append(blocks.contiguous().view(torch.int32).reshape(n, bq, bk // 32))
            count += n
        sel = (bs, hs, slice(q0, q0 + rq))
        kinds[sel] = kind.reshape(m.shape[0], m.shape[1], rq, nk)
        index[sel] = idx.reshape(m.shape[0], m.shape[1], rq, nk)
    if kinds is None or index is None:  # no block (Sq, Sk, B or H zero)
        kinds = torch.zeros(shape, dtype=torch.uint8, device=device)
        index = torch.full(shape, -1, dtype=torch.int32, device=device)
    bits = (
        torch.cat(parts) if parts else torch.zeros((0, bq, bk // 32), dtype=torch.int32, device=kinds.device)
    )
    return kinds, index, bits
