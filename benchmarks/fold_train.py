"""A fixed-shape training run for the folding recordings (traces/fold/): a small GPT (transformers GPT2LMHeadModel,
AdamW) or a torchvision ResNet-18 (SGD with momentum), random data made on the device each step, and optionally an
evaluation every N steps (model.eval(), a no_grad forward over a few batches of the same shape, model.train()).

Like a real loop it keeps a running loss on the device (one small tensor replaced each step) and reads it every 50
steps. Run under `allocsim record` (benchmarks/gpu_fold_runs.sh); each optimizer step is a MARK, nothing else is."""
import argparse
import time

import torch


def gpt(a, dev):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.width // 64, n_positions=a.seq)
    model = GPT2LMHeadModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch():
        return torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev)

    return model, opt, batch, lambda ids: model(input_ids=ids, labels=ids).loss


def resnet18(a, dev):
    import torchvision
    model = torchvision.models.resnet18(weights=None).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def batch():
        return torch.randn(a.batch, 3, a.image, a.image, device=dev), torch.randint(0, 1000, (a.batch,), device=dev)

    return model, opt, batch, lambda xy: loss_fn(model(xy[0]), xy[1])


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model", choices=["gpt", "resnet18"])
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="gpt: transformer blocks")
    p.add_argument("--width", type=int, default=256, help="gpt: embedding width (heads of 64)")
    p.add_argument("--seq", type=int, default=256, help="gpt: sequence length")
    p.add_argument("--image", type=int, default=224, help="resnet18: image side")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model, opt, batch, loss_of = (gpt if a.model == "gpt" else resnet18)(a, dev)
    model.train()
    running = torch.zeros((), device=dev)
    t0 = time.perf_counter()
    for i in range(1, a.iters + 1):
        x = batch()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x)
        loss.backward()
        opt.step()
        running = running + loss.detach()
        if i % 50 == 0:
            print(f"step {i} loss {running.item() / 50:.3f}", flush=True)
            running = torch.zeros((), device=dev)
        if a.eval_every and i % a.eval_every == 0:
            model.eval()
            with torch.no_grad():
                total = sum(loss_of(batch()).item() for _ in range(a.eval_batches))
            model.train()
            print(f"eval at {i}: {total / a.eval_batches:.3f}", flush=True)
    torch.cuda.synchronize()
    print(f"{a.model}: {a.iters} steps in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
