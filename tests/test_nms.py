"""opforge.nms / batched_nms / nms_padded against torchvision and the reference."""

from __future__ import annotations

import decimal
import fractions
import math
import re

import numpy as np
import pytest
import torch
from conftest import DEVICES, HAS_CUDA

import opforge
from opforge import reference
from opforge.bench.nms import clustered_boxes, distinct, torchvision_ops, uniform_boxes

# torchvision is the peer: the oracle on tie-free inputs. Where it is missing or does not load
# beside this torch, the stable reference (equal to torchvision on tie-free inputs) stands in.
# For batched_nms the oracle is torchvision's per-class path: its public batched_nms offsets
# the boxes by class for small inputs, which rounds coordinates (docs/nms.md), and can then keep
# a different set than its own per-class answer, which opforge computes.
tv_ops = torchvision_ops()
needs_torchvision = pytest.mark.skipif(tv_ops is None, reason="torchvision is missing or does not load")


class _Oracle:
    nms = staticmethod(tv_ops.nms if tv_ops else reference.nms)
    batched_nms = staticmethod(tv_ops.boxes._batched_nms_vanilla if tv_ops else reference.batched_nms)


oracle = _Oracle()


def clear_of_threshold(boxes, threshold, margin=1e-4):
    """Indices of the boxes that have no IoU (float64) within margin of threshold with any other box.
    At such a pair two correct kernels may decide either way (their float32 IoUs, computed in
    different orders, fall on either side: a pair at 0.4999993 parted opforge's batched_nms from
    torchvision's in CI), so exact comparisons use boxes clear of it."""
    b = boxes.double()
    area = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(b[:, None, :2], b[None, :, :2])
    rb = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    iou = inter / (area[:, None] + area[None, :] - inter).clamp(min=1e-12)
    near = (iou - threshold).abs() < margin
    near.fill_diagonal_(False)
    return torch.nonzero(~near.any(1)).flatten()


def assert_same(got, want):
    assert got.dtype == torch.int64 and got.dim() == 1
    assert torch.equal(got.cpu(), want.cpu()), (
        f"kept {got.numel()} vs {want.numel()}: first diff at {_first_diff(got, want)}"
    )


def _first_diff(a, b):
    a, b = a.cpu(), b.cpu()
    n = min(a.numel(), b.numel())
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n


SIZES = [0, 1, 2, 17, 127, 1000, 4097]
THRESHOLDS = [0.0, 0.3, 0.5, 0.7, 1.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["uniform", "clustered"])
def test_nms_matches_torchvision(device, n, kind):
    make = uniform_boxes if kind == "uniform" else clustered_boxes
    boxes, scores = make(n)
    for thr in THRESHOLDS:
        want = oracle.nms(boxes, scores, thr)  # torchvision's CPU kernel: the exact IEEE formula
        assert_same(opforge.nms(boxes.to(device), scores.to(device), thr), want)
        if n <= 1000:
            assert_same(reference.nms(boxes, scores, thr), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 50, 3000])
