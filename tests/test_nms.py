"""opforge.nms / batched_nms / nms_padded against torchvision and the reference."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICES, HAS_CUDA

import opforge
from opforge import reference
from opforge.bench.nms import clustered_boxes, distinct, torchvision_ops, uniform_boxes

# torchvision is the peer: the oracle on tie-free inputs. Where it is missing or does not load
# beside this torch, the stable reference (equal to torchvision on tie-free inputs) stands in.
tv_ops = torchvision_ops()
needs_torchvision = pytest.mark.skipif(tv_ops is None, reason="torchvision is missing or does not load")


class _Oracle:
    nms = staticmethod(tv_ops.nms if tv_ops else reference.nms)
    batched_nms = staticmethod(tv_ops.batched_nms if tv_ops else reference.batched_nms)


oracle = _Oracle()


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
        big_boxes = boxes.repeat(2000, 1) + torch.arange(6000).repeat_interleave(4).view(-1, 4) * 100.0
        big_scores = s.repeat(2000)
        assert_same(  # the same through the large-input sort path
            opforge.nms(big_boxes.to(device), big_scores.to(device), 0.5),
            reference.nms(big_boxes, big_scores, 0.5),
        )


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
    want = [int(torch.nonzero(idxs == c).flatten()[s2[idxs == c].argmax()]) for c in range(3)]
    assert sorted(got.tolist()) == sorted(want)


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
    with pytest.raises(RuntimeError, match=r"opforge\.nms: iou_threshold must be a number, got nan"):
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
    with pytest.raises(TypeError, match=r"opforge\.nms_padded: iou_threshold must be a float, got str"):
        opforge.nms_padded(b, s, "0.5")
    # int32 classes are accepted
    assert_same(opforge.batched_nms(b, s, torch.zeros(10, dtype=torch.int32), 0.5), oracle.nms(b, s, 0.5))


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
    for seed in range(24):
        torch.manual_seed(seed)
        make = uniform_boxes if seed % 2 else clustered_boxes
        n = (10_000, 20_000, 3_000)[seed % 3]
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


@needs_torchvision
def test_torchvision_patch_and_detection_model():
    import torchvision.ops.boxes as tv_boxes
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn

    import opforge.integrations.torchvision as otv

    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0
    ).eval()
    # torchvision's init leaves many exactly-equal scores (ties are ordered arbitrarily by
    # torchvision); a fan-in scaled normal init gives distinct scores, hence one right answer.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                module.weight.normal_(0, (2.0 / module.weight[0].numel()) ** 0.5)
                if module.bias is not None:
                    module.bias.normal_(0, 0.1)
    images = [torch.rand(3, 320, 320), torch.rand(3, 256, 384)]
    calls = []
    with torch.no_grad():
        want = model(images)
        with otv.patched():
            assert tv_boxes.batched_nms is not calls and otv.is_patched()
            real = opforge.batched_nms
            try:
                opforge.batched_nms = lambda *a: calls.append(a[0].shape[0]) or real(*a)
                got = model(images)
            finally:
                opforge.batched_nms = real
    assert not otv.is_patched() and tv_boxes.nms is not otv._nms
    assert len(calls) >= 2  # the RPN and box head NMS went through opforge
    assert sum(len(w["boxes"]) for w in want) > 0
    for w, g in zip(want, got, strict=True):
        for key in w:
            assert torch.equal(w[key], g[key]), key
