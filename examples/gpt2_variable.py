"""GPT-2 small trained on batches whose size and sequence length change every step.

Variable shapes are what make caching allocators fragment: each step asks for
blocks of sizes the cache has not seen, so this trace stresses splitting and
reuse far more than a fixed-shape run.
"""
import os
import random
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import mark, parser, train_steps  # noqa: E402


def main():
    p = parser(__doc__, iters=10, batch=8)
    p.add_argument("--min-seq", type=int, default=64)
    p.add_argument("--max-seq", type=int, default=1024)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def tokens(i):
        batch, seq = rng.randint(1, a.batch), rng.randint(a.min_seq, a.max_seq)
        mark(f"batch {batch} seq {seq}")
        return torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    train_steps("gpt2_variable", a, opt, tokens, lambda ids: model(input_ids=ids, labels=ids).loss,
                torch.cuda.synchronize)


if __name__ == "__main__":
    main()
