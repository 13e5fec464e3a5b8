"""A fit with ``AsyncPSStrategy`` that checkpoints at a validation point inside an epoch, Lightning's defaults on
(progress bar, model summary, logger); each rank writes what it trained as JSON.

Usage: python mid_epoch_resume.py OUT_DIR --mode {asp,local} [--optimizer {sgd,adam}] [--resume CKPT]

Without ``--resume`` the fit validates halfway through each epoch, ModelCheckpoint saves there and at the epoch's end
(``OUT_DIR/ckpt/epoch=E-step=S.ckpt``), and right after the first checkpoint inside an epoch the fit is stopped. Rank
k writes ``OUT_DIR/rank{k}.json``: the sample indices it trained per epoch (all of them, and those trained when the
mid-epoch checkpoint was saved), the checkpoint's epoch and step, the global step at each epoch's end and at the end.
"""

import argparse
import json
import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.synthetic import MLPClassifier, make_classification


class IndexedDataset(Dataset):
    """(features, label, index) triples, so each rank can report which samples it trained on."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.features[i], self.labels[i], i


class Model(MLPClassifier):
    def __init__(self, samples: int, optimizer: str) -> None:
        super().__init__(lr=0.05)
        self.optimizer = optimizer
        data = make_classification(samples + samples // 4, seed=0).tensors
        self.train_set = IndexedDataset(data[0][:samples], data[1][:samples])
        self.val_set = IndexedDataset(data[0][samples:], data[1][samples:])
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        return super().training_step((x, y), batch_idx)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        super().validation_step((x, y), batch_idx)

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=0.01)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=64)


class StopAfterMidEpochCheckpoint(Callback):
    """Records what was trained when a checkpoint is saved inside an epoch, and stops the fit right after it."""

    def __init__(self, stop: bool) -> None:
        self.stop = stop
        self.saved: dict | None = None
        self.epoch_end_steps: dict[int, int] = {}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.saved is None and trainer.validating:  # Lightning's ModelCheckpoint after a validation point
            self.saved = {
                "epoch": trainer.current_epoch,
                "global_step": trainer.global_step,
                "seen": {epoch: list(seen) for epoch, seen in pl_module.seen.items()},
            }

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.stop and self.saved is not None:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch_end_steps[trainer.current_epoch] = trainer.global_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", default="asp")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    out = Path(args.out)
    recorder = StopAfterMidEpochCheckpoint(stop=args.resume is None)
    # AsyncPSStrategy takes val_check_interval over from Lightning, which then sees 1.0: ModelCheckpoint saves at
    # validation points only when told to
    checkpoints = ModelCheckpoint(
        dirpath=out / "ckpt", filename="{epoch}-{step}", save_top_k=-1, save_on_train_epoch_end=False
    )
    checkpoints.CHECKPOINT_EQUALS_CHAR = "="
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=AsyncPSStrategy(mode=args.mode),
        max_epochs=args.epochs,
        val_check_interval=0.5,
        num_sanity_val_steps=0,
        callbacks=[recorder, checkpoints],
        default_root_dir=out,
    )
    model = Model(args.samples, args.optimizer)
    trainer.fit(model, ckpt_path=args.resume)
    result = {
        "seen": model.seen,
        "saved": recorder.saved,
        "epoch_end_steps": recorder.epoch_end_steps,
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
