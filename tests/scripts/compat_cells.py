"""Everyday Lightning usages under one feature of the package, run one after another in the same two CPU processes
(gloo), rank 1 slowed 3 x so that split and claims really move. Each rank writes ``OUT_DIR/rank{k}.json``: per cell
its outcome (``"pass"``, ``"refused"`` with the message, or ``"error"``), the training batches it ran, its final
``global_step``, a checksum of its parameters and the validation accuracy.

Usage: python compat_cells.py OUT_DIR FEATURE [CELL ...] [--samples N --noise X --seed S --throttle cfs]
(FEATURE: one of FEATURES; no cells: all of CELLS). ``benchmarks/bench_compat.py`` runs it on harder data to compare
the features' accuracy on each usage.
"""

import argparse
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos import Transformer
from lightning.pytorch.demos.boring_classes import BoringModel, ManualOptimBoringModel
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.hetero_batch import HeteroBatchCallback
from lightning_hetero.ps import AsyncPSStrategy
from lightning_hetero.switching import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

FEATURES = ("ddp", "ddp_hetero", "asp", "hybrid", "local", "bsp")
CELLS = (
    "plain", "max_steps", "max_time", "onecycle", "batchnorm", "sync_batchnorm", "limit_train_batches",
    "val_check_interval", "accumulate", "manual", "boring", "transformer",
)  # fmt: skip
BATCH = 16  # over both ranks; with 384 samples an epoch is 24 batches, and max_steps=22 falls in its last updates


class BatchNormClassifier(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(lr=0.05, num_classes=OPTIONS.classes)
        self.net.insert(1, nn.BatchNorm1d(self.hparams.hidden))


class OneCycleClassifier(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(num_classes=OPTIONS.classes)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2, total_steps=int(total))
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


class TinyTransformer(L.LightningModule):
    """Lightning's demo ``Transformer`` on generated token sequences (the next token is the current one plus one)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=16, ninp=16, nhead=2, nhid=32, nlayers=1)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        output = self.model(inputs, target)
        return nn.functional.nll_loss(output, target.view(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        tokens = torch.randint(0, 15, (OPTIONS.samples // 4, 8), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(tokens, tokens + 1), batch_size=8, shuffle=True)


class Seen(Callback):
    def __init__(self) -> None:
        self.batches = self.validations = 0

    def on_train_batch_start(self, *args, **kwargs) -> None:
        self.batches += 1

    def on_validation_start(self, *args, **kwargs) -> None:
        self.validations += 1


def strategy_and_callbacks(feature: str) -> tuple[object, list[Callback]]:
    if feature == "ddp":
        return "ddp", []
    if feature == "ddp_hetero":
        return "ddp", [HeteroBatchCallback(adjust_every_n_steps=4, warmup_steps=1, verbose=False)]
    if feature == "hybrid":
        return AsyncPSStrategy(mode="bsp", fault_timeout_s=30), [SyncSwitchCallback("bsp:0-0,asp:1-", verbose=False)]
    return AsyncPSStrategy(mode=feature, fault_timeout_s=30), []


def cell_setup(cell: str) -> tuple[L.LightningModule, L.LightningDataModule | None, dict]:
    samples, noise, classes = OPTIONS.samples, OPTIONS.noise, OPTIONS.classes
    data = SyntheticClassificationDataModule(samples, BATCH // 2, num_classes=classes, seed=OPTIONS.seed, noise=noise)
    kwargs: dict = {"max_epochs": OPTIONS.epochs}
    model: L.LightningModule = MLPClassifier(lr=0.1, num_classes=classes)
    if cell == "max_steps":  # two updates before an epoch's end
        kwargs.update(max_epochs=10, max_steps=samples // BATCH - 2)
    elif cell == "max_time":
        kwargs.update(max_epochs=1000, max_time={"seconds": OPTIONS.max_time_s})
    elif cell == "onecycle":
        model = OneCycleClassifier()
    elif cell in ("batchnorm", "sync_batchnorm"):
        model = BatchNormClassifier()  # 390 samples: the epoch's last global batch is short
        data = SyntheticClassificationDataModule(samples + 6, 4, num_classes=classes, seed=OPTIONS.seed, noise=noise)
        kwargs["sync_batchnorm"] = cell == "sync_batchnorm"
    elif cell == "limit_train_batches":
        kwargs["limit_train_batches"] = 0.5
    elif cell == "val_check_interval":
        kwargs["val_check_interval"] = 0.5
    elif cell == "accumulate":
        kwargs["accumulate_grad_batches"] = 2
    elif cell in ("manual", "boring", "transformer"):
        model = {"manual": ManualOptimBoringModel, "boring": BoringModel, "transformer": TinyTransformer}[cell]()
        data, kwargs = None, {"max_epochs": 2, "limit_val_batches": 4}
    return model, data, kwargs


def run_cell(feature: str, cell: str) -> dict:
    torch.manual_seed(OPTIONS.seed)
    model, data, kwargs = cell_setup(cell)
    strategy, callbacks = strategy_and_callbacks(feature)
    seen = Seen()
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, callbacks=[*callbacks, SlowdownEmulator({1: 3.0}, throttle=OPTIONS.throttle), seen],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **kwargs,
    )  # fmt: skip
    outcome: dict = {"status": "pass"}
    try:
        trainer.fit(model, datamodule=data)
    except Exception as err:  # a refusal names the setting; anything after the first batch is an error
        outcome = {"status": "refused" if seen.batches == 0 else "error", "message": f"{type(err).__name__}: {err}"}
    unvalidated = outcome["status"] == "pass" and "val_acc" not in trainer.callback_metrics
    if OPTIONS.final_validate and unvalidated and data is not None:
        trainer.validate(model, datamodule=data, verbose=False)
    params = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    acc = trainer.callback_metrics.get("val_acc")
    hetero = next((c for c in callbacks if isinstance(c, HeteroBatchCallback)), None)
    outcome.update(
        split=None if hetero is None or hetero.tuner is None else list(hetero.tuner.plan.current),
        batches=seen.batches,
        validations=seen.validations,
        global_step=trainer.global_step,
        checksum=float(params.sum()) if torch.isfinite(params).all() else math.nan,
        val_acc=None if acc is None else float(acc),
        epochs=trainer.current_epoch,
    )
    return outcome


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("feature", choices=FEATURES)
    parser.add_argument("cells", nargs="*", help=f"some of {CELLS} (default: all)")
    parser.add_argument("--samples", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-time-s", type=float, default=2.0)
    parser.add_argument("--final-validate", action="store_true", help="validate after fit if the fit did not")
    parser.add_argument("--throttle", choices=("sleep", "cfs"), default="sleep", help="how rank 1 is slowed")
    return parser.parse_args(argv)


OPTIONS = parse(sys.argv[1:])


def main() -> None:
    out, feature, cells = OPTIONS.out, OPTIONS.feature, OPTIONS.cells or list(CELLS)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    results = {}
    for cell in cells:
        started = time.perf_counter()
        results[cell] = run_cell(feature, cell)
        results[cell]["seconds"] = round(time.perf_counter() - started, 2)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    if torch.distributed.is_initialized():  # leave together: a rank exiting while gloo's threads run can abort
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
