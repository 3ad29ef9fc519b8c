"""opforge.masks' block masks: BlockMask.from_dense and opforge.block_mask give the blocks of the
previous, whole-mask algorithm (reference_blocks below) bit for bit, from_dense's peak memory
(measured in a subprocess), and the meta device refused with the op's words; block masks with
opforge.attention: round trips, the built-in patterns as block masks, no compilation per mask,
errors, device copies."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from attention_cases import qkv

import opforge
from opforge import masks
from opforge.masks import BlockMask, block_mask


def reference_blocks(mask: torch.Tensor, bq: int, bk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kinds, index, bits of a (B, H, Sq, Sk) bool mask as the previous from_dense computed them, the
    whole mask at once: padding beyond Sq / Sk counts as visible for "full" and as hidden for the
    bits, partial blocks numbered row-major over (b, h, block row, block column), bit c % 32 of word
    c // 32 of a block row is its element c."""
    B, H, sq, sk = mask.shape
    nq, nk = -(-sq // bq), -(-sk // bk)
    pad = (0, nk * bk - sk, 0, nq * bq - sq)
    hidden = torch.nn.functional.pad(mask, pad, value=False)
    visible = torch.nn.functional.pad(mask, pad, value=True)
    blocks = hidden.reshape(B, H, nq, bq, nk, bk).transpose(3, 4)  # (B, H, nq, nk, bq, bk)
    full = visible.reshape(B, H, nq, bq, nk, bk).transpose(3, 4).flatten(-2).all(-1)
    some = blocks.flatten(-2).any(-1)
    kinds = torch.where(full, 1, torch.where(some, 2, 0)).to(torch.uint8)
    partial = kinds == 2
    index = torch.full(kinds.shape, -1, dtype=torch.int32)
    n = int(partial.sum())
    index[partial] = torch.arange(n, dtype=torch.int32)
    sel = blocks[partial].reshape(n, bq, bk // 32, 32).long()
    words = (sel << torch.arange(32)).sum(-1)
    bits = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return kinds, index, bits


def assert_blocks(m: BlockMask, want: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    for name, got, ref in zip(("kinds", "index", "bits"), (m.kinds, m.index, m.bits), want, strict=True):
        assert got.dtype == ref.dtype and got.shape == ref.shape, (name, got.shape, ref.shape)
        assert torch.equal(got, ref), name


def random_mask(shape: tuple[int, ...], density: float, gen: torch.Generator) -> torch.Tensor:
    """Random elements, plus a visible top-left corner and a hidden band so that full and empty
    blocks occur next to partial ones."""
    m = torch.rand(shape, generator=gen) < density
    sq, sk = shape[-2:]
    m[..., : sq // 2, : sk // 3] = True
    m[..., sq // 2 : sq // 2 + 70, :] = False
    return m


SHAPES = [
    (1, 1, 1, 1),
    (2, 3, 130, 200),
    (1, 2, 64, 64),
    (3, 1, 257, 63),
    (2, 2, 129, 1000),
    (1, 2, 700, 500),
    (1, 1, 5, 0),
    (1, 1, 0, 7),
]


@pytest.mark.parametrize("block_size", [64, (128, 64), (64, 192)], ids=str)
@pytest.mark.parametrize("piece", [masks._PIECE_ELEMS, 100_000, 1], ids=["whole", "block rows", "one row"])
def test_from_dense_as_the_previous_algorithm(monkeypatch, block_size, piece):
    """Identical kinds, index and bits on masks of odd sizes, whatever the pieces the mask is read
    in (all heads or some of one batch row at a time, a few block rows of one head, one block row),
    and to_dense gives the mask back."""
    monkeypatch.setattr(masks, "_PIECE_ELEMS", piece)
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
    gen = torch.Generator().manual_seed(1)
    for shape in SHAPES:
        for density in (0.0, 0.03, 0.5, 1.0):
            dense = random_mask(shape, density, gen)
            m = BlockMask.from_dense(dense, block_size)
            assert_blocks(m, reference_blocks(dense, bq, bk))
            assert torch.equal(m.to_dense(), dense)


def test_from_dense_layouts(monkeypatch):
    """Broadcast, expanded and strided masks: the same blocks as from their contiguous copies."""
    monkeypatch.setattr(masks, "_PIECE_ELEMS", 20000)
    gen = torch.Generator().manual_seed(2)
    base = random_mask((2, 300, 1400), 0.4, gen)
    cases = [
        base[0],  # (Sq, Sk): B and H broadcast
        base,  # (H, Sq, Sk)
        base[None].expand(3, 2, 300, 1400),  # expanded over B (stride 0)
        base.transpose(1, 2),  # transposed
        base[:, 1::2, ::3],  # strided rows and columns
        base[:, :, 5:1005],  # offset columns
    ]
    for dense in cases:
        m = BlockMask.from_dense(dense, 64)
        full = dense.reshape((1,) * (4 - dense.dim()) + tuple(dense.shape)).contiguous()
        assert m.shape == tuple(full.shape)
        assert_blocks(m, reference_blocks(full, 64, 64))


def test_block_mask_as_the_previous_algorithm():
    """block_mask evaluates fn a few block rows at a time: one evaluation (Sq small) numbers the
    partial blocks as the whole-mask algorithm; several give the same kinds and the same mask."""

    def fn(b, h, i, j):
        return ((i * 7 + j * 3 + b + h) % 5 == 0) | (j <= i - 100 * h)

    dense = fn(
        torch.arange(2)[:, None, None, None],
        torch.arange(3)[None, :, None, None],
        torch.arange(300)[None, None, :, None],
        torch.arange(517)[None, None, None, :],
    )
    assert_blocks(opforge.block_mask(fn, 2, 3, 300, 517, block_size=64), reference_blocks(dense, 64, 64))
    sq, sk = 130, 33000  # a block row of both heads is over 2^23 elements: one evaluation a block row
    dense = fn(
        torch.arange(1)[:, None, None, None],
        torch.arange(2)[None, :, None, None],
        torch.arange(sq)[None, None, :, None],
        torch.arange(sk)[None, None, None, :],
    )
    m = opforge.block_mask(fn, None, 2, sq, sk, block_size=128)
    kinds, _, bits = reference_blocks(dense, 128, 128)
    assert torch.equal(m.kinds, kinds) and m.bits.shape == bits.shape
    assert torch.equal(m.to_dense(), dense)


def test_pack_bits_torch_as_numpy():
    """The torch packing (the path of masks on a GPU) packs as numpy's packbits (the CPU's): element
    8 k + i in bit i of byte k, padded with False."""
    gen = torch.Generator().manual_seed(3)
    for shape, rows, cols in (((3, 5, 70), 8, 128), ((2, 64, 128), 64, 128), ((1, 1, 1), 2, 64)):
        m = torch.rand(shape, generator=gen) < 0.5
        packed = masks._pack_bits(m, rows, cols)
        assert torch.equal(masks._pack_bits_torch(m, rows, cols), packed)
        padded = torch.zeros(*shape[:-2], rows, cols, dtype=torch.bool)
        padded[..., : shape[-2], : shape[-1]] = m
        want = (padded.reshape(*shape[:-2], rows, cols // 8, 8).long() << torch.arange(8)).sum(-1)
        assert torch.equal(packed.long(), want)


_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from opforge.masks import BlockMask, block_mask

    def status(key):  # kB
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) * 1024

    torch.set_num_threads(1)
    shape = tuple(json.loads(sys.argv[1]))
    torch.manual_seed(0)
    # Random elements: every block partial, the most bits to keep. Made without a float temporary.
    mask = torch.randint(0, 2, shape, dtype=torch.uint8).view(torch.bool)
    try:  # the high-water mark set back to the resident size now (Linux 4.0 on)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:  # else the earlier peak (the imports') stays in it: the growth can only look larger
        reset = False
    before = status("VmRSS")
    m = BlockMask.from_dense(mask)
    growth = status("VmHWM") - before
    print(json.dumps({"growth": growth, "mask": mask.numel(), "partial": m.block_counts()["partial"],
                      "before": before, "reset": reset}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads the peak resident size from /proc/self/status")
def test_from_dense_peak_memory():
    """The process's peak resident memory while from_dense turns a 64 MiB mask into blocks grows by
    at most 3x the mask's bytes plus a small constant (it was 18x: whole-mask padded copies, and
    the partial blocks' elements as int64). The peak (VmHWM) is set back to the resident size just
    before the call, so the imports' own peak does not count."""
    shape = (1, 4, 2048, 8192)
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, json.dumps(shape)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["partial"] == 4 * 16 * 64
    assert r["growth"] <= 3 * r["mask"] + (32 << 20), (
        f"peak growth {r['growth'] / r['mask']:.2f}x the mask ({r})"
    )


def test_block_mask_on_meta_refused():
    """A block mask's contents (and the number of partial blocks, its bits' size) depend on fn's
    values: no meta mask, whether asked for or the default device."""

    def fn(b, h, i, j):
        return i >= j

    want = (
        r"opforge\.block_mask: device is meta.*cannot be built on the meta device; build it on the CPU "
        r"or the target device"
    )
    with pytest.raises(NotImplementedError, match=want):
        opforge.block_mask(fn, None, None, 6, 6, device="meta")
    with pytest.raises(
        NotImplementedError, match=r"opforge\.block_mask: device is meta \(the default device\)"
    ):
        with torch.device("meta"):
            opforge.block_mask(fn, None, None, 6, 6)
    with pytest.raises(NotImplementedError, match=r"opforge\.block_mask\.from_dense: mask is a meta tensor"):
        BlockMask.from_dense(torch.ones(6, 6, dtype=torch.bool, device="meta"))
    assert opforge.block_mask(fn, None, None, 6, 6, device="cpu").block_counts()["partial"] == 1


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


def test_block_mask_errors():
    with pytest.raises(TypeError, match=r"opforge.block_mask: fn must be callable"):
        block_mask(3, 1, 1, 10, 10)
    with pytest.raises(TypeError, match=r"fn must return a bool tensor"):
        block_mask(lambda b, h, q, kv: q - kv, 1, 1, 10, 10)
    with pytest.raises(ValueError, match=r"block_size must be a positive multiple of 64"):
        block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 10, 10, block_size=48)
    with pytest.raises(ValueError, match=r"Sq must be a non-negative int"):
        block_mask(lambda b, h, q, kv: q >= kv, 1, 1, -1, 10)
    # (a wrong Python type: TypeError, as the other ops' arguments)
    with pytest.raises(TypeError, match=r"opforge.block_mask: B must be a positive int or None, got float"):
        block_mask(lambda b, h, q, kv: q >= kv, 2.0, None, 10, 10)
    with pytest.raises(TypeError, match=r"opforge.block_mask: Sq must be a non-negative int, got str"):
        block_mask(lambda b, h, q, kv: q >= kv, None, None, "4", 10)
    with pytest.raises(TypeError, match=r"opforge.block_mask: block_size must be a positive multiple of 64"):
        block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 10, 10, block_size=64.0)
    with pytest.raises(TypeError, match=r"opforge.block_mask.from_dense: block_size must be"):
        BlockMask.from_dense(torch.ones(4, 4, dtype=torch.bool), block_size="128")
    with pytest.raises(TypeError, match=r"from_dense: mask must be a bool tensor"):
        BlockMask.from_dense(torch.ones(4, 4))


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


def test_from_dense_and_block_mask_take_transposed_views():
    """A mask given as a transposed (column-major) view, from from_dense or returned by block_mask's
    function, gives the blocks of the same values made contiguous."""
    causal = torch.ones(256, 256, dtype=torch.bool).tril()
    rand = torch.rand(1, 1, 128, 192).transpose(2, 3) < 0.5
    for m in (causal.mT, rand):
        got, want = BlockMask.from_dense(m), BlockMask.from_dense(m.contiguous())
        for a, b in zip((got.kinds, got.index, got.bits), (want.kinds, want.index, want.bits), strict=True):
            assert torch.equal(a, b)
    got = block_mask(
        lambda b, h, i, j: (i.reshape(-1)[None, :] >= j.reshape(-1)[:, None]).mT, None, None, 128, 128
    )
    want = block_mask(lambda b, h, i, j: i >= j, None, None, 128, 128)
    assert torch.equal(got.to_dense(), want.to_dense())
