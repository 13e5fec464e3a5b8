"""2-rank CPU DDP with rank 1 slowed by SlowdownEmulator; each rank times its compute window as HeteroBatchCallback
does (batch start to the last DDP communication-hook call) and writes the windows and the emulator's sleeps as JSON.

Usage: python slowdown_ddp.py OUT_DIR FACTOR
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.measurement import ComputeTimer
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class CommHookWindow(Callback):
    """Lightning ignores ddp_comm_hook on CPU, so the hook is registered on the wrapped model here."""

    def __init__(self, emulator: SlowdownEmulator) -> None:
        self.emulator = emulator
        self.timer = ComputeTimer()
        self.steps: list[tuple[float, float]] = []

    def on_train_start(self, trainer, pl_module):
        timer = self.timer

        def hook(process_group, bucket):
            timer.mark_compute_end()
            return default_hooks.allreduce_hook(process_group, bucket)

        trainer.strategy.model.register_comm_hook(None, hook)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.timer.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append((self.timer.elapsed_s(), self.emulator.batch_stretch_s))


def main() -> None:
    out_dir, factor = Path(sys.argv[1]), float(sys.argv[2])
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    emulator = SlowdownEmulator(factors={1: factor})
    window = CommHookWindow(emulator)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        max_epochs=1,
        callbacks=[window, emulator],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    dm = SyntheticClassificationDataModule(num_samples=2 * 24 * 256, batch_size=256, num_features=128)
    trainer.fit(MLPClassifier(num_features=128, hidden=2048), datamodule=dm)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps({"steps": window.steps}))


if __name__ == "__main__":
    main()