@pytest.mark.parametrize("classes", [1, 3, 80, 1000])
def test_batched_nms_matches_torchvision(device, n, classes):
    boxes, scores = clustered_boxes(n)
    idxs = torch.randint(0, classes, (n,))
    for thr in [0.3, 0.5, 0.8]:
        want = oracle.batched_nms(boxes, scores, idxs, thr)
        assert_same(opforge.batched_nms(boxes.to(device), scores.to(device), idxs.to(device), thr), want)
    if n <= 50:
        assert_same(
            reference.batched_nms(boxes, scores, idxs, 0.5), oracle.batched_nms(boxes, scores, idxs, 0.5)
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_match_reference(device, dtype):
    for n in [33, 700]:
        boxes, scores = clustered_boxes(n, dtype=dtype)
        # 16-bit: IoU in float32 from the 16-bit coordinates (the reference does the same).
        assert_same(opforge.nms(boxes.to(device), scores.to(device), 0.5), reference.nms(boxes, scores, 0.5))
        idxs = torch.randint(0, 4, (n,))
        assert_same(
            opforge.batched_nms(boxes.to(device), scores.to(device), idxs.to(device), 0.5),
            reference.batched_nms(boxes, scores, idxs, 0.5),
        )
        if dtype == torch.float64:
            assert_same(opforge.nms(boxes.to(device), scores.to(device), 0.5), oracle.nms(boxes, scores, 0.5))


@pytest.mark.parametrize("device", DEVICES)
def test_threshold_boundary(device):
    # IoU of these two is exactly 0.5 (intersection 2, union 4): at the threshold, kept.
    boxes = torch.tensor([[0.0, 0.0, 3.0, 1.0], [1.0, 0.0, 4.0, 1.0]], device=device)
    scores = torch.tensor([0.9, 0.8], device=device)
    assert opforge.nms(boxes, scores, 0.5).tolist() == [0, 1]
    assert opforge.nms(boxes, scores, math.nextafter(0.5, 0)).tolist() == [0]
    assert oracle.nms(boxes.cpu(), scores.cpu(), 0.5).tolist() == [0, 1]
    # A threshold that float32 cannot represent: decided as in float64, like torchvision's CPU kernel.
    third = torch.tensor([[0.0, 0.0, 2.0, 1.0], [1.0, 0.0, 3.0, 1.0]], device=device)  # IoU = 1/3
    for thr in [1 / 3, math.nextafter(1 / 3, 0), math.nextafter(1 / 3, 1), 0.3333333, 0.33333334]:
        want = oracle.nms(third.cpu(), scores.cpu(), thr)
        assert_same(opforge.nms(third, scores, thr), want)


def _threshold_kinds(device):
    """iou_threshold values that torchvision accepts, by the float each one stands for."""
    return {
        0.75: [
            np.float32(0.75),
            np.float64(0.75),
            np.float16(0.75),
            np.array(0.75),
            torch.tensor(0.75),
            torch.tensor(0.75, dtype=torch.float64),
            torch.tensor(0.75, dtype=torch.bfloat16),
            torch.tensor([0.75]),
            torch.tensor([[0.75]], device=device),
            torch.tensor(0.75, requires_grad=True),
            fractions.Fraction(3, 4),
            decimal.Decimal("0.75"),
        ],
        0.0: [
            0,
            np.int64(0),
            np.int32(0),
            np.uint8(0),
            torch.tensor(0),
            False,
            np.False_,
            torch.tensor(False),
        ],
        1.0: [1, True, np.True_, np.int8(1), torch.tensor(True, device=device)],
        float(np.float32(0.9)): [np.float32(0.9), torch.tensor(0.9)],  # 0.8999999761581421
        2.0**70: [2**70],
    }


@pytest.mark.parametrize("device", DEVICES)
def test_iou_threshold_kinds(device):
    """Every number torchvision accepts as iou_threshold gives the answer of its Python float."""
    boxes, scores = clustered_boxes(300, device=device)
    idxs = torch.randint(0, 3, (300,), device=device)
    kinds = _threshold_kinds(device)
    # Sanity: the thresholds give different answers, so a wrong conversion shows.
    assert len({tuple(opforge.nms(boxes, scores, thr).tolist()) for thr in list(kinds)[:4]}) == 4
    for thr, values in kinds.items():
        want = opforge.nms(boxes, scores, thr)
        want_batched = opforge.batched_nms(boxes, scores, idxs, thr)
        for value in values:
            assert_same(opforge.nms(boxes, scores, value), want)
            assert_same(opforge.batched_nms(boxes, scores, idxs, value), want_batched)
            keep, num = opforge.nms_padded(boxes, scores, value, idxs)
            assert_same(keep[: num.item()], want_batched)
            if tv_ops is not None and not (isinstance(value, torch.Tensor) and value.requires_grad):
                assert_same(tv_ops.nms(boxes, scores, value), want)  # torchvision takes it too


def test_iou_threshold_rejected():
    b, s = uniform_boxes(10)
    idxs = torch.zeros(10, dtype=torch.int64)
    ops = {
        "opforge.nms": lambda thr: opforge.nms(b, s, thr),
        "opforge.batched_nms": lambda thr: opforge.batched_nms(b, s, idxs, thr),
        "opforge.nms_padded": lambda thr: opforge.nms_padded(b, s, thr, idxs),
    }
    rejected = {
        "str": "0.5",
        "NoneType": None,
        "list": [0.5],
        "str_": np.str_("0.5"),
        "ndarray": np.array([0.5]),  # one element, but 1-D (torchvision refuses it too)
        "complex": 0.5 + 0j,
        "complex64": np.complex64(0.5),  # torchvision drops the imaginary part, with a warning
        r"a complex64 tensor of shape \[\] on cpu": torch.tensor(0.5 + 0j),
        r"a float32 tensor of shape \[2\] on cpu": torch.tensor([0.5, 0.6]),
        r"a float32 tensor of shape \[\] on meta": torch.tensor(0.5, device="meta"),
    }
    for op, call in ops.items():
        name = re.escape(op)
        for got, value in rejected.items():
            with pytest.raises(
                TypeError,
                match=rf"^{name}: iou_threshold must be a real number \(int, float, a NumPy scalar or a "
                rf"one-element tensor\), got {got}$",
            ):
                call(value)
        with pytest.raises(
            OverflowError, match=rf"^{name}: iou_threshold is too large to convert to a float \(int\)$"
        ):
            call(10**400)
        for nan in (float("nan"), np.float32("nan"), torch.tensor(float("nan"))):
            with pytest.raises(ValueError, match=rf"{name}: iou_threshold must be a number, got nan"):
                call(nan)
    if tv_ops is not None:  # torchvision refuses these too
        for value in (
            "0.5",
            None,
            [0.5],
            np.str_("0.5"),
            np.array([0.5]),
            0.5 + 0j,
            torch.tensor([0.5, 0.6]),
            10**400,
        ):
            with pytest.raises(
                RuntimeError, match="Expected a value of type 'float' for argument 'iou_threshold'"
            ):
                tv_ops.nms(b, s, value)


@pytest.mark.cuda
def test_cuda_thresholds_at_pair_ious():
    """Thresholds equal to (and one float step around) IoUs that occur in the set: the CUDA kernel
    trusts its fast reciprocal only away from the threshold, so these must still match the CPU
    kernel's correctly rounded division exactly."""
    boxes, scores = clustered_boxes(300)
    b = boxes.double()
    lt = torch.maximum(b[:, None, :2], b[None, :, :2])
    rb = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = (wh[..., 0] * wh[..., 1]).float()
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).float()
    iou = inter / ((area[:, None] + area[None, :]) - inter)  # float32, op by op: the kernels' bits
    values = iou[(iou > 0.05) & (iou < 0.99)]
    picks = values[torch.randperm(values.numel())[:12]].double().tolist()
    for v in picks:
        for thr in (v, math.nextafter(v, 0), math.nextafter(v, 1)):
            assert_same(opforge.nms(boxes.cuda(), scores.cuda(), thr), opforge.nms(boxes, scores, thr))


