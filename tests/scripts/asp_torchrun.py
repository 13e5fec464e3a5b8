"""ASP under torchrun's elastic agent: every attempt resumes from the last checkpoint with the attempt's membership.

Usage: torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d ... asp_torchrun.py OUT CKPT_DIR [options]

Each sample's training count per epoch is summed over the ranks at the epoch's end and carried in the checkpoint,
so the final attempt's counts are those of the job's history (the epochs its checkpoints descend from). Rank 0
appends each attempt's record (``TorchrunRestarts.record``) to ``OUT/attempts.jsonl``, every rank one line per
training step to ``OUT/steps.jsonl`` (time, ``NODE_NAME`` from the environment, rank, world size); the final attempt's rank 0 writes
``OUT/final.json``.
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
from ps_train import PSTestModel

from lightning_hetero.elastic.torchrun import TorchrunAttempt, TorchrunRestarts
from lightning_hetero.ps import AsyncPSStrategy


class CountingModel(PSTestModel):
    """Counts each sample's trainings per epoch over all ranks and keeps the counts in checkpoints."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.counts: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        time.sleep(self.args.step_sleep_s)
        loss = super().training_step(batch, batch_idx)
        line = {
            "t": time.time(),
            "node": os.environ.get("NODE_NAME"),
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "epoch": self.current_epoch,
        }
        with (Path(self.args.out) / "steps.jsonl").open("a") as log:
            log.write(json.dumps(line) + "\n")
        return loss

    def on_train_epoch_end(self):
        counts = torch.bincount(
            torch.tensor(self.seen.get(self.current_epoch, []), dtype=torch.long), minlength=self.args.samples
        )
        self.counts[self.current_epoch] = self.all_gather(counts).reshape(-1, self.args.samples).sum(0).tolist()

    def on_save_checkpoint(self, checkpoint):
        checkpoint["sample_counts"] = self.counts

    def on_load_checkpoint(self, checkpoint):
        self.counts = {int(epoch): counts for epoch, counts in checkpoint["sample_counts"].items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("ckpt_dir")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--step-sleep-s", type=float, default=0.05)
    parser.add_argument("--fault-timeout-s", type=float, default=20.0)
    parser.add_argument("--validate", action="store_true", help="validate every epoch (val_acc in final.json)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    attempt = TorchrunAttempt.from_env()
    restarts = TorchrunRestarts(attempt)
    config = dict(
        vars(args),
        lr=0.1,
        momentum=0.9,
        batchnorm=False,
        slow_rank=-1,
        sleep_per_sample_s=0.0,
        kill_rank=-1,
        kill_after=0,
        hang=False,
        optimizer="sgd",
        two_optimizers=False,
        step_lr=0,
    )
    model = CountingModel(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trainer = L.Trainer(
        accelerator="cpu",
        **attempt.trainer_kwargs,
        strategy=AsyncPSStrategy(on_worker_lost="fail", fault_timeout_s=args.fault_timeout_s),
        max_epochs=args.epochs,
        callbacks=[restarts, ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_on_train_epoch_end=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if args.validate else 0,
    )

    class Record(L.Callback):
        def on_train_start(self, trainer, pl_module):
            if trainer.global_rank == 0:
                with (out / "attempts.jsonl").open("a") as log:
                    log.write(json.dumps({**restarts.record, "t": time.time()}) + "\n")

    trainer.callbacks.append(Record())
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
