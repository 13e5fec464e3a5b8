"""CPU training with ``AsyncPSStrategy`` on generated data; each rank writes what it saw as JSON.

Usage: python ps_train.py OUT_DIR [options]   (see ``--help``)

Rank k writes ``OUT_DIR/rank{k}.json``: the sample indices it trained on per epoch, its losses, the trainer's
global step, the strategy's version and mode, a checksum of its final parameters, the validation accuracy and
(rank 0) the parameter server's summary.
"""

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.hetero_batch import HeteroBatchAdvanced, HeteroBatchCallback
from lightning_hetero.synthetic import MLPClassifier, make_classification


class IndexedDataset(Dataset):
    """(features, label, index) triples, so each rank can report which samples it trained on."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.features[i], self.labels[i], i


class PSTestModel(MLPClassifier):
    def __init__(self, config: dict) -> None:
        super().__init__(lr=config["lr"], momentum=config["momentum"])
        args = self.args = argparse.Namespace(**config)
        if args.batchnorm:
            self.net.insert(1, nn.BatchNorm1d(self.hparams.hidden))
        self.seen: dict[int, list[int]] = {}
        self.losses: list[float] = []
        data = make_classification(args.samples + args.samples // 4, seed=0).tensors
        self.train_set = IndexedDataset(data[0][: args.samples], data[1][: args.samples])
        self.val_set = IndexedDataset(data[0][args.samples :], data[1][args.samples :])
        self.local_batches = 0
        self.val_seen: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        self.local_batches += 1
        if self.global_rank == self.args.slow_rank:
            time.sleep(self.args.sleep_per_sample_s * len(x))
        if self.global_rank == self.args.kill_rank and self.local_batches == self.args.kill_after:
            # what this rank pushed before dying: everything but the batch in hand
            pushed = {epoch: list(seen) for epoch, seen in self.seen.items()}
            pushed[self.current_epoch] = pushed[self.current_epoch][: -len(idx)]
            out = Path(self.args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank{self.global_rank}.lost.json").write_text(
                json.dumps({"pushed": pushed, "killed_at": time.time()})
            )
            sys.stdout.flush()
            if self.args.hang:
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.cross_entropy(self(x), y)
        self.losses.append(float(loss))
        self.log("train_loss", loss, sync_dist=True, prog_bar=False)
        return loss

    def on_validation_epoch_start(self):
        self.val_seen = []

    def validation_step(self, batch, batch_idx):
        x, y, idx = batch
        self.val_seen.extend(idx.tolist())
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        if self.args.optimizer == "adagrad":
            return torch.optim.Adagrad(self.parameters(), lr=self.hparams.lr)
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)
        if self.args.two_optimizers:
            return [optimizer, torch.optim.SGD(self.parameters(), lr=0.1)]
        if self.args.step_lr:
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=self.args.step_lr, gamma=0.9)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return optimizer

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.args.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=128)


class ManualModel(PSTestModel):
    """Manual optimization: ``zero_grad``, ``manual_backward`` of the step's loss, ``step``."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        opt.step()


class Recorder(Callback):
    """Records the start of training and switches mode at the configured epoch."""

    def __init__(self, switch_at_epoch: int, switch_to: str) -> None:
        self.switch_at_epoch = switch_at_epoch
        self.switch_to = switch_to
        self.start: dict = {}
        self.hyper_seen: dict[int, list] = {}  # epoch -> distinct (lr, momentum) of this rank's optimizer
        self.logged: dict[int, dict] = {}  # epoch -> the hyper-parameters in force as logged (rank 0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        group = trainer.optimizers[0].param_groups[0]
        seen = self.hyper_seen.setdefault(trainer.current_epoch, [])
        if [group["lr"], group.get("momentum")] not in seen:
            seen.append([group["lr"], group.get("momentum")])

    def on_train_start(self, trainer, pl_module):
        momentum = trainer.optimizers[0].state_dict()["state"]
        self.start = {
            "global_step": trainer.global_step,
            "checksum": checksum(pl_module),
            "momentum": [float(state["momentum_buffer"].double().sum()) for _, state in sorted(momentum.items())]
            if all("momentum_buffer" in state for state in momentum.values())
            else None,
        }

    def on_train_epoch_end(self, trainer, pl_module):
        metrics = trainer.callback_metrics
        self.logged[trainer.current_epoch] = {
            key: float(metrics[key]) for key in ("ps/momentum_effective", "ps/lr_effective") if key in metrics
        }
        if trainer.current_epoch == self.switch_at_epoch:
            trainer.strategy.set_mode(self.switch_to)