@pytest.mark.parametrize("device", DEVICES)
def test_signed_zero_scores_tie(device):
    """-0.0 and +0.0 are equal scores: the lower index goes first, as in a stable torch.sort."""
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 60.0, 60.0]])
    for scores in ([0.0, -0.0, 0.5], [-0.0, 0.0, 0.5]):
        s = torch.tensor(scores)
        assert opforge.nms(boxes.to(device), s.to(device), 0.5).tolist() == [2, 0]
        # The same through torch.sort: 18k boxes, above the CUDA kernel's ranking sort (16k).
        # Disjoint boxes, all kept: the 0.5 scores first, then the zeros of either sign by index.
        big_boxes = boxes.repeat(6000, 1) + torch.arange(18000).repeat_interleave(4).view(-1, 4) * 100.0
        big_scores = s.repeat(6000)
        index = torch.arange(18000)
        want = torch.cat([index[big_scores == 0.5], index[big_scores == 0]])
        assert_same(opforge.nms(big_boxes.to(device), big_scores.to(device), 0.5), want)


@pytest.mark.parametrize("device", DEVICES)
def test_special_sets(device):
    # All suppressed: the same box 50 times; none suppressed: disjoint boxes.
    same = torch.tensor([[10.0, 10.0, 20.0, 20.0]]).repeat(50, 1)
    scores = torch.rand(50)
    assert opforge.nms(same.to(device), scores.to(device), 0.5).tolist() == [int(scores.argmax())]
    disjoint = torch.stack(
        [torch.arange(40.0) * 10, torch.zeros(40), torch.arange(40.0) * 10 + 5, torch.ones(40) * 5], 1
    )
    s = torch.rand(40)
    assert_same(opforge.nms(disjoint.to(device), s.to(device), 0.1), torch.sort(s, descending=True).indices)
    # Duplicates with distinct scores, and the empty and single-box cases.
    dup = torch.cat([disjoint, disjoint])
    s2 = torch.rand(80)
    assert_same(opforge.nms(dup.to(device), s2.to(device), 0.5), oracle.nms(dup, s2, 0.5))
    empty = opforge.nms(torch.empty(0, 4, device=device), torch.empty(0, device=device), 0.5)
    assert empty.shape == (0,) and empty.dtype == torch.int64 and empty.device.type == device
    assert opforge.nms(same[:1].to(device), scores[:1].to(device), 0.5).tolist() == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_dense_overlap_graphs(device):
    """Every pair overlapping (one big cluster) and a negative threshold (every pair suppresses):
    the worst cases for a sparse overlap graph; one box survives."""
    n = 5000
    boxes = torch.tensor([[100.0, 100.0, 200.0, 200.0]]) + torch.randn(n, 4) * 0.5
    scores = distinct(torch.rand(n, dtype=torch.float64)).float()
    assert_same(opforge.nms(boxes.to(device), scores.to(device), 0.3), oracle.nms(boxes, scores, 0.3))
    spread, s2 = uniform_boxes(3000)
    got = opforge.nms(spread.to(device), s2.to(device), -0.5)  # IoU 0 > -0.5: the top box removes all
    assert got.tolist() == [int(s2.argmax())]
    idxs = torch.randint(0, 3, (3000,))
    got = opforge.batched_nms(spread.to(device), s2.to(device), idxs.to(device), -0.5)
    want = torch.tensor([int(torch.nonzero(idxs == c).flatten()[s2[idxs == c].argmax()]) for c in range(3)])
    assert_same(got, want[torch.sort(s2[want], descending=True).indices])  # by decreasing score


