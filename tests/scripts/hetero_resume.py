"""Resumes a 2-rank DDP + HeteroBatchCallback run from a checkpoint for one more epoch; each rank writes as JSON the
callback's state right after the restore and at the end.

Usage: python hetero_resume.py CKPT OUT_DIR   (the model and data of tests/hetero_batch/fixtures/write_hetero_checkpoint.py)
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from lightning_hetero import HeteroBatchCallback
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.synthetic import MLPClassifier, make_classification


class Restored(Callback):
    """What the HeteroBatchCallback (earlier in the list) holds once the checkpoint is loaded and the loader built."""

    def __init__(self, hetero: HeteroBatchCallback) -> None:
        self.hetero = hetero
        self.seen: dict = {}

    def on_train_start(self, trainer, pl_module):
        tuner = self.hetero.tuner
        self.seen = {
            "split": list(tuner.split),
            "costs": [list(c) for c in tuner.costs],
            "throughputs": list(tuner.throughputs),
            "policy": tuner.policy.state_dict(),
            "own_fit": [tuner.cost.overhead_s, tuner.cost.per_sample_s],
            "history": len(tuner.history),
            "global_step": trainer.global_step,
        }


def main() -> None:
    ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    model = MLPClassifier(num_features=8, num_classes=3, hidden=8)
    loader = DataLoader(make_classification(512, num_features=8, num_classes=3, seed=1), batch_size=32)
    hetero = HeteroBatchCallback(adjust_every_n_steps=4, verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=2))
    restored = Restored(hetero)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        callbacks=[hetero, restored],
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader, ckpt_path=str(ckpt))
    result = {
        "restored": restored.seen,
        "final_split": list(hetero.batch_sizes),
        "global_step": trainer.global_step,
        "history": len(hetero.history),
    }
    (out / f"resume_rank{trainer.global_rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