def checksum(module: nn.Module) -> list[float]:
    return [float(p.detach().double().sum()) for p in module.parameters()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1, help="one process per node, started separately")
    parser.add_argument("--on-worker-lost", default="fail")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--mode", default="asp")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--sleep-per-sample-s", type=float, default=0.0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-after", type=int, default=5)
    parser.add_argument("--hang", action="store_true", help="the --kill-rank rank hangs instead of exiting")
    parser.add_argument("--fault-timeout-s", type=float, default=60.0)
    parser.add_argument("--max-staleness", type=int, default=None)
    parser.add_argument("--lr-scaling", default="none")
    parser.add_argument("--compensation", default="auto", help='asynchrony_compensation ("none": None)')
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adagrad"))
    parser.add_argument("--switch-at-epoch", type=int, default=-1)
    parser.add_argument("--switch-to", default="bsp")
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--two-optimizers", action="store_true")
    parser.add_argument("--manual", action="store_true")
    parser.add_argument("--by-name", action="store_true", help='pass strategy="async_ps" (the registry entry)')
    parser.add_argument("--overlap-round-trip", action="store_true")
    parser.add_argument("--server-shards", type=int, default=1)
    parser.add_argument("--server-placement", default="worker")
    parser.add_argument("--hetero", default=None, help="HeteroBatchCallback initial batch sizes, e.g. 48,16")
    parser.add_argument("--batchnorm", action="store_true", help="a BatchNorm1d after the first layer")
    parser.add_argument("--early-stop-acc", type=float, default=None, help="EarlyStopping once val_acc reaches this")
    parser.add_argument("--step-lr", type=int, default=0, help="a StepLR (gamma 0.9) with interval='step'")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    strategy = AsyncPSStrategy(
        mode=args.mode,
        max_staleness=args.max_staleness,
        asynchrony_compensation=None if args.compensation == "none" else args.compensation,
        fault_timeout_s=args.fault_timeout_s,
        on_worker_lost=args.on_worker_lost,
        advanced=PSAdvanced(
            lr_scaling=args.lr_scaling,
            startup_timeout_s=args.startup_timeout_s,
            overlap_round_trip=args.overlap_round_trip,
            server_shards=args.server_shards,
            server_placement=args.server_placement,
        ),
    )
    recorder = Recorder(args.switch_at_epoch, args.switch_to)
    callbacks = [recorder]
    if args.hetero:
        sizes = [int(size) for size in args.hetero.split(",")]
        callbacks.append(
            HeteroBatchCallback(initial_batch_sizes=sizes, verbose=False, advanced=HeteroBatchAdvanced(deadband=10.0))
        )
    if args.early_stop_acc is not None:
        callbacks.append(
            EarlyStopping(monitor="val_acc", mode="max", stopping_threshold=args.early_stop_acc, patience=1000)
        )
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_top_k=-1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="async_ps" if args.by_name else strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=callbacks,
        default_root_dir=args.out,  # Lightning's defaults otherwise: progress bar, model summary, logger
        enable_checkpointing=bool(args.ckpt_dir),
        num_sanity_val_steps=0,
    )
    strategy = trainer.strategy
    model = (ManualModel if args.manual else PSTestModel)(vars(args))
    trainer.fit(model, ckpt_path=args.resume)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "version": strategy.version,
        "mode": strategy.mode,
        "last_switch_s": strategy.last_switch_s,
        "server_summary": strategy.server_summary,
        "seen": model.seen,
        "losses": model.losses,
        "checksum": checksum(model),
        "buffers": [float(b.double().sum()) for b in model.buffers() if b.is_floating_point()],
        "start": recorder.start,
        "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
        "staleness_logged": {
            key: float(trainer.callback_metrics[key])
            for key in ("ps/staleness", "ps/staleness_max")
            if key in trainer.callback_metrics
        },
        "local_batches": model.local_batches,
        "val_seen": model.val_seen,
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
        "scheduler_steps": [config.scheduler.last_epoch for config in trainer.lr_scheduler_configs],
        "hyper_seen": recorder.hyper_seen,
        "logged_hyper": recorder.logged,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # an undestroyed gloo group can abort the interpreter at exit


if __name__ == "__main__":
    main()