@pytest.mark.parametrize("device", DEVICES)
def test_ties_take_lower_index_first(device):
    boxes, _ = clustered_boxes(600)
    scores = torch.randint(0, 5, (600,)).float() / 4  # many exact ties
    assert_same(opforge.nms(boxes.to(device), scores.to(device), 0.5), reference.nms(boxes, scores, 0.5))
    idxs = torch.randint(0, 3, (600,))
    assert_same(
        opforge.batched_nms(boxes.to(device), scores.to(device), idxs.to(device), 0.5),
        reference.batched_nms(boxes, scores, idxs, 0.5),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_and_degenerate_boxes(device):
    boxes, scores = clustered_boxes(300)
    boxes[5, 0] = float("nan")  # neither suppresses nor is suppressed
    boxes[7] = torch.tensor([50.0, 50.0, 40.0, 40.0])  # negative width and height
    boxes[9, 2] = boxes[9, 0]  # zero width
    boxes[11, 3] = float("inf")
    scores[13] = float("nan")  # sorts first, as in torch.sort
    scores[15] = float("inf")
    got = opforge.nms(boxes.to(device), scores.to(device), 0.5)
    assert_same(got, reference.nms(boxes, scores, 0.5))
    assert_same(got, oracle.nms(boxes, scores, 0.5))
    assert got[0].item() == 13 and 5 in got.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    boxes, scores = uniform_boxes(500)
    wide = torch.zeros(500, 8)
    wide[:, ::2] = boxes
    strided_scores = torch.stack([scores, scores], 1)[:, 0]
    assert_same(
        opforge.nms(wide[:, ::2].to(device), strided_scores.to(device), 0.5), oracle.nms(boxes, scores, 0.5)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_nms_padded(device):
    boxes, scores = clustered_boxes(2000)
    keep, num = opforge.nms_padded(boxes.to(device), scores.to(device), 0.5)
    assert keep.shape == (2000,) and num.shape == () and num.dtype == torch.int64
    want = oracle.nms(boxes, scores, 0.5)
    assert num.item() == want.numel()
    assert_same(keep[: num.item()], want)
    assert (keep[num.item() :] == -1).all()
    idxs = torch.randint(0, 10, (2000,))
    keep, num = opforge.nms_padded(boxes.to(device), scores.to(device), 0.5, idxs=idxs.to(device))
    assert_same(keep[: num.item()], oracle.batched_nms(boxes, scores, idxs, 0.5))
    keep, num = opforge.nms_padded(torch.empty(0, 4, device=device), torch.empty(0, device=device), 0.5)
    assert keep.shape == (0,) and num.item() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    boxes, scores = clustered_boxes(200, device=device)
    idxs = torch.randint(0, 5, (200,), device=device)
    tests = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.opforge.nms.default, (boxes, scores, 0.5), test_utils=tests)
    torch.library.opcheck(torch.ops.opforge.batched_nms.default, (boxes, scores, idxs, 0.5), test_utils=tests)
    torch.library.opcheck(torch.ops.opforge.nms_padded.default, (boxes, scores, 0.5, idxs))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_postprocess(device):
    """A detector's post-processing with a data-dependent number of boxes, compiled whole."""
    torch._dynamo.reset()

    def postprocess(boxes, scores, labels):
        keep = opforge.batched_nms(boxes, scores, labels, 0.5)
        return boxes[keep], scores[keep] * 2

    boxes, scores = clustered_boxes(500, device=device)
    labels = torch.randint(0, 4, (500,), device=device)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(postprocess, fullgraph=True)
        got_boxes, got_scores = compiled(boxes, scores, labels)
    want = oracle.batched_nms(boxes.cpu(), scores.cpu(), labels.cpu(), 0.5)
    assert torch.equal(got_boxes.cpu(), boxes.cpu()[want]) and torch.equal(
        got_scores.cpu(), scores.cpu()[want] * 2
    )

    def padded(boxes, scores):
        keep, num = opforge.nms_padded(boxes, scores, 0.5)
        return keep, num

    compiled = torch.compile(padded, fullgraph=True)
    keep, num = compiled(boxes, scores)
    assert_same(keep[: num.item()], oracle.nms(boxes.cpu(), scores.cpu(), 0.5))


# --- errors ---------------------------------------------------------------------------------


def test_errors():
    b, s = uniform_boxes(10)
    with pytest.raises(
        RuntimeError, match=r"opforge\.nms: boxes must be a 2-D tensor of shape \(N, 4\), got \[10, 5\]"
    ):
        opforge.nms(torch.zeros(10, 5), s, 0.5)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.nms: scores must be a 1-D tensor with one score per box \(N=10\), got \[9\]",
    ):
        opforge.nms(b, s[:9], 0.5)
    with pytest.raises(
        RuntimeError, match=r"opforge\.nms: scores must have the same dtype as boxes \(float32\), got float64"
    ):
        opforge.nms(b, s.double(), 0.5)
    with pytest.raises(RuntimeError, match=r"opforge\.nms: boxes must be one of .*got int64"):
        opforge.nms(b.long(), s.long(), 0.5)
    with pytest.raises(ValueError, match=r"opforge\.nms: iou_threshold must be a number, got nan"):
        opforge.nms(b, s, float("nan"))
    with pytest.raises(
        RuntimeError, match=r"opforge\.batched_nms: idxs must have an integer dtype, got float32"
    ):
        opforge.batched_nms(b, s, torch.zeros(10), 0.5)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.batched_nms: idxs must be a 1-D tensor with one class per box \(N=10\), got \[3\]",
    ):
        opforge.batched_nms(b, s, torch.zeros(3, dtype=torch.int64), 0.5)
    with pytest.raises(
        RuntimeError, match=r"opforge\.nms: scores must be on the same device as boxes \(cpu\), got meta"
    ):
        opforge.nms(b, s.to("meta"), 0.5)
    with pytest.raises(TypeError, match=r"opforge\.nms: boxes must be a torch\.Tensor, got list"):
        opforge.nms([[0, 0, 1, 1]], s, 0.5)
    with pytest.raises(
        TypeError, match=r"opforge\.nms_padded: iou_threshold must be a real number .*, got str"
    ):
        opforge.nms_padded(b, s, "0.5")


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (FakeTensorMode, meta tensors) raise the same
    type with the same words: RuntimeError for tensors that do not fit (as torchvision's nms
    raises for bad shapes), ValueError for a NaN threshold (torchvision keeps every box then)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, s = uniform_boxes(10)
    idxs = torch.zeros(10, dtype=torch.int64)
    cases = [
        (
            RuntimeError,
            (torch.zeros(10, 5), s, 0.5),
            r"opforge\.nms: boxes must be a 2-D tensor of shape \(N, 4\)",
        ),
        (RuntimeError, (b, s[:9], 0.5), r"opforge\.nms: scores must be a 1-D tensor with one score per box"),
        (ValueError, (b, s, float("nan")), r"opforge\.nms: iou_threshold must be a number, got nan"),
    ]
    raw = torch.ops.opforge.nms.default
    for err, (boxes, scores, thr), msg in cases:
        with pytest.raises(err, match=msg) as wrapper:
            opforge.nms(boxes, scores, thr)
        with pytest.raises(err) as real:
            raw(boxes, scores, thr)
        with FakeTensorMode() as mode, pytest.raises(err) as fake:
            raw(mode.from_tensor(boxes), mode.from_tensor(scores), thr)
        with pytest.raises(err) as meta:
            raw(boxes.to("meta"), scores.to("meta"), thr)
        assert str(wrapper.value) == str(real.value) == str(fake.value) == str(meta.value)
    # batched_nms and nms_padded: the idxs checks and the threshold, the same way.
    for err, args, msg in [
        (RuntimeError, (b, s, idxs[:3], 0.5), r"opforge\.batched_nms: idxs must be a 1-D tensor"),
        (RuntimeError, (b, s, idxs.float(), 0.5), r"opforge\.batched_nms: idxs must have an integer dtype"),
        (ValueError, (b, s, idxs, float("nan")), r"opforge\.batched_nms: iou_threshold must be a number"),
    ]:
        with pytest.raises(err, match=msg) as wrapper:
            opforge.batched_nms(*args)
        with FakeTensorMode() as mode, pytest.raises(err) as fake:
            torch.ops.opforge.batched_nms.default(*(mode.from_tensor(a) for a in args[:3]), args[3])
        assert str(wrapper.value) == str(fake.value)
    with pytest.raises(ValueError, match=r"opforge\.nms_padded: iou_threshold must be a number") as wrapper:
        opforge.nms_padded(b, s, float("nan"), idxs)
    with pytest.raises(ValueError) as meta:
        torch.ops.opforge.nms_padded.default(b.to("meta"), s.to("meta"), float("nan"), idxs.to("meta"))
    assert str(wrapper.value) == str(meta.value)


