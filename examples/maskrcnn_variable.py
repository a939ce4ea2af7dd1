"""Mask R-CNN (torchvision, random weights) trained on images whose size changes every step.

A detection model with variable image sizes is the hard case for a caching allocator: the
transform resizes each image keeping its aspect ratio, the proposals, RoI features and masks
vary per step, and cuDNN asks for workspaces that depend on the shapes. Synthetic images and
targets (a few random boxes with their masks), so nothing is downloaded.
"""
import os
import random
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import mark, parser, train_steps  # noqa: E402


def main():
    p = parser(__doc__, iters=12, batch=4)
    p.add_argument("--min-side", type=int, default=480)
    p.add_argument("--max-side", type=int, default=1024)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    dev = torch.device("cuda")
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                               num_classes=91).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)

    def target(h, w):
        n = rng.randint(1, 6)
        x0 = torch.randint(0, w // 2, (n,)).float()
        y0 = torch.randint(0, h // 2, (n,)).float()
        boxes = torch.stack([x0, y0, x0 + torch.randint(16, w // 2, (n,)), y0 + torch.randint(16, h // 2, (n,))], 1)
        masks = torch.zeros(n, h, w, dtype=torch.uint8)
        for k, (bx0, by0, bx1, by1) in enumerate(boxes.long().tolist()):
            masks[k, by0:by1, bx0:bx1] = 1
        return {"boxes": boxes.to(dev), "labels": torch.randint(1, 91, (n,)).to(dev), "masks": masks.to(dev)}

    def batch(i):
        h, w = rng.randint(a.min_side, a.max_side), rng.randint(a.min_side, a.max_side)
        mark(f"images {a.batch} of {h}x{w}")
        return [torch.rand(3, h, w, device=dev) for _ in range(a.batch)], [target(h, w) for _ in range(a.batch)]

    def loss_of(b):
        return sum(model(*b).values())

    train_steps("maskrcnn_variable", a, opt, batch, loss_of, torch.cuda.synchronize)


if __name__ == "__main__":
    main()
