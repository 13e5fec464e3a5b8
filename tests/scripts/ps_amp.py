"""fp16 with a GradScaler under AsyncPSStrategy, 2 ranks on gloo (CPU): rank 1's gradient is made infinite once.

Usage: python ps_amp.py OUT_DIR MODE   (MODE: asp, local or bsp). Each rank writes its steps, its scaler's scale,
the step whose gradient was broken, the final global step (ASP: the server's version) and whether its parameters
are finite.
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from lightning_hetero import AsyncPSStrategy
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

BROKEN_STEP = 3  # rank 1's fourth step of the first epoch


class BreaksOnce(MLPClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def on_after_backward(self) -> None:
        if self.global_rank == 1 and self.steps == BROKEN_STEP:
            self.net[0].weight.grad[0, 0] = float("inf")
        self.steps += 1


def main(out: Path, mode: str) -> None:
    torch.manual_seed(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10_000)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=AsyncPSStrategy(mode=mode, fault_timeout_s=60),
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = BreaksOnce()
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=512, batch_size=32))
    report = {
        "steps": model.steps,
        "scale": scaler.get_scale(),
        "global_step": trainer.global_step,
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
    }
    (out / f"{mode}_rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
