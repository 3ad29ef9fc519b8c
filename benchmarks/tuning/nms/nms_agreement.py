"""How often do torchvision's CUDA and CPU NMS disagree, and whom does opforge (CUDA) match?

torchvision's CUDA IoU is compiled with FMA contraction; its CPU IoU rounds every operation. On
random detector-like sets an IoU within an ulp of the threshold is rare but happens. Usage:
python benchmarks/tuning/nms/nms_agreement.py [trials]
"""

import sys

import torch
import torchvision.ops as tv

import opforge
from opforge.bench.nms import clustered_boxes, uniform_boxes


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    counts = {"sets": 0, "tv_cuda!=tv_cpu": 0, "opforge==tv_cpu": 0, "opforge==tv_cuda": 0}
    for t in range(trials):
        torch.manual_seed(t)
        for make in (uniform_boxes, clustered_boxes):
            for n, classes in ((10_000, 1), (10_000, 80), (5_000, 80)):
                boxes, scores = make(n)
                idxs = torch.randint(0, classes, (n,))
                if classes == 1:
                    cpu, cuda = tv.nms(boxes, scores, 0.5), tv.nms(boxes.cuda(), scores.cuda(), 0.5).cpu()
                    ours = opforge.nms(boxes.cuda(), scores.cuda(), 0.5).cpu()
                else:
                    cpu = tv.batched_nms(boxes, scores, idxs, 0.5)
                    cuda = tv.batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu()
                    ours = opforge.batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu()
                counts["sets"] += 1
                counts["tv_cuda!=tv_cpu"] += not torch.equal(cpu, cuda)
                counts["opforge==tv_cpu"] += torch.equal(ours, cpu)
                counts["opforge==tv_cuda"] += torch.equal(ours, cuda)
    print(counts)


if __name__ == "__main__":
    main()
