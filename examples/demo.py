"""The quick-start demo: 2-process CPU DDP on generated data (``make demo``).

Lightning's launcher re-runs this script for the second rank, so it must stay runnable as a script.
"""

from __future__ import annotations

from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


def main() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    dm = SyntheticClassificationDataModule(num_samples=4096, batch_size=32)
    trainer.fit(MLPClassifier(), datamodule=dm)
    if trainer.is_global_zero:
        print(f"validation accuracy after {trainer.current_epoch} epochs: {trainer.callback_metrics['val_acc']:.3f}")


if __name__ == "__main__":
    main()
