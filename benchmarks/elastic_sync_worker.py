"""One worker of a synchronous elastic job (``ElasticHeteroBatchStrategy``) on generated data; start one per
"machine" (``elastic_job.ElasticJob(..., worker=...)`` does).

Usage: python benchmarks/elastic_sync_worker.py OUT_DIR --lighthouse http://localhost:PORT [--start-lighthouse] [...]

Appends one JSON line per committed step to ``OUT_DIR/commits-<name>-<pid>.jsonl`` (its ``CommitRecord``, this
worker's samples in the step, the time and the seconds since the process started), writes
``OUT_DIR/worker-<name>-<pid>.json`` at the end (its report, validation accuracy, epochs, parameter checksum) and a
failure to ``OUT_DIR/error-<name>-<pid>.txt``. A sleep per training step (``--step-sleep-s``) or per sample of the
worker's share (``--sample-sleep-s``) emulates a slower machine.
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
from lightning.pytorch.callbacks import Callback

from lightning_hetero.elastic import CommitRecord, ElasticHeteroBatchStrategy
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


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


class StopFile(Callback):
    """Stops training after the epoch count written in ``path`` (every worker reads the same count)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.path.exists() and trainer.current_epoch + 1 >= int(self.path.read_text()):
            trainer.should_stop = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--start-lighthouse", action="store_true")
    parser.add_argument("--name", default="worker")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--sample-sleep-s", type=float, default=0.0)
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--no-shuffle", action="store_true", help="the training set in its order every epoch")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--started-at", type=float, default=None, help="time.time() when the process was started")
    args = parser.parse_args()
    started_at = args.started_at or time.time()
    torch.set_num_threads(1)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(args.seed)
    out = Path(args.out)
    tag = f"{args.name}-{os.getpid()}"
    strategy = ElasticHeteroBatchStrategy(
        lighthouse=args.lighthouse,
        start_lighthouse=args.start_lighthouse,
        replica_id=args.name,
        min_workers=args.min_workers,
        step_timeout_s=30,
        device=args.device,
    )
    log = (out / f"commits-{tag}.jsonl").open("a", buffering=1)
    counted = [0]

    def on_commit(record: CommitRecord) -> None:
        own = strategy.report["samples"] - counted[0]
        counted[0] = strategy.report["samples"]
        now = time.time()
        row = {**dataclasses.asdict(record), "own_samples": own, "t": now, "since_start_s": now - started_at}
        log.write(json.dumps(row) + "\n")

    strategy.on_commit = on_commit
    data = SyntheticClassificationDataModule(
        num_samples=args.samples, batch_size=args.batch_size, shuffle=not args.no_shuffle, seed=args.seed
    )
    model = SleepyMLP(args.step_sleep_s, args.sample_sleep_s, hidden=args.hidden)
    trainer = L.Trainer(
        accelerator="gpu" if args.device.startswith("cuda") else "cpu",
        devices=1,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=[StopFile(args.stop_file)] if args.stop_file else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    try:
        trainer.fit(model, datamodule=data)
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
    }
    (out / f"worker-{tag}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
