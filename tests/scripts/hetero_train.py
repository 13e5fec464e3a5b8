"""Multi-process HeteroBatchCallback runs for the tests; each rank writes what it saw as JSON.

Usage: python hetero_train.py OUT_DIR MODE [options]; modes:
  grad    one optimizer step with initial split [3, 13] on 16 samples; rank 0 saves the parameters
  exact   4 steps in float64 (precision="64-true") with gradient clipping, split [3, 13] changed to [11, 5] after the
          first step; every rank saves its batches, parameters and (pre-clipping) gradients per step
  manual  as exact, with manual optimization (``--optimizer`` SGD or Adam), no clipping, and Lightning's defaults on
          (progress bar, model summary, logger and checkpointing under OUT_DIR)
  slow    rank 1 is 4x slower (a per-sample sleep); the callback should shift samples to rank 0
  resume  like slow, but resumes from OUT_DIR/last.ckpt when it exists and records the split it starts with
  cfs     rank 1 under an emulated CFS quota of 1/4 CPU (SlowdownEmulator(throttle="cfs")); the model has BatchNorm
          (DDP broadcasts its buffers in every forward) and logs with sync_dist=True in training_step, so a fast rank
          waits for the throttled one inside its step in two more places
"""

import argparse
import json
import logging
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader

from lightning_hetero import AsyncPSStrategy, HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule, make_classification


class SlowRankModel(MLPClassifier):
    """Sleeps ``per_sample_s x batch`` in forward (x4 on ``slow_rank``): an emulated per-sample compute cost."""

    def __init__(self, per_sample_s: float, slow_rank: int, factor: float = 4.0) -> None:
        super().__init__()
        self.per_sample_s, self.slow_rank, self.factor = per_sample_s, slow_rank, factor

    def forward(self, x):
        slowdown = self.factor if self.global_rank == self.slow_rank else 1.0
        time.sleep(self.per_sample_s * slowdown * x.shape[0])
        return super().forward(x)


class QuotaModel(MLPClassifier):
    """Compute emulated by a per-sample sleep that counts as CPU time for the CFS emulator; BatchNorm and a
    sync_dist log put two collectives inside every step."""

    def __init__(self, per_sample_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Tanh(), torch.nn.Linear(64, 4)
        )
        self.per_sample_s = per_sample_s
        self.emulated_cpu_s = 0.0

    def forward(self, x):
        seconds = 0.001 + self.per_sample_s * x.shape[0]
        time.sleep(seconds)
        self.emulated_cpu_s += seconds
        return super().forward(x)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
        self.log("synced_loss", loss, sync_dist=True)
        return loss


class Recorder(Callback):
    def __init__(self, hetero: HeteroBatchCallback) -> None:
        self.hetero = hetero
        self.local_sizes: list[int] = []
        self.weight_mismatches = 0
        self.start_split = None

    def on_train_start(self, trainer, pl_module):
        self.start_split = list(self.hetero.batch_sizes)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.local_sizes.append(int(batch[0].shape[0]))
        # the callback (earlier in the list) has just set the size it weights this batch's gradient by
        self.weight_mismatches += int(self.hetero._local_batch_size != int(batch[0].shape[0]))


def trainer_for(args, callbacks, **kwargs):
    kwargs.setdefault("logger", False)
    if args.strategy == "asp":
        strategy = AsyncPSStrategy(mode="asp", fault_timeout_s=60)
    elif args.strategy == "fsdp":  # Lightning's FSDP needs CUDA (and NCCL)
        strategy = FSDPStrategy(process_group_backend=args.backend, timeout=timedelta(seconds=60))
    else:
        strategy = DDPStrategy(process_group_backend=args.backend, timeout=timedelta(seconds=60))
    return L.Trainer(
        accelerator=args.accelerator,
        devices=2,
        strategy=strategy,
        callbacks=callbacks,  # Lightning's progress bar and model summary on, as users run it
        **kwargs,
    )


def run_grad(args):
    torch.manual_seed(0)
    model = MLPClassifier(num_features=8, num_classes=3, lr=0.5)
    data = make_classification(16, num_features=8, num_classes=3, seed=1)
    loader = DataLoader(data, batch_size=8, shuffle=False)
    hetero = HeteroBatchCallback(initial_batch_sizes=[3, 13], verbose=False)
    recorder = Recorder(hetero)
    trainer = trainer_for(args, [hetero, recorder], max_steps=1, enable_checkpointing=False)
    trainer.fit(model, train_dataloaders=loader)
    state = trainer.strategy.lightning_module_state_dict()  # FSDP: a collective gathering the full parameters
    if trainer.is_global_zero:
        torch.save(state, args.out / "params.pt")
    return {"local_sizes": recorder.local_sizes}


