"""BERT-base masked-language-model training (BertForMaskedLM(BertConfig())) on random tokens with AdamW."""
import os
import sys

import torch
from transformers import BertConfig, BertForMaskedLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import parser, train_steps  # noqa: E402


def main():
    p = parser(__doc__, iters=6, batch=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--mask-prob", type=float, default=0.15)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    cfg = BertConfig()
    model = BertForMaskedLM(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        ids = torch.randint(1000, cfg.vocab_size, (a.batch, a.seq), device="cuda")
        masked = torch.rand(ids.shape, device="cuda") < a.mask_prob
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        inputs = torch.where(masked, torch.full_like(ids, 103), ids)      # 103 = [MASK]
        return inputs, labels

    train_steps("bert_mlm", a, opt, batch,
                lambda b: model(input_ids=b[0], attention_mask=torch.ones_like(b[0]), labels=b[1]).loss,
                torch.cuda.synchronize)


if __name__ == "__main__":
    main()
