"""HeteroBatchCallback training across worker containers (started in each by tests/emulation/test_docker_e2e.py).

Usage: python docker_train.py OUT_DIR [--epochs N] [--samples N]

Runs one DDP rank per container, from the environment `lightning-hetero cluster up` sets (MASTER_ADDR,
MASTER_PORT, NODE_RANK, NUM_NODES), over gloo on the containers' network. The model is the synthetic MLP made wide
enough that a step's compute (tens of ms) is long against a 100 ms CFS period, so a quota shows in the measured
speed. Rank r writes OUT_DIR/result-rank{r}.json with the split it started and ended with.
"""

import argparse
import json
import logging
import os
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero import HeteroBatchCallback, ProgressReporter
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch size at the start")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    model = MLPClassifier(num_features=512, hidden=4096, lr=0.05)
    dm = SyntheticClassificationDataModule(num_samples=args.samples, batch_size=args.batch_size, num_features=512)
    hetero = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=2))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=int(os.environ["NUM_NODES"]),
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120)),
        max_epochs=args.epochs,
        limit_val_batches=0,
        callbacks=[hetero, ProgressReporter()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start_split = None

    class RecordStart(L.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal start_split
            start_split = list(hetero.batch_sizes)

    trainer.callbacks.append(RecordStart())
    trainer.fit(model, datamodule=dm)
    result = {
        "start_split": start_split,
        "final_split": list(hetero.batch_sizes),
        "throughputs": list(hetero.tuner.throughputs or []),
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
    }
    (args.out / f"result-rank{trainer.global_rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
