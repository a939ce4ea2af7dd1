"""A small PyTorch Lightning run recorded through `allocsim.integrations.lightning.AllocsimCallback`
(docs/recording.md): a two-layer transformer on random tokens, built in code (nothing downloaded), with a
validation loop and a checkpoint each epoch, so the trace holds the phases train, eval and checkpoint.

    python examples/lightning_train.py --record run.bin     # recorded: run.bin, run.bin.stats.json
    python examples/lightning_train.py                      # the same run, not recorded

Either way it ends with a ``MEMORY_STATS`` line: the allocator's own counters, which recording leaves unchanged.
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_torch, print_memory_stats, recorded_parser  # noqa: E402


def lightning():
    """Lightning's package: ``lightning.pytorch``, else ``pytorch_lightning``."""
    try:
        import lightning.pytorch as L
    except ImportError:
        import pytorch_lightning as L
    return L


def tiny_lm(L, vocab: int, dim: int, layers: int, seq: int):
    """A pre-norm transformer LightningModule (made here: the classes need torch and Lightning imported)."""
    import torch
    import torch.nn as nn

    class TinyLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(dim, vocab)

        def forward(self, ids):
            x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
            return self.head(self.blocks(x, mask=mask, is_causal=True))

        def _loss(self, batch):
            (ids,) = batch
            logits = self(ids)
            return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

        def training_step(self, batch, batch_idx):
            return self._loss(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)
    return TinyLM()


def main() -> int:
    p = recorded_parser(__doc__.splitlines()[0], batch=16, dim=256, layers=2, seq=128, vocab=4096)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=6, help="training batches per epoch")
    a = p.parse_args()
    torch = cuda_torch("lightning_train.py")
    L = lightning()
    L.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, ((a.batches + 2) * a.batch, a.seq), generator=g)
    data = torch.utils.data.TensorDataset(tokens)
    train = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(a.batches * a.batch)), batch_size=a.batch)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(a.batches * a.batch, len(data))),
                                      batch_size=a.batch)
    callbacks = []
    if a.record:
        from allocsim.integrations.lightning import AllocsimCallback
        callbacks.append(AllocsimCallback(a.record))
    with tempfile.TemporaryDirectory() as ckpt:
        callbacks.append(L.callbacks.ModelCheckpoint(dirpath=ckpt, every_n_epochs=1, save_top_k=-1))
        trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=a.epochs, callbacks=callbacks, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)
        trainer.fit(tiny_lm(L, a.vocab, a.dim, a.layers, a.seq), train, val)
        saved = sorted(os.listdir(ckpt))
    if len(saved) != a.epochs:
        sys.exit(f"lightning_train.py: expected {a.epochs} checkpoints, found {saved}")
    print(f"lightning: {a.epochs} epochs, {len(saved)} checkpoints, val_loss "
          f"{float(trainer.callback_metrics['val_loss']):.3f}", flush=True)
    print_memory_stats(torch, "lightning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