@needs_torchvision
def test_patched_torchvision_raises_its_types():
    """Through opforge.integrations.torchvision.patch, bad box shapes still raise RuntimeError, as
    torchvision's own nms does."""
    import opforge.integrations.torchvision as otv

    b, s = uniform_boxes(10)
    for bad in ((b[:, :3], s), (b, s[:9])):
        with pytest.raises(RuntimeError):
            tv_ops.nms(*bad, 0.5)
        with otv.patched(), pytest.raises(RuntimeError, match=r"opforge\.nms: "):
            tv_ops.nms(*bad, 0.5)
        with otv.patched(), pytest.raises(RuntimeError, match=r"opforge\.batched_nms: "):
            tv_ops.batched_nms(*bad, torch.zeros(10, dtype=torch.int64), 0.5)


def test_integer_idxs_dtypes():
    """Any integer dtype holds the classes: the same answer as int64 (boxes that overlap, so that
    misread classes would change it)."""
    boxes, scores = clustered_boxes(400)
    idxs = torch.randint(0, 5, (400,))
    want = oracle.batched_nms(boxes, scores, idxs, 0.5)
    # Sanity: the classes matter (one class, or a class per box, would give another answer).
    assert not torch.equal(want, oracle.nms(boxes, scores, 0.5)) and want.numel() < 400
    for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        assert_same(opforge.batched_nms(boxes, scores, idxs.to(dtype), 0.5), want)
        keep, num = opforge.nms_padded(boxes, scores, 0.5, idxs=idxs.to(dtype))
        assert_same(keep[: num.item()], want)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_none_nested_sparse(device):
    """None through the dispatcher, nested and sparse inputs: each op names itself and the argument."""
    b, s = uniform_boxes(10, device=device)
    idxs = torch.zeros(10, dtype=torch.int64, device=device)
    with pytest.raises(RuntimeError, match=r"opforge\.nms: scores must be a tensor, got None"):
        torch.ops.opforge.nms(b, None, 0.5)
    with pytest.raises(RuntimeError, match=r"opforge\.batched_nms: idxs must be a tensor, got None"):
        torch.ops.opforge.batched_nms(b, s, None, 0.5)
    nested = torch.nested.nested_tensor([b[:4], b[4:]])
    with pytest.raises(
        RuntimeError, match=r"opforge\.nms: boxes must be a dense \(strided\) tensor, got a nested"
    ):
        opforge.nms(nested, s, 0.5)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.batched_nms: boxes must be a dense \(strided\) tensor, got a tensor of layout Sparse",
    ):
        opforge.batched_nms(b.to_sparse(), s, idxs, 0.5)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.nms_padded: idxs must be a dense \(strided\) tensor, got a tensor of layout Sparse",
    ):
        opforge.nms_padded(b, s, 0.5, idxs=idxs.to_sparse())


