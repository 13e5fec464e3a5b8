"""One worker of an elastic job on generated data; start one per "machine". By default the job trains local SGD
(``ElasticLocalSGDStrategy``); with ``--sync`` synchronous steps of a constant global batch
(``ElasticHeteroBatchStrategy``, the loader's ``--batch-size``).

Usage: python examples/elastic/elastic_worker.py OUT_DIR --lighthouse http://localhost:PORT [--start-lighthouse]
[--sync] [...]

The worker appends one JSON line per committed round (or step) to ``OUT_DIR/commits-<name>-<pid>.jsonl`` (its
``CommitRecord``: the epoch, the chunks it and all trained, the step, the parameters' digests; the time, and the
seconds from the process's start to the end of its imports and of its join; with ``--sync`` also ``own_samples``,
this worker's samples in the step) and at the end writes ``OUT_DIR/worker-<name>-<pid>.json`` (its report,
validation accuracy, epochs, parameter checksum). A failure is written to ``OUT_DIR/error-<name>-<pid>.txt``.
Speeds are emulated by a sleep per step (``--step-sleep-s``) or per sample of the batch (``--sample-sleep-s``), or by
real CPU work per step (``--spin-s``) under a CPU quota (``--cpu-quota``, ``SlowdownEmulator(throttle="cfs")``).
With ``--hold-file`` the worker's training batches wait until that file exists (a test orders the workers' rounds).
"""

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import TensorDataset

from lightning_hetero import SlowdownEmulator
from lightning_hetero.elastic import (
    CommitRecord,
    ElasticHeteroBatchAdvanced,
    ElasticHeteroBatchStrategy,
    ElasticLocalSGDAdvanced,
    ElasticLocalSGDStrategy,
)
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule, make_classification


class SleepyMLP(MLPClassifier):
    """The synthetic MLP, each training step ``step_sleep_s`` plus ``sample_sleep_s`` per sample longer (an emulated
    slower machine)."""

    def __init__(self, step_sleep_s: float, sample_sleep_s: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_sleep_s = step_sleep_s
        self.sample_sleep_s = sample_sleep_s

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_sleep_s + self.sample_sleep_s * len(batch[1]))
        return super().training_step(batch, batch_idx)


