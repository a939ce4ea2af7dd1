"""ResNet-50 (torchvision, random weights) trained a few steps on random images with SGD."""
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parser, train_steps  # noqa: E402


def main():
    p = parser(__doc__, iters=8, batch=32)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    model = torchvision.models.resnet50(weights=None).to(dev)
    opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if a.optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-4))
    loss_fn = torch.nn.CrossEntropyLoss()

    def batch(i):
        return torch.randn(a.batch, 3, 224, 224, device=dev), torch.randint(0, 1000, (a.batch,), device=dev)

    train_steps("resnet50", a, opt, batch, lambda xy: loss_fn(model(xy[0]), xy[1]), torch.cuda.synchronize)


if __name__ == "__main__":
    main()
