"""fp16 with a GradScaler under AsyncPSStrategy, 2 ranks on gloo (CPU): rank 1's gradient is made infinite once
in each epoch named.

Usage: python ps_amp.py OUT_DIR MODE [--broken-epochs 0,1] [--resume]. MODE: asp, local, bsp, or a SyncSwitchCallback
schedule such as ``local:0-0,bsp:1-``; ``--broken-epochs``: the epochs (default 0) in which rank 1's fourth step gets
an infinite gradient. Each rank writes ``<MODE's first mode>_rank<r>.json``: its steps, its scaler's scale (also at
each epoch's end, with its parameters' checksum then), the final global step (ASP: the server's version), whether its
parameters are finite, and their checksum. ``--resume``: the run is saved to ``<first mode>.ckpt`` and resumed from
it for one more epoch with a fresh scaler; each rank reports the scale it started from.
"""

import argparse
import hashlib
import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision

from lightning_hetero import AsyncPSStrategy, SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

BROKEN_STEP = 3  # rank 1's fourth step of an epoch named
ZERO, INF = torch.tensor([0]), float("inf")


class BreaksOnce(MLPClassifier):
    def __init__(self, broken_epochs: set[int]) -> None:
        super().__init__()
        self.broken_epochs = broken_epochs
        self.steps = 0
        self.epoch_steps = 0

    def on_train_epoch_start(self) -> None:
        self.epoch_steps = 0

    def on_before_backward(self, loss) -> None:
        """Rank 1's gradient turns infinite inside backward, as an overflow would: before DDP's reducer (BSP) sees it."""
        broken = self.current_epoch in self.broken_epochs and self.epoch_steps == BROKEN_STEP
        if self.global_rank == 1 and broken:
            handle = self.net[0].weight.register_hook(lambda grad: (handle.remove(), grad.index_fill(1, ZERO, INF))[1])

    def on_after_backward(self) -> None:
        self.steps += 1
        self.epoch_steps += 1


class EpochScales(Callback):
    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler
        self.scales: list[float] = []
        self.checksums: list[str] = []
        self.start_scale: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start_scale = self.scaler.get_scale()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.scales.append(self.scaler.get_scale())
        self.checksums.append(_checksum(pl_module))


def _checksum(module: torch.nn.Module) -> str:
    return hashlib.sha256(
        torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy().tobytes()
    ).hexdigest()


def _trainer(mode: str, scaler: torch.amp.GradScaler, callbacks: list, epochs: int = 2) -> L.Trainer:
    first = mode.split(":")[0]
    switch = [SyncSwitchCallback(mode, verbose=False)] if ":" in mode else []
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=AsyncPSStrategy(mode=first, fault_timeout_s=60),
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        max_epochs=epochs,
        callbacks=[*callbacks, *switch],  # the epoch-end scales before a switch
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10_000)


def main(out: Path, mode: str, broken_epochs: set[int], resume: bool) -> None:
    torch.manual_seed(0)
    scaler = _scaler()
    epoch_scales = EpochScales(scaler)
    trainer = _trainer(mode, scaler, [epoch_scales])
    model = BreaksOnce(broken_epochs)
    data = SyntheticClassificationDataModule(num_samples=512, batch_size=32)
    trainer.fit(model, datamodule=data)
    report = {
        "steps": model.steps,
        "scale": scaler.get_scale(),
        "epoch_scales": epoch_scales.scales,
        "epoch_checksums": epoch_scales.checksums,
        "global_step": trainer.global_step,
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
        "checksum": _checksum(model),
    }
    if resume:
        checkpoint = out / f"{mode.split(':')[0]}.ckpt"
        trainer.save_checkpoint(checkpoint)
        resumed = EpochScales(_scaler())
        _trainer(mode, resumed.scaler, [resumed], epochs=3).fit(model, datamodule=data, ckpt_path=checkpoint)
        report["resumed_start_scale"] = resumed.start_scale
    (out / f"{mode.split(':')[0]}_rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if torch.distributed.is_initialized():  # an undestroyed gloo group can abort the interpreter at exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("mode")
    parser.add_argument("--broken-epochs", default="0")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    main(args.out, args.mode, {int(e) for e in args.broken_epochs.split(",")}, args.resume)
