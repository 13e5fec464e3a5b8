"""CPU training with ``AsyncPSStrategy(mode="local")`` (local SGD) on generated data; each rank writes JSON.

Usage: python local_train.py OUT_DIR [options]   (see ``--help``)

Rank k writes ``OUT_DIR/rank{k}.json``: the sample indices it trained on per epoch, its local batches per epoch, the
round plans, rounds and step total of the local mode, the trainer's global step, the mode history, a checksum of its
final parameters and buffers, and the validation accuracy.
"""

import argparse
import json
import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from ps_train import PSTestModel, checksum

from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.emulation import SlowdownEmulator
from lightning_hetero.switching import SyncSwitchCallback


class Recorder(Callback):
    def __init__(self) -> None:
        self.start: dict = {}
        self.batches: dict[int, int] = {}
        self.modes: dict[int, str] = {}
        self.val_checksums: dict[int, list[float]] = {}

    def on_train_start(self, trainer, pl_module):
        self.start = {"global_step": trainer.global_step, "checksum": checksum(pl_module)}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches[trainer.current_epoch] = self.batches.get(trainer.current_epoch, 0) + 1
        self.modes[trainer.current_epoch] = trainer.strategy.mode

    def on_validation_start(self, trainer, pl_module):
        self.val_checksums[trainer.current_epoch] = checksum(pl_module)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--round-samples", type=int, default=256)
    parser.add_argument("--local-steps", default="proportional")
    parser.add_argument("--slow-factor", type=float, default=1.0, help="SlowdownEmulator factor of rank 1")
    parser.add_argument("--schedule", default=None, help='a SyncSwitchCallback schedule, e.g. "bsp:0,local:1,asp:2-"')
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--batchnorm", action="store_true")
    parser.add_argument(
        "--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself after --kill-after batches"
    )
    parser.add_argument("--kill-after", type=int, default=5)
    parser.add_argument("--fault-timeout-s", type=float, default=60.0)
    parser.add_argument("--outer-nesterov", action="store_true", help="DiLoCo's outer Nesterov SGD (it has a state)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    strategy = AsyncPSStrategy(
        mode="bsp" if args.schedule else "local",
        round_length=f"{args.round_samples} samples",
        fault_timeout_s=args.fault_timeout_s,
        outer_optimizer_kwargs={"lr": 0.7, "momentum": 0.9, "nesterov": True} if args.outer_nesterov else None,
        advanced=PSAdvanced(local_steps=args.local_steps),
    )
    recorder = Recorder()
    callbacks = [recorder]
    if args.slow_factor != 1.0:
        callbacks.append(SlowdownEmulator(factors={1: args.slow_factor}))
    if args.schedule:
        callbacks.append(SyncSwitchCallback(args.schedule))
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_top_k=-1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=callbacks,
        default_root_dir=args.out,  # Lightning's defaults otherwise: progress bar, model summary, logger
        enable_checkpointing=bool(args.ckpt_dir),
        num_sanity_val_steps=0,
    )
    config = {
        **vars(args), "slow_rank": -1, "sleep_per_sample_s": 0.0, "hang": False,
        "optimizer": "sgd", "two_optimizers": False, "step_lr": 0,
    }  # fmt: skip
    model = PSTestModel(config)
    trainer.fit(model, ckpt_path=args.resume)
    rounds = strategy.local_rounds
    result = {
        "global_step": trainer.global_step,
        "version": strategy.version,
        "mode": strategy.mode,
        "seen": model.seen,
        "batches": recorder.batches,
        "modes": recorder.modes,
        "start": recorder.start,
        "val_checksums": recorder.val_checksums,
        "checksum": checksum(model),
        "buffers": [float(b.double().sum()) for b in model.buffers() if b.is_floating_point()],
        "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
        "logged_ps": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("ps/")},
        "losses": model.losses,
        "plans": rounds.plans if rounds is not None else None,
        "rounds": rounds.rounds if rounds is not None else None,
        "steps_total": rounds.steps_total if rounds is not None else None,
        "bytes_sent": rounds.bytes_sent if rounds is not None else None,
        "last_switch_s": strategy.last_switch_s,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
