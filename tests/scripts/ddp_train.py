"""Plain 2-rank CPU DDP on generated data; writes each rank's first and last training loss as JSON.

Usage: python ddp_train.py OUT_DIR [DEVICES]
"""

import json
import logging
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class LossRecorder(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def main() -> None:
    out_dir = Path(sys.argv[1])
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    recorder = LossRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        max_epochs=3,
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=1024, batch_size=32))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"world_size": trainer.world_size, "losses": recorder.losses, "global_step": trainer.global_step}
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    # gloo can abort at interpreter exit if its process group is left alive
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
