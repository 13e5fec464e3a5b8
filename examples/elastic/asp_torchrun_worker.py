"""One node's training process of an ASP job under torchrun's elastic agent: every attempt resumes from the last
checkpoint with the attempt's membership (``TorchrunAttempt``, ``TorchrunRestarts``).

Usage: torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d ... asp_torchrun_worker.py OUT CKPT_DIR [options]

Each sample's trainings per epoch are summed over the ranks at the epoch's end and carried in the checkpoint, so
the final attempt holds the counts of the job's history (the epochs its checkpoints descend from). Rank 0 appends
each attempt's record (``TorchrunRestarts.record`` and the time) to ``OUT/attempts.jsonl``; every rank appends one
line per training step to ``OUT/steps.jsonl`` (time, ``NODE_NAME`` from the environment, rank, world size, epoch);
the final attempt's rank 0 writes ``OUT/final.json``. ``benchmarks/torchrun_job.py`` runs it (the benchmark and the
tests).
"""

import argparse
import json
import logging
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.elastic.torchrun import TorchrunAttempt, TorchrunRestarts
from lightning_hetero.synthetic import MLPClassifier, make_classification


class Indexed(Dataset):
    """(features, label, index): each rank reports which samples it trained."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return (*self.data[i], i)


class CountingModel(MLPClassifier):
    """Counts each sample's trainings per epoch over all ranks and keeps the counts in checkpoints."""

    def __init__(self, config: dict) -> None:
        super().__init__(lr=0.1, momentum=0.9)
        self.args = args = argparse.Namespace(**config)
        data = make_classification(args.samples + args.samples // 4, seed=0, noise=args.noise)
        self.train_set = Indexed(torch.utils.data.Subset(data, range(args.samples)))
        self.val_set = Indexed(torch.utils.data.Subset(data, range(args.samples, len(data))))
        self.seen: list[int] = []
        self.counts: dict[int, list[int]] = {}
        self.steps = Path(args.out) / "steps.jsonl"

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        time.sleep(self.args.step_sleep_s)
        self.seen.extend(index.tolist())
        line = {
            "t": time.time(),
            "node": os.environ.get("NODE_NAME"),
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "epoch": self.current_epoch,
        }
        with self.steps.open("a") as log:
            log.write(json.dumps(line) + "\n")
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        super().validation_step((x, y), batch_idx)

    def on_train_epoch_start(self):
        self.seen = []

    def on_train_epoch_end(self):
        counts = torch.bincount(torch.tensor(self.seen, dtype=torch.long), minlength=self.args.samples)
        self.counts[self.current_epoch] = self.all_gather(counts).reshape(-1, self.args.samples).sum(0).tolist()

    def on_save_checkpoint(self, checkpoint):
        checkpoint["sample_counts"] = self.counts

    def on_load_checkpoint(self, checkpoint):
        self.counts = {int(epoch): counts for epoch, counts in checkpoint["sample_counts"].items()}

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.args.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=128)


class AttemptLog(L.Callback):
    """Rank 0 appends the attempt's record to ``attempts.jsonl`` once ``TorchrunRestarts`` has printed it."""

    def __init__(self, restarts: TorchrunRestarts, out: Path) -> None:
        self.restarts, self.out = restarts, out

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 0:
            with (self.out / "attempts.jsonl").open("a") as log:
                log.write(json.dumps({**self.restarts.record, "t": time.time()}) + "\n")


class Hold(L.Callback):
    """Scripted churn without races: at the start of each epoch but the attempt's first, every rank waits while the
    file ``path`` lists this attempt's world size (writing ``held_w{world size}_r{rank}`` once), so the attempt has
    written a checkpoint and trains no further until the membership changes (or the file does)."""

    def __init__(self, path: Path, out: Path) -> None:
        self.path, self.out = path, out
        self.first_epoch = 0

    def on_train_start(self, trainer, pl_module):
        self.first_epoch = trainer.current_epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.first_epoch:
            return
        world = str(trainer.world_size)
        if self._holds(world):
            (self.out / f"held_w{world}_r{trainer.global_rank}").touch()
        while self._holds(world):
            time.sleep(0.05)

    def _holds(self, world: str) -> bool:
        try:
            return world in self.path.read_text().split()
        except FileNotFoundError:
            return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("ckpt_dir")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--step-sleep-s", type=float, default=0.25, help="emulated compute per step")
    parser.add_argument("--fault-timeout-s", type=float, default=60.0)
    parser.add_argument("--noise", type=float, default=0.5, help="make_classification's noise")
    parser.add_argument("--hold", default=None, help="a file: see Hold")
    parser.add_argument("--validate", action="store_true", help="validate every epoch (val_acc in final.json)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    attempt = TorchrunAttempt.from_env()
    restarts = TorchrunRestarts(attempt)
    checkpoints = ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_on_train_epoch_end=True)
    trainer = L.Trainer(
        accelerator="cpu",
        **attempt.trainer_kwargs,
        strategy=AsyncPSStrategy(on_worker_lost="fail", fault_timeout_s=args.fault_timeout_s),
        max_epochs=args.epochs,
        callbacks=[restarts, AttemptLog(restarts, out), checkpoints]
        + ([Hold(Path(args.hold), out)] if args.hold else []),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if args.validate else 0,
    )
    model = CountingModel(vars(args))
    trainer.fit(model, ckpt_path="last")
    if trainer.global_rank == 0:
        final = {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "current_epoch": trainer.current_epoch,
            "counts": model.counts,
            "attempt": restarts.record,
            "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
        }
        (out / "final.json").write_text(json.dumps(final))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
