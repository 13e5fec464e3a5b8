"""The quick-start demo (``make demo``): heterogeneity-aware training on 2 CPU processes, before and after.

Rank 1 is made 4x slower with :class:`~lightning_hetero.SlowdownEmulator`. The demo trains the same model on the
same generated data twice, with plain DDP and with :class:`~lightning_hetero.HeteroBatchCallback`, and prints the
throughput and accuracy of both. Each run is a separate ``python examples/demo.py --run ...`` process (Lightning's
launcher re-runs that command for rank 1); without ``--run`` the script is the driver.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

SLOW_FACTOR = 4.0


def train(method: str, out: Path, epochs: int) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_hetero import HeteroBatchCallback, SlowdownEmulator
    from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

    class EpochClock(Callback):
        """Training wall time of every epoch after the first (the first pays for start-up and warm-up)."""

        def __init__(self) -> None:
            self.seconds = 0.0
            self._start = 0.0

        def on_train_epoch_start(self, trainer, pl_module):
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch > 0:
                self.seconds += time.perf_counter() - self._start

    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    clock = EpochClock()
    callbacks = [SlowdownEmulator(factors={1: SLOW_FACTOR}), clock]
    hetero = HeteroBatchCallback(adjust_every_n_steps=8, verbose=False) if method == "hetero" else None
    if hetero is not None:
        callbacks.append(hetero)
    dm = SyntheticClassificationDataModule(num_samples=8192, batch_size=128, num_features=128, num_classes=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120)),
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(MLPClassifier(num_features=128, num_classes=8, hidden=4096, lr=0.02), datamodule=dm)
    if trainer.is_global_zero:
        measured_epochs = epochs - 1
        result = {
            "samples_per_s": measured_epochs * len(dm.train_set) / clock.seconds,
            "val_acc": float(trainer.callback_metrics["val_acc"]),
            "split": list(hetero.batch_sizes) if hetero is not None else [128, 128],
            "summary": hetero.summary() if hetero is not None else "",
        }
        out.write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


def drive(epochs: int) -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("ddp", "hetero"):
            label = "plain DDP" if method == "ddp" else "HeteroBatchCallback"
            print(f"training with {label} (rank 1 emulated {SLOW_FACTOR:g}x slower) ...", flush=True)
            out = Path(tmp) / f"{method}.json"
            env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
            subprocess.run(
                [sys.executable, __file__, "--run", method, "--out", str(out), "--epochs", str(epochs)],
                check=True,
                env=env,
            )
            results[method] = json.loads(out.read_text())
    ddp, hetero = results["ddp"], results["hetero"]
    print()
    print(hetero["summary"])
    print()
    print(f"{'':<22}{'samples/s':>10}{'val acc':>9}{'per-rank batch':>16}")
    print(f"{'plain DDP':<22}{ddp['samples_per_s']:>10.0f}{ddp['val_acc']:>9.3f}{ddp['split']!s:>16}")
    print(
        f"{'HeteroBatchCallback':<22}{hetero['samples_per_s']:>10.0f}{hetero['val_acc']:>9.3f}{hetero['split']!s:>16}"
    )
    print(
        f"\nspeedup: {hetero['samples_per_s'] / ddp['samples_per_s']:.2f}x (epochs 2-{epochs}, one machine, 2 processes)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=["ddp", "hetero"], help="train once (used by the driver)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.run is None:
        drive(args.epochs)
    else:
        train(args.run, args.out, args.epochs)


if __name__ == "__main__":
    main()