@pytest.mark.cuda
def test_errors_cuda():
    b, s = uniform_boxes(10, device="cuda")
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.batched_nms: idxs must be on the same device as boxes \(cuda:0\), got cpu",
    ):
        opforge.batched_nms(b, s, torch.zeros(10, dtype=torch.int64), 0.5)


# --- CUDA: agreement with the CPU kernel, graphs, streams -----------------------------------


@pytest.mark.cuda
def test_cuda_matches_cpu_large():
    for make in (uniform_boxes, clustered_boxes):
        boxes, scores = make(20_000)
        assert_same(opforge.nms(boxes.cuda(), scores.cuda(), 0.5), opforge.nms(boxes, scores, 0.5))
        idxs = torch.randint(0, 80, (20_000,))
        assert_same(
            opforge.batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.6),
            opforge.batched_nms(boxes, scores, idxs, 0.6),
        )


@pytest.mark.cuda
@pytest.mark.parametrize("n", [3000, 6000])  # the single-kernel sort of small inputs, and torch.sort
@pytest.mark.parametrize("classes", [None, 20])
def test_cuda_graph_nms_padded(n, classes):
    boxes, scores = clustered_boxes(n, device="cuda")
    idxs = torch.randint(0, classes, (n,), device="cuda") if classes else None
    opforge.nms_padded(boxes, scores, 0.5, idxs=idxs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        keep, num = opforge.nms_padded(boxes, scores, 0.5, idxs=idxs)
    for _ in range(3):
        new_boxes, new_scores = clustered_boxes(n, device="cuda")
        boxes.copy_(new_boxes)
        scores.copy_(new_scores)
        g.replay()
        if classes:
            want = oracle.batched_nms(boxes.cpu(), scores.cpu(), idxs.cpu(), 0.5)
        else:
            want = oracle.nms(boxes.cpu(), scores.cpu(), 0.5)
        assert num.item() == want.numel()
        assert_same(keep[: want.numel()], want)
        assert (keep[want.numel() :] == -1).all()


@pytest.mark.cuda
def test_cuda_special_boxes_and_thresholds_large():
    """The CUDA kernel's x-overlap pre-test and fast reciprocal at scale: NaN (either sign),
    infinite and degenerate coordinates, touching boxes, the thresholds 0 and 1, and a negative
    threshold (no pre-test) must decide exactly as the CPU kernel."""
    boxes, scores = uniform_boxes(20_000)
    boxes[::97, 0] = float("nan")
    boxes[1::101, 0] = -float("nan")
    boxes[2::103, 2] = float("inf")
    boxes[3::107, 0] = -float("inf")
    boxes[4::109] = torch.tensor([50.0, 50.0, 40.0, 40.0])  # negative width and height
    boxes[5::113, 2] = boxes[5::113, 0]  # zero width
    boxes[6::127] = boxes[7::127]  # duplicates
    a = boxes[8::131][:150]
    width = a[:, 2] - a[:, 0]
    boxes[9::131][:150] = torch.stack([a[:, 2], a[:, 1], a[:, 2] + width, a[:, 3]], 1)  # touching in x
    scores[10::137] = float("nan")
    for thr in (0.0, 0.5, 1.0, -0.25):
        got = opforge.nms(boxes.cuda(), scores.cuda(), thr)
        assert_same(got, opforge.nms(boxes, scores, thr))


@pytest.mark.cuda
def test_cuda_many_random_sets():
    """Many fresh sets through the cooperative kernel (races would show as rare mismatches)."""
    for i in range(24):
        make = uniform_boxes if i % 2 else clustered_boxes
        n = (10_000, 20_000, 3_000)[i % 3]
        boxes, scores = make(n)
        idxs = torch.randint(0, 80, (n,))
        assert_same(opforge.nms(boxes.cuda(), scores.cuda(), 0.5), opforge.nms(boxes, scores, 0.5))
        assert_same(
            opforge.batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5),
            opforge.batched_nms(boxes, scores, idxs, 0.5),
        )


