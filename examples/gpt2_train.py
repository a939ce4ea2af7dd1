"""GPT-2 small (transformers GPT2LMHeadModel, default GPT2Config) trained a few steps on random tokens with AdamW."""
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parser, train_steps  # noqa: E402


def main():
    p = parser(__doc__, iters=6, batch=8)
    p.add_argument("--seq", type=int, default=512, help="sequence length (default 512)")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_steps("gpt2", a, opt, lambda i: torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda"),
                lambda ids: model(input_ids=ids, labels=ids).loss, torch.cuda.synchronize)


if __name__ == "__main__":
    main()
