"""Everyday Lightning usages under one feature of the package, run one after another in the same two CPU processes
(gloo), rank 1 slowed 3 x so that split and claims really move. Each rank writes ``OUT_DIR/rank{k}.json``: per cell
its outcome (``"pass"``, ``"refused"`` with the message, or ``"error"``), the training batches it ran, its final
``global_step``, a checksum of its parameters and the validation accuracy.

Usage: python compat_cells.py OUT_DIR FEATURE [CELL ...] [--samples N --noise X --seed S --throttle cfs --optimizer adam]
(FEATURE: one of FEATURES; no cells: all of CELLS and MORE_CELLS; ``CELL:OPTIMIZER@SEED`` runs a cell with another
optimizer or seed). Lightning's defaults are on (progress bar, model summary, logger, checkpointing). ``benchmarks/scenarios/compat.py`` runs it on harder data to compare
the features' accuracy on each usage.
"""

import argparse
import json
import logging
import math
import sys
import time
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint, StochasticWeightAveraging
from lightning.pytorch.demos import Transformer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.hetero_batch import HeteroBatchAdvanced, HeteroBatchCallback
from lightning_hetero.hetero_batch.batches import compiled_graphs
from lightning_hetero.switching import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

FEATURES = ("ddp", "ddp_hetero", "asp", "hybrid", "local", "bsp")
CELLS = (
    "plain", "max_steps", "max_time", "onecycle", "batchnorm", "sync_batchnorm", "limit_train_batches",
    "val_check_interval", "val_check_batches", "accumulate", "manual", "boring", "transformer", "cnn",
)  # fmt: skip
#: the rest of the everyday usages; each cell's outcome has ``checks``, what the test asserts for that usage
MORE_CELLS = (
    "resume", "early_stopping", "steplr", "plateau", "clip", "bf16", "torchmetrics", "evaluate", "csv_logger",
    "fast_dev_run", "workers", "dict_batch", "frozen_unused", "swa", "compile",
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


def user_optimizer(
    params, lr_sgd: float = 0.1, momentum: float = 0.0, lr_adaptive: float = 1e-2
) -> torch.optim.Optimizer:
    """The cell's optimizer as a user would write it: ``--optimizer`` SGD (``lr_sgd``, ``momentum``), Adam or AdamW
    (``lr_adaptive``)."""
    if OPTIONS.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr_adaptive)
    if OPTIONS.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr_adaptive)
    return torch.optim.SGD(params, lr=lr_sgd, momentum=momentum)


class UserMLP(MLPClassifier):
    """The package's MLP with the cell's optimizer."""

    def configure_optimizers(self):
        return user_optimizer(self.parameters(), self.hparams.lr)


class ManualMLP(UserMLP):
    """The MLP with manual optimization as Lightning's docs write it: ``zero_grad``, ``manual_backward``, ``step``."""

    def __init__(self) -> None:
        super().__init__(lr=0.1, num_classes=OPTIONS.classes)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("train_loss", loss, prog_bar=True)


