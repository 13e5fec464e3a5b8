"""SyncSwitchCallback driving AsyncPSStrategy on 2 CPU ranks; each rank writes what it saw as JSON.

Usage: python switch_train.py OUT_DIR SCENARIO [CKPT_PATH]

Scenarios:
    schedule  "bsp:0,asp:1-2,bsp:3,asp:4-" over 6 epochs, checkpointing every epoch into OUT_DIR/ckpt.
    resume    the same schedule, resumed from CKPT_PATH.
    greedy    GreedyPolicy; rank 1 sleeps 80 ms per batch in epochs 2 and 3 (an injected transient straggler).
"""

import json
import logging
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.switching import GreedyPolicy, PhaseHyperparams, StragglerDetector
from lightning_hetero.switching.callback import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

SCHEDULE = "bsp:0,asp:1-2,bsp:3,asp:4-"
MAX_EPOCHS = 6


class StragglingModel(MLPClassifier):
    """Sleeps per batch on ``slow_rank`` in ``slow_epochs``, inside the rank's compute window (forward)."""

    def __init__(self, slow_rank=-1, slow_epochs=(), sleep_s=0.0, **kwargs):
        super().__init__(**kwargs)
        self.slow_rank, self.slow_epochs, self.sleep_s = slow_rank, set(slow_epochs), sleep_s

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.slow_rank and self.current_epoch in self.slow_epochs:
            time.sleep(self.sleep_s)
        return super().training_step(batch, batch_idx)


class ScheduledModel(MLPClassifier):
    """SGD with a chainable step-interval schedule (StepLR: x0.7 every 8 steps, i.e. twice per BSP epoch)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.5)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Recorder(Callback):
    """Per epoch: the mode training ran in, the learning rate, and a digest of the parameters at its start."""

    def __init__(self):
        self.epochs = {}

    def on_train_epoch_start(self, trainer, pl_module):
        flat = torch.cat([p.detach().flatten() for p in pl_module.parameters()]).double()
        self.epochs[trainer.current_epoch] = {
            "mode_at_start": trainer.strategy.mode,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "param_digest": [float(flat.sum()), float((flat * torch.arange(flat.numel())).sum())],
        }

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.epochs[trainer.current_epoch]["mode"] = trainer.strategy.mode


def main() -> None:
    out_dir, scenario = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    # quiet on every supported Lightning: seed_everything(verbose=False) is Lightning 2.4+
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    L.seed_everything(0)
    recorder = Recorder()
    callbacks = [recorder]
    model = ScheduledModel(lr=0.05)
    ckpt_path = None
    if scenario == "greedy":
        switch = SyncSwitchCallback(
            # the straggler computes at ~4% of its baseline; a 0.1 threshold leaves a wide margin against load spikes
            GreedyPolicy(),
            detector=StragglerDetector(threshold=0.1, k=3, baseline_measurements=4),
            warmup_steps=2,
        )
        model = StragglingModel(slow_rank=1, slow_epochs=(2, 3), sleep_s=0.08, lr=0.05)
    else:
        switch = SyncSwitchCallback(SCHEDULE, hyperparams={"asp": PhaseHyperparams(lr_scale=0.5)})
        if scenario == "schedule":
            callbacks.append(ModelCheckpoint(dirpath=out_dir / "ckpt", save_top_k=-1, filename="{epoch}"))
        else:
            ckpt_path = sys.argv[3]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=AsyncPSStrategy(mode="bsp", fault_timeout_s=60),
        max_epochs=MAX_EPOCHS,
        callbacks=[switch, *callbacks],
        logger=False,
        enable_checkpointing=scenario == "schedule",
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(
        model, datamodule=SyntheticClassificationDataModule(num_samples=512, batch_size=16), ckpt_path=ckpt_path
    )
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    result = {
        "rank": trainer.global_rank,
        "epochs": {str(e): record for e, record in recorder.epochs.items()},
        "history": switch.history,
        "switches": switch.switches,
        "final_param_digest": [float(flat.sum()), float((flat * torch.arange(flat.numel())).sum())],
        "detector_baseline": switch.detector.baseline,
        "summary": switch.summary(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{scenario}_rank{trainer.global_rank}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