class SpinMLP(MLPClassifier):
    """The synthetic MLP, each training step ``spin_s`` seconds of real CPU work longer (a busy loop), for a CPU quota
    (``SlowdownEmulator(throttle="cfs")``) to throttle."""

    def __init__(self, spin_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spin_s = spin_s

    def training_step(self, batch, batch_idx):
        until = time.process_time() + self.spin_s
        while time.process_time() < until:
            pass
        return super().training_step(batch, batch_idx)


class StopFile(Callback):
    """Stops training after the epoch count written in ``path`` (every worker reads the same count, so all stop at
    the same epoch)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.path.exists() and trainer.current_epoch + 1 >= int(self.path.read_text()):
            trainer.should_stop = True


class HoldFile(Callback):
    """Each training batch waits until ``path`` exists (so the worker stays out of round ends until a test lets it
    go on; joining the job, before the first batch, is not held)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        while not self.path.exists():
            time.sleep(0.02)


#: the strategies' timeouts (``round``: local SGD's, ``step``: ``--sync``'s)
TIMEOUTS = ("round", "step", "join", "heartbeat", "startup")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--start-lighthouse", action="store_true")
    parser.add_argument("--sync", action="store_true", help="ElasticHeteroBatchStrategy: a constant global batch")
    parser.add_argument("--name", default="worker")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--round-length", type=int, default=4, help="local SGD only: local steps per worker")
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--sample-sleep-s", type=float, default=0.0)
    parser.add_argument("--spin-s", type=float, default=0.0, help="CPU seconds of busy work per training step")
    parser.add_argument("--cpu-quota", type=float, default=None, help="CPUs (SlowdownEmulator's CFS quota, < 1)")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.5, help="the generated clusters' spread (harder: larger)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--no-shuffle", action="store_true", help="the training set in its order every epoch")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    for timeout in TIMEOUTS:
        parser.add_argument(f"--{timeout}-timeout-s", type=float, default=None, help="default: the strategy's")
    parser.add_argument("--started-at", type=float, default=None, help="time.time() when the process was started")
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--stop-file", default=None, help="holds an epoch count E: training stops after epoch E")
    parser.add_argument("--hold-file", default=None, help="training batches wait until this file exists")
    args = parser.parse_args()
    started_at = args.started_at or time.time()
    imported_s = time.time() - started_at  # the imports above: most of a worker's start-up
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.name}-{os.getpid()}"
    constructed_s = time.time() - started_at
    settings = {
        f"{timeout}_timeout_s": value
        for timeout in TIMEOUTS
        if (value := getattr(args, f"{timeout}_timeout_s")) is not None
    }
    # the lighthouse's timeouts are both strategies' expert knobs
    knobs = {name: settings.pop(name) for name in ("join_timeout_s", "heartbeat_timeout_s", "startup_timeout_s")
             if name in settings}  # fmt: skip
    settings |= {"start_lighthouse": args.start_lighthouse, "replica_id": args.name, "device": args.device}
    settings |= {"lighthouse": args.lighthouse, "min_workers": args.min_workers}
    if args.sync:
        if "round_timeout_s" in settings:
            parser.error("--round-timeout-s is local SGD's: with --sync, --step-timeout-s")
        strategy = ElasticHeteroBatchStrategy(advanced=ElasticHeteroBatchAdvanced(**knobs), **settings)
    else:
        if "step_timeout_s" in settings:
            parser.error("--step-timeout-s is --sync's: for local SGD, --round-timeout-s")
        advanced = ElasticLocalSGDAdvanced(**knobs)
        strategy = ElasticLocalSGDStrategy(round_length=args.round_length, advanced=advanced, **settings)
    log = (out / f"commits-{tag}.jsonl").open("a", buffering=1)
    counted = [0]

    def on_commit(record: CommitRecord) -> None:
        now = time.time()
        times = {"t": now, "since_start_s": now - started_at, "imported_s": imported_s}
        if "joined_s" in strategy.report:  # from the process's start to the end of its join
            times["joined_s"] = constructed_s + strategy.report["joined_s"]
        if "samples" in strategy.report:  # --sync: this worker's samples in the step
            times["own_samples"] = strategy.report["samples"] - counted[0]
            counted[0] = strategy.report["samples"]
        log.write(json.dumps({**dataclasses.asdict(record), **times}) + "\n")

    strategy.on_commit = on_commit
    data = SyntheticClassificationDataModule(
        num_samples=args.samples,
        batch_size=args.batch_size,
        num_classes=args.classes,
        shuffle=not args.no_shuffle,
        seed=args.seed,
    )
    if args.noise != 0.5:
        drawn = make_classification(args.samples * 5 // 4, num_classes=args.classes, seed=args.seed, noise=args.noise)
        x, y = drawn.tensors
        data.train_set = TensorDataset(x[: args.samples], y[: args.samples])
        data.val_set = TensorDataset(x[args.samples :], y[args.samples :])
    if args.spin_s:
        model = SpinMLP(args.spin_s, hidden=args.hidden, lr=args.lr, num_classes=args.classes)
    else:
        model = SleepyMLP(
            args.step_sleep_s, args.sample_sleep_s, hidden=args.hidden, lr=args.lr, num_classes=args.classes
        )
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True)] if args.ckpt_dir else []
    if args.cpu_quota is not None:  # each worker is rank 0 of its own trainer
        callbacks.append(SlowdownEmulator(factors={0: 1.0 / args.cpu_quota}, throttle="cfs"))
    if args.stop_file:
        callbacks.append(StopFile(args.stop_file))
    if args.hold_file:
        callbacks.append(HoldFile(args.hold_file))
    trainer = L.Trainer(
        accelerator="gpu" if args.device.startswith("cuda") else "cpu",
        devices=1,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(args.ckpt_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    try:
        trainer.fit(model, datamodule=data, ckpt_path=args.resume)
    except Exception as err:
        (out / f"error-{tag}.txt").write_text(f"{type(err).__name__}: {err}")
        raise
    result = {
        "name": args.name,
        "report": strategy.report,
        "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "checksum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "wall_s": time.time() - started_at,
    }
    (out / f"worker-{tag}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