class StepTrace(Callback):
    """Records each step's batch, parameters and gradients (before clipping), and changes the split after step 0."""

    def __init__(self, hetero: HeteroBatchCallback, new_split: list[int]) -> None:
        self.hetero, self.new_split = hetero, new_split
        self.steps: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        params = {name: p.detach().clone() for name, p in pl_module.named_parameters()}
        self.steps.append({"x": batch[0].clone(), "y": batch[1].clone(), "params": params})

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps[-1]["grads"] = {name: p.grad.detach().clone() for name, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 0:  # after the batches already produced (prefetching), identically on every rank
            self.hetero.tuner.plan.change_at(self.hetero.sampler.produced_position + 1, self.new_split)


def run_exact(args):
    torch.manual_seed(0)
    model = MLPClassifier(num_features=8, num_classes=3, lr=0.5)
    x, y = make_classification(64, num_features=8, num_classes=3, seed=1).tensors
    loader = DataLoader(torch.utils.data.TensorDataset(x.double(), y), batch_size=8)
    hetero = HeteroBatchCallback(initial_batch_sizes=[3, 13], verbose=False)
    trace = StepTrace(hetero, [11, 5])
    trainer = trainer_for(
        args, [hetero, trace], max_steps=4, enable_checkpointing=False, precision="64-true", gradient_clip_val=0.05
    )
    trainer.fit(model, train_dataloaders=loader)
    final = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save({"steps": trace.steps, "final": final}, args.out / f"trace_rank{trainer.global_rank}.pt")
    return {"local_sizes": [len(step["y"]) for step in trace.steps]}


class ManualMLP(MLPClassifier):
    """Manual optimization as Lightning's docs write it: ``zero_grad``, ``manual_backward``, ``step``."""

    def __init__(self, optimizer: str) -> None:
        super().__init__(num_features=8, num_classes=3, lr=0.5)
        self.automatic_optimization = False
        self.optimizer_name = optimizer

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("train_loss", loss, prog_bar=True)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=0.05)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def run_manual(args):
    torch.manual_seed(0)
    model = ManualMLP(args.optimizer)
    x, y = make_classification(64, num_features=8, num_classes=3, seed=1).tensors
    loader = DataLoader(torch.utils.data.TensorDataset(x.double(), y), batch_size=8)
    hetero = HeteroBatchCallback(initial_batch_sizes=[3, 13], verbose=False)
    trace = StepTrace(hetero, [11, 5])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        callbacks=[hetero, trace],
        max_steps=4,
        precision="64-true",
        default_root_dir=args.out / "root",
        log_every_n_steps=1,
    )
    trainer.fit(model, train_dataloaders=loader)
    final = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save({"steps": trace.steps, "final": final}, args.out / f"trace_rank{trainer.global_rank}.pt")
    return {"local_sizes": [len(step["y"]) for step in trace.steps], "global_step": trainer.global_step}


def run_slow(args, resume: bool = False):
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    extra: list[Callback] = []
    if args.mode == "cfs":
        model = QuotaModel(per_sample_s=args.per_sample_s)
        cpu_clock = lambda: time.process_time() + model.emulated_cpu_s  # noqa: E731
        extra.append(SlowdownEmulator(factors={1: 4.0}, throttle="cfs", cpu_clock=cpu_clock))
    else:
        model = SlowRankModel(per_sample_s=args.per_sample_s, slow_rank=1)
    dm = SyntheticClassificationDataModule(num_samples=args.samples, batch_size=32, num_workers=args.num_workers)
    # BatchNorm needs two samples per rank in training
    hetero = HeteroBatchCallback(
        adjust_every_n_steps=args.adjust_every,
        min_batch_size=2 if extra else 1,
        advanced=HeteroBatchAdvanced(warmup_steps=2, deadband=0.05),
    )
    recorder = Recorder(hetero)
    checkpoint = ModelCheckpoint(
        dirpath=args.out, save_last=True, save_top_k=0, every_n_train_steps=args.ckpt_every or None
    )
    ckpt = args.out / "last.ckpt"
    logger = CSVLogger(args.out, name="logs", version=args.mode + args.tag)
    trainer = trainer_for(
        args,
        [hetero, recorder, checkpoint, *extra],
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        limit_val_batches=0,
        logger=logger,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt) if resume and ckpt.exists() else None)
    return {
        "start_split": recorder.start_split,
        "final_split": list(hetero.batch_sizes),
        "throughputs": list(hetero.tuner.throughputs or []),
        "own_throughput": hetero.meter.value,
        "adjustments": len(hetero.history),
        "history": [{"step": h["step"], "to": list(h["to"]), "reason": h["reason"]} for h in hetero.history],
        "local_sizes": recorder.local_sizes,
        "weight_mismatches": recorder.weight_mismatches,
        "global_step": trainer.global_step,
        "summary": hetero.summary(),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("mode", choices=["grad", "exact", "manual", "slow", "resume", "cfs"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--adjust-every", type=int, default=None)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--per-sample-s", type=float, default=0.0005)
    parser.add_argument("--tag", default="")
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--ckpt-every", type=int, default=0, help="also checkpoint every n training steps")
    parser.add_argument("--strategy", choices=["ddp", "asp", "fsdp"], default="ddp")
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="manual mode's optimizer")
    args = parser.parse_args()
    args.backend = "nccl" if args.accelerator == "cuda" else "gloo"
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode in ("grad", "exact", "manual"):
        result = {"grad": run_grad, "exact": run_exact, "manual": run_manual}[args.mode](args)
    else:
        result = run_slow(args, resume=args.mode == "resume")
    rank = int(torch.distributed.get_rank())
    (args.out / f"{args.mode}{args.tag}_rank{rank}.json").write_text(json.dumps(result))
    # gloo can abort at interpreter exit if its process group is left alive
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