class SmallCNN(L.LightningModule):
    """A Lightning-docs-style CNN (two conv layers, a linear head) on generated 1 x 12 x 12 images: each class a
    seeded random template, under noise."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(64 * 3 * 3, 128), nn.ReLU(), nn.Linear(128, OPTIONS.classes),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        # Adam's lr 3e-3: at 1e-2 this CNN, trained alone in plain PyTorch, stays at chance on 1-3 of 24 seeds
        # (batch 16 and 8); at 3e-3 on none of 48 (docs/lab/LAB_LOG.md, 2026-11-29)
        return user_optimizer(self.parameters(), 0.05, momentum=0.9, lr_adaptive=3e-3)


class ImageData(L.LightningDataModule):
    """Generated images for :class:`SmallCNN`: train and validation sets from the same class templates."""

    def __init__(self, samples: int, batch_size: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(OPTIONS.seed)
        templates = torch.randn(OPTIONS.classes, 1, 12, 12, generator=generator)
        labels = torch.randint(OPTIONS.classes, (samples + samples // 2,), generator=generator)
        images = templates[labels] + torch.randn(len(labels), 1, 12, 12, generator=generator)
        self.train_set = TensorDataset(images[:samples], labels[:samples])
        self.val_set = TensorDataset(images[samples:], labels[samples:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=64)


def unpack(batch: tuple | dict) -> tuple[torch.Tensor, torch.Tensor]:
    return (batch["x"], batch["y"]) if isinstance(batch, dict) else batch


class ProbeClassifier(MLPClassifier):
    """The classifier recording what reached it (the forward's dtype, the gradient norm after clipping), with tuple
    or dict batches, a torchmetrics accuracy logged with ``sync_dist``, test and predict steps, an optional
    learning-rate scheduler (``"steplr"``, ``"plateau"``) and optionally a frozen layer and an unused parameter."""

    def __init__(self, scheduler: str | None = None, frozen_unused: bool = False) -> None:
        super().__init__(lr=0.1, num_classes=OPTIONS.classes)
        self.scheduler = scheduler
        self.metric = MulticlassAccuracy(num_classes=OPTIONS.classes)
        self.probe: dict = {"dtype": None, "clip_calls": 0, "clipped_norm": 0.0}
        if frozen_unused:
            self.net[0].requires_grad_(False)
            self.unused = nn.Linear(2, 2)
            self.probe.update(frozen_before=checksum(self.net[0]), unused_before=checksum(self.unused))

    def training_step(self, batch, batch_idx):
        x, y = unpack(batch)
        logits = self(x)
        self.probe["dtype"] = str(logits.dtype)
        loss = nn.functional.cross_entropy(logits.float(), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        x, y = unpack(batch)
        logits = self(x).float()
        self.metric(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)
        self.log("val_metric_acc", self.metric, sync_dist=True)

    def test_step(self, batch, batch_idx) -> None:
        x, y = unpack(batch)
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(unpack(batch)[0]).argmax(-1)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if gradient_clip_val:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.parameters() if p.grad is not None])
            self.probe["clip_calls"] += 1
            self.probe["clipped_norm"] = max(self.probe["clipped_norm"], float(norm))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.scheduler == "steplr":
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]
        if self.scheduler == "plateau":  # an epoch "improves" only when val_loss falls by 1: cut after epoch 2
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, factor=0.5, patience=0, threshold=1.0, threshold_mode="abs"
            )
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}
        return optimizer


class DictBatches(TensorDataset):
    """A ``TensorDataset`` of (features, label) served as ``{"x": ..., "y": ...}``."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return {"x": x, "y": y}


class TinyTransformer(L.LightningModule):
    """Lightning's demo ``Transformer`` on generated token sequences (the next token is the current one plus one)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=16, ninp=16, nhead=2, nhid=32, nlayers=1)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        output = self.model(inputs, target)
        loss = nn.functional.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return user_optimizer(self.parameters(), 0.1)

    def train_dataloader(self):
        tokens = torch.randint(0, 15, (OPTIONS.samples // 4, 8), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(tokens, tokens + 1), batch_size=8, shuffle=True)


class Seen(Callback):
    def __init__(self) -> None:
        self.batches = self.validations = 0
        self.validated: list[tuple[int, float]] = []  # each validation's step and parameters (a checksum)
        self.fit_starts: list[int] = []  # the global step each fit started at

    def on_train_start(self, trainer, pl_module) -> None:
        self.fit_starts.append(trainer.global_step)

    def on_train_batch_start(self, *args, **kwargs) -> None:
        self.batches += 1

    def on_validation_start(self, trainer, pl_module) -> None:
        self.validations += not trainer.sanity_checking  # Lightning's default sanity check is not a validation

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit":
            self.validated.append((trainer.global_step, round(checksum(pl_module), 4)))


def checksum(module: torch.nn.Module) -> float:
    params = torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])
    return float(params.sum()) if torch.isfinite(params).all() else math.nan


def strategy_and_callbacks(feature: str, unused: bool = False) -> tuple[object, list[Callback]]:
    ddp = "ddp_find_unused_parameters_true" if unused else "ddp"  # what DDP needs for a model with an unused parameter
    if feature == "ddp":
        return ddp, []
    if feature == "ddp_hetero":
        return ddp, [
            HeteroBatchCallback(adjust_every_n_steps=4, verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=1))
        ]
    advanced = PSAdvanced(find_unused_parameters=unused)  # as DDP needs it: BSP trains through DDP's reducer
    if feature == "hybrid":
        strategy = AsyncPSStrategy(mode="bsp", fault_timeout_s=30, advanced=advanced)
        return strategy, [SyncSwitchCallback("bsp:0-0,asp:1-", verbose=False)]
    return AsyncPSStrategy(mode=feature, fault_timeout_s=30, advanced=advanced), []


def cell_setup(cell: str) -> tuple[L.LightningModule, L.LightningDataModule | None, dict]:
    samples, noise, classes = OPTIONS.samples, OPTIONS.noise, OPTIONS.classes
    data = SyntheticClassificationDataModule(samples, BATCH // 2, num_classes=classes, seed=OPTIONS.seed, noise=noise)
    kwargs: dict = {"max_epochs": OPTIONS.epochs}
    model: L.LightningModule = UserMLP(lr=0.1, num_classes=classes)
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
    elif cell == "val_check_batches":  # every 8 of a rank's 24 batches (DDP's count; a share of the pool otherwise)
        kwargs["val_check_interval"] = 8
    elif cell == "accumulate":
        kwargs["accumulate_grad_batches"] = 2
    elif cell == "cnn":
        model, data = SmallCNN(), ImageData(samples, BATCH // 2)
        kwargs["max_epochs"] = 3
    elif cell == "manual":
        model = ManualMLP()
    elif cell in ("boring", "transformer"):
        model = {"boring": BoringModel, "transformer": TinyTransformer}[cell]()
        data, kwargs = None, {"max_epochs": 2, "limit_val_batches": 4}
    return model, data, kwargs


def more_setup(feature: str, cell: str, data: L.LightningDataModule, kwargs: dict) -> tuple:
    """One of :data:`MORE_CELLS`: its model, data module, Trainer arguments and callbacks."""
    model = ProbeClassifier(
        scheduler=cell if cell in ("steplr", "plateau") else None, frozen_unused=cell == "frozen_unused"
    )
    callbacks: list[Callback] = []
    logs = OPTIONS.out / f"{cell}-{feature}"
    if cell == "resume":
        callbacks.append(ModelCheckpoint(dirpath=logs, save_last=True))
        kwargs.update(enable_checkpointing=True)
    elif cell == "early_stopping":  # val_loss falls by less than 0.3 in an epoch after the first: stops at epoch 2
        callbacks.append(EarlyStopping("val_loss", min_delta=0.3, patience=0))
        kwargs.update(max_epochs=4)
    elif cell == "clip":
        kwargs.update(gradient_clip_val=0.05)
    elif cell == "bf16":
        kwargs.update(precision="bf16-mixed")
    elif cell == "csv_logger":
        kwargs.update(logger=CSVLogger(logs), log_every_n_steps=4)
    elif cell == "fast_dev_run":
        kwargs.update(fast_dev_run=True)
    elif cell == "workers":
        data.num_workers = 1
    elif cell == "dict_batch":
        data.train_set, data.val_set = (DictBatches(*part.tensors) for part in (data.train_set, data.val_set))
    elif cell == "swa":
        callbacks.append(StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1))
        kwargs.update(max_epochs=3)
    elif cell == "compile":  # the network compiled inside the LightningModule, as docs/hetero_batch.md advises
        model.net = torch.compile(model.net, backend=OPTIONS.compile_backend)
        kwargs.update(max_epochs=1)  # compiling costs seconds a rank: one epoch shows it trains and validates
    return model, callbacks


def more_checks(cell: str, trainer: L.Trainer, model: ProbeClassifier, data, callbacks: list[Callback]) -> dict:
    """What :data:`MORE_CELLS`' test asserts, read after the fit (``evaluate`` also validates, tests and predicts)."""
    checks: dict = {**model.probe, "lr": trainer.optimizers[0].param_groups[0]["lr"]}
    metric = trainer.callback_metrics.get("val_metric_acc")
    checks["metric_acc"] = None if metric is None else float(metric)
    if cell == "early_stopping":
        checks["stopped_epoch"] = callbacks[0].stopped_epoch
    elif cell == "csv_logger" and trainer.global_rank == 0:
        checks["csv"] = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()
    elif cell == "workers":
        loader = trainer.train_dataloader
        checks["workers"] = loader.num_workers
        context = loader.multiprocessing_context
        checks["start_method"] = None if context is None else context.get_start_method()
    elif cell == "frozen_unused":
        checks["frozen"] = checksum(model.net[0])
        checks["unused"] = checksum(model.unused)
    elif cell == "swa":
        swa = callbacks[0]
        checks["averaged"] = checksum(swa._average_model)
        checks["n_averaged"] = int(swa.n_averaged)
    elif cell == "compile":
        checks["graphs"] = compiled_graphs()
    elif cell == "evaluate":
        checks["val_acc"] = trainer.validate(model, datamodule=data, verbose=False)[0]["val_acc"]
        checks["test_acc"] = trainer.test(model, dataloaders=data.val_dataloader(), verbose=False)[0]["test_acc"]
        predictions = trainer.predict(model, dataloaders=DataLoader(data.val_set, batch_size=32))
        checks["predicted"], checks["val_samples"] = sum(len(p) for p in predictions), len(data.val_set)
    return checks


def run_cell(feature: str, cell: str) -> dict:
    torch.manual_seed(OPTIONS.seed)
    model, data, kwargs = cell_setup(cell)
    more: list[Callback] = []
    if cell in MORE_CELLS:
        model, more = more_setup(feature, cell, data, kwargs)
    seen = Seen()

    def trainer_for(**settings) -> L.Trainer:
        strategy, callbacks = strategy_and_callbacks(feature, unused=cell == "frozen_unused")
        slow = SlowdownEmulator({1: 3.0}, throttle=OPTIONS.throttle)
        # Lightning's defaults as users run them (progress bar, model summary, default logger and checkpointing),
        # writing under the cell's own folder
        defaults = dict(default_root_dir=OPTIONS.out / f"{cell}-{feature}-root")
        return L.Trainer(
            accelerator="cpu", devices=2, strategy=strategy, callbacks=[*callbacks, slow, seen, *more],
            **{**defaults, **kwargs, **settings},
        )  # fmt: skip

    outcome: dict = {"status": "pass"}
    trainer = trainer_for(max_epochs=1) if cell == "resume" else trainer_for()
    try:
        if cell == "resume":  # one epoch saved as "last", then a new model and Trainer resume it for the second
            trainer.fit(model, datamodule=data)
            outcome["first_fit_steps"] = trainer.global_step
            model, trainer = ProbeClassifier(), trainer_for()
        trainer.fit(model, datamodule=data, ckpt_path="last" if cell == "resume" else None)
        if cell in MORE_CELLS:
            outcome["checks"] = more_checks(cell, trainer, model, data, more)
    except Exception as err:  # a refusal names the setting; anything after the first batch is an error
        outcome = {
            "status": "refused" if seen.batches == 0 else "error",
            "message": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(),
        }
    unvalidated = outcome["status"] == "pass" and "val_acc" not in trainer.callback_metrics
    if OPTIONS.final_validate and unvalidated and data is not None:
        trainer.validate(model, datamodule=data, verbose=False)
    acc, loss = (trainer.callback_metrics.get(name) for name in ("val_acc", "train_loss"))
    hetero = next((c for c in trainer.callbacks if isinstance(c, HeteroBatchCallback)), None)
    outcome.update(
        split=None if hetero is None or hetero.tuner is None else list(hetero.tuner.plan.current),
        batches=seen.batches,
        validations=seen.validations,
        validated=seen.validated,
        fit_starts=seen.fit_starts,
        global_step=trainer.global_step,
        checksum=checksum(model),
        val_acc=None if acc is None else float(acc),
        train_loss=None if loss is None else float(loss),
        epochs=trainer.current_epoch,
        lr=trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None,
    )
    return outcome


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("feature", choices=FEATURES)
    parser.add_argument(
        "cells", nargs="*", help=f"some of {CELLS + MORE_CELLS}, 'cell@seed' for another seed (default: all)"
    )
    parser.add_argument("--samples", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-time-s", type=float, default=2.0)
    parser.add_argument("--final-validate", action="store_true", help="validate after fit if the fit did not")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend in the compile cell")
    parser.add_argument("--throttle", choices=("sleep", "cfs"), default="sleep", help="how rank 1 is slowed")
    parser.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd", help="the models' optimizer")
    return parser.parse_args(argv)


OPTIONS = parse(sys.argv[1:])


def main() -> None:
    out, feature, cells = OPTIONS.out, OPTIONS.feature, OPTIONS.cells or [*CELLS, *MORE_CELLS]
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    results, base_seed, base_optimizer = {}, OPTIONS.seed, OPTIONS.optimizer
    for cell in cells:  # "cnn:adam@1": the cell with Adam and seed 1
        started = time.perf_counter()
        name, _, seed = cell.partition("@")
        name, _, optimizer = name.partition(":")
        OPTIONS.seed = int(seed) if seed else base_seed
        OPTIONS.optimizer = optimizer or base_optimizer
        results[cell] = run_cell(feature, name)
        results[cell]["seconds"] = round(time.perf_counter() - started, 2)
        print(f"{feature} {cell}: {results[cell]['status']}", file=sys.stderr, flush=True)  # where a crash happened
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    if torch.distributed.is_initialized():  # leave together: a rank exiting while gloo's threads run can abort
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