@pytest.mark.cuda
def test_cuda_non_default_stream():
    boxes, scores = clustered_boxes(4000, device="cuda")
    want = oracle.nms(boxes.cpu(), scores.cpu(), 0.5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        b2 = torch.empty_like(boxes)
        torch.cuda._sleep(20_000_000)
        b2.copy_(boxes)
        got = opforge.nms(b2, scores, 0.5)
    s.synchronize()
    assert_same(got, want)


@pytest.mark.skipif(not HAS_CUDA or tv_ops is None, reason="needs CUDA and torchvision")
def test_cuda_vs_torchvision_cuda():
    boxes, scores = uniform_boxes(5000, device="cuda")
    assert_same(opforge.nms(boxes, scores, 0.5), oracle.nms(boxes, scores, 0.5))


# --- drop-in for torchvision ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_batched_nms_many_classes_large_image(device):
    """1000 classes in a 1333-pixel image. torchvision's batched_nms offsets small inputs' boxes by
    class x (largest coordinate + 1), up to 1.3M here, where float32 steps are 1/8 px, and can
    keep another set than per class (docs/nms.md); opforge always computes per class."""
    n = 1000
    boxes, scores = clustered_boxes(n)
    boxes = boxes * (1333 / 1024)
    many = torch.randint(0, 1000, (n,))
    few = torch.randint(0, 1000, (8,))[torch.randint(0, 8, (n,))]  # 8 large class ids
    for idxs in (many, few):
        # Per class, IoU in float32 as the op computes it for float32 boxes, merged by score.
        want = reference.batched_nms(boxes, scores, idxs, 0.5)
        assert want.numel() < n  # sanity: boxes of one class suppress each other
        got = opforge.batched_nms(boxes.to(device), scores.to(device), idxs.to(device), 0.5)
        assert_same(got, want)
        if tv_ops is not None:
            assert_same(got, tv_ops.boxes._batched_nms_vanilla(boxes, scores, idxs, 0.5))


def _distinct_16bit(n, dtype, device):
    """n distinct positive 16-bit scores in random order: no ties, so one right answer."""
    first = 0x3800 if dtype == torch.bfloat16 else 0x1000  # 2**-15 in bfloat16, 2**-11 in float16
    return (torch.randperm(n, device=device) + first).to(torch.int16).view(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_float32_boxes_16bit_scores(device, dtype):
    """Under autocast a detector's boxes can be float32 and its scores 16-bit. The autocast kernels
    cast both to float32, as torchvision's do: the answer is the float32 one."""
    n = 1500
    boxes, _ = clustered_boxes(n, device=device)
    scores = _distinct_16bit(n, dtype, device)
    idxs = torch.randint(0, 5, (n,), device=device)
    want = opforge.nms(boxes, scores.float(), 0.5)
    want_batched = opforge.batched_nms(boxes, scores.float(), idxs, 0.5)
    assert want.numel() < n and not torch.equal(want, want_batched)  # sanity: suppression, classes
    with torch.autocast(device, dtype=dtype):
        assert_same(opforge.nms(boxes, scores, 0.5), want)
        assert_same(opforge.batched_nms(boxes, scores, idxs, 0.5), want_batched)
        keep, num = opforge.nms_padded(boxes, scores, 0.5)
        assert_same(keep[: num.item()], want)
        keep, num = opforge.nms_padded(boxes, scores, 0.5, idxs=idxs)
        assert_same(keep[: num.item()], want_batched)
        if tv_ops is not None:
            assert_same(tv_ops.nms(boxes, scores, 0.5), want)
            assert_same(oracle.batched_nms(boxes, scores, idxs, 0.5), want_batched)
    # Without autocast the same call is a dtype mismatch: the autocast kernels make it work.
    with pytest.raises(
        RuntimeError, match=r"opforge\.nms: scores must have the same dtype as boxes \(float32\)"
    ):
        opforge.nms(boxes, scores, 0.5)


@needs_torchvision
def test_torchvision_patch_float_idxs():
    """torchvision's batched_nms takes float (and bool) class ids, distinct values distinct
    classes; patched, it still does, with torchvision's answer."""
    import opforge.integrations.torchvision as otv

    for n in (600, 1500):  # torchvision on the CPU: the coordinate trick up to 1000 boxes, then per class
        boxes, scores = clustered_boxes(n)
        keep = clear_of_threshold(boxes, 0.5)
        boxes, scores = boxes[keep], scores[keep]
        classes = torch.randint(0, 4, (boxes.shape[0],))
        halves = classes.float() - 0.5  # -0.5 and 0.5 would be one class if cast to an integer
        cast = tv_ops.batched_nms(boxes, scores, halves.long(), 0.5)
        assert not torch.equal(tv_ops.batched_nms(boxes, scores, halves, 0.5), cast)  # sanity
        for idxs in (halves, classes.double() * 3 - 4, classes == 0):
            want = tv_ops.batched_nms(boxes, scores, idxs, 0.5)
            with otv.patched():
                assert_same(tv_ops.batched_nms(boxes, scores, idxs, 0.5), want)
                assert_same(tv_ops.boxes.batched_nms(boxes, scores, idxs, 0.5), want)


def _detector(device):
    """fasterrcnn_mobilenet_v3_large_fpn with random weights that detect something whatever the
    seed: normal with variance 1/fan-in (torchvision's own init gives nearly constant scores;
    2/fan-in saturates them and leaves few valid boxes). Few proposals, to keep it quick."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    model = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None,
        weights_backbone=None,
        box_score_thresh=0.0,
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=150,
    )
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                module.weight.normal_(0, module.weight[0].numel() ** -0.5)
                if module.bias is not None:
                    module.bias.normal_(0, 0.1)
    return model.eval().to(device)


def _torchvision_per_class(boxes, scores, idxs, iou_threshold):
    """torchvision's batched_nms answer, defined whatever the scores: its per-class path, on the
    CPU (its exact IEEE kernel), on the float32 boxes that autocast computes with, exact score ties
    taken lower index first. A detector's scores have many ties (saturated, or bfloat16's 8 bits),
    which torchvision orders arbitrarily: their stable ranks stand in for them."""
    order = torch.sort(scores, descending=True, stable=True).indices
    ranks = torch.empty(scores.shape, dtype=torch.float32, device=scores.device)
    ranks[order] = torch.arange(scores.numel(), 0, -1, dtype=torch.float32, device=scores.device)
    keep = tv_ops.boxes._batched_nms_vanilla(boxes.float().cpu(), ranks.cpu(), idxs.cpu(), iou_threshold)
    return keep.to(boxes.device)


def _run_detector(model, images, monkeypatch):
    """Run the model with torchvision's NMS, then patched, assert the same detections, and return
    the (boxes, scores) dtypes that opforge's batched_nms saw."""
    import torchvision.ops.boxes as tv_boxes

    import opforge.integrations.torchvision as otv

    seen = []
    real = opforge.batched_nms

    def spy(boxes, scores, idxs, iou_threshold):
        seen.append((boxes.dtype, scores.dtype))
        return real(boxes, scores, idxs, iou_threshold)

    with torch.no_grad():
        with monkeypatch.context() as m:
            m.setattr(tv_boxes, "batched_nms", _torchvision_per_class)
            want = model(images)
        with otv.patched(), monkeypatch.context() as m:
            m.setattr(opforge, "batched_nms", spy)
            got = model(images)
    assert len(seen) >= 2 * len(images)  # the RPN and box head NMS of each image went through opforge
    assert sum(len(w["boxes"]) for w in want) > 0
    for w, g in zip(want, got, strict=True):
        for key in w:
            assert torch.equal(w[key], g[key]), key
    return seen


@needs_torchvision
@pytest.mark.slow
def test_torchvision_patch_and_detection_model(monkeypatch):
    import torchvision.ops.boxes as tv_boxes

    import opforge.integrations.torchvision as otv

    names = [(tv_boxes, "nms"), (tv_boxes, "batched_nms"), (tv_ops, "nms"), (tv_ops, "batched_nms")]
    originals = [getattr(module, name) for module, name in names]
    assert not otv.is_patched() and all(f.__module__ == "torchvision.ops.boxes" for f in originals)
    with otv.patched():
        assert otv.is_patched()
        assert [getattr(module, name) for module, name in names] == [otv._nms, otv._batched_nms] * 2
    assert not otv.is_patched()
    assert [getattr(module, name) for module, name in names] == originals

    model = _detector("cpu")
    images = [torch.rand(3, 320, 320), torch.rand(3, 256, 384)]
    _run_detector(model, images, monkeypatch)
    assert [getattr(module, name) for module, name in names] == originals


@needs_torchvision
@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_detection_model_under_autocast(device, monkeypatch):
    """A patched detector under bfloat16 autocast gives torchvision's detections. On CUDA its RPN
    hands NMS float32 boxes (autocast runs torch.exp in float32 there) and bfloat16 scores, which
    only the autocast kernels accept; on the CPU both are bfloat16."""
    model = _detector(device)
    images = [torch.rand(3, 320, 320, device=device), torch.rand(3, 256, 384, device=device)]
    with torch.autocast(device, dtype=torch.bfloat16):
        seen = _run_detector(model, images, monkeypatch)
    assert any(torch.bfloat16 in dtypes for dtypes in seen)  # autocast reached NMS
