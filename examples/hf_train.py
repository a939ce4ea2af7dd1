"""A small Hugging Face ``Trainer`` run recorded through `allocsim.integrations.hf.AllocsimCallback`
(docs/recording.md): GPT-2 with two layers, built from a ``GPT2Config`` (random weights, nothing downloaded), on
random tokens, evaluated and checkpointed every few steps, so the trace holds the phases train, eval and checkpoint.

    python examples/hf_train.py --record run.bin        # recorded: run.bin, run.bin.stats.json
    python examples/hf_train.py                         # the same run, not recorded
    allocsim record -o acc.bin -- accelerate launch --num_processes 1 examples/hf_train.py --record acc.bin
                                                        # recorded by allocsim record; the callback marks phases

Either way it ends with a ``MEMORY_STATS`` line: the allocator's own counters, which recording leaves unchanged.
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_torch, print_memory_stats, recorded_parser  # noqa: E402


def tokens(n: int, seq: int, vocab: int, seed: int):
    """Random token sequences as a Dataset of ``{"input_ids", "labels"}``, the same for every run (one seed)."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}
    return Tokens()


def main() -> int:
    p = recorded_parser(__doc__.splitlines()[0], batch=8, dim=256, layers=2, seq=128, vocab=4096)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4, help="evaluate and save every N steps")
    a = p.parse_args()
    torch = cuda_torch("hf_train.py")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
    set_seed(0)
    callbacks = []
    if a.record:          # made before the Trainer, which moves the model to the GPU when it is made
        from allocsim.integrations.hf import AllocsimCallback
        callbacks.append(AllocsimCallback(a.record))
    model = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.dim, n_layer=a.layers,
                                       n_head=4))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch,
                                 per_device_eval_batch_size=a.batch, eval_strategy="steps", eval_steps=a.every,
                                 save_strategy="steps", save_steps=a.every, logging_steps=a.every, report_to=[],
                                 dataloader_num_workers=0, disable_tqdm=True, seed=0, data_seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=tokens(a.steps * a.batch, a.seq, a.vocab, 1),
                          eval_dataset=tokens(2 * a.batch, a.seq, a.vocab, 2), callbacks=callbacks)
        result = trainer.train()
        saved = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
    if len(saved) != a.steps // a.every:
        sys.exit(f"hf_train.py: expected {a.steps // a.every} checkpoints, found {saved}")
    print(f"hf: {result.global_step} steps, {len(saved)} checkpoints, train loss {result.training_loss:.3f}",
          flush=True)
    print_memory_stats(torch, "hf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
