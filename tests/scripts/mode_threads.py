"""Two CPU ranks train a small MLP for 2 epochs with Lightning's defaults; each rank writes, at the end of each
training epoch, its Python threads, its resident memory, whether ASP's server, client and messages exist and whether
the model trains through DDP's reducer, as JSON.

Usage: python mode_threads.py OUT_DIR RUN [HIDDEN]  (the MLP's hidden width, default 256)

Runs: ``ddp`` (Lightning's DDPStrategy), ``bsp``, ``local`` and ``asp`` (AsyncPSStrategy in that mode), and
``switch`` (SyncSwitchCallback: BSP in epoch 0, ASP in epoch 1; the first switch's seconds are recorded).
"""

import json
import logging
import sys
import threading
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.switching import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


def resident_mb() -> float:
    """This process's resident memory (Linux's ``VmRSS``)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def reducer_census(model) -> dict:
    """Whether the strategy's model is wrapped in DDP now, and whether its reducer rebuilt its buckets (which it does
    after the first backward through it)."""
    if not isinstance(model, DistributedDataParallel):
        return {"ddp_wrapped": False}
    return {"ddp_wrapped": True, "buckets_rebuilt": bool(model._get_ddp_logging_data().get("has_rebuilt_buckets"))}


class Census(Callback):
    """At each training epoch's end: the threads alive and what of ASP this rank holds."""

    def __init__(self):
        self.epochs = []

    def on_train_epoch_end(self, trainer, pl_module):
        strategy = trainer.strategy
        run = getattr(strategy, "_run", None)
        servers = run.ctx.servers if run is not None else None
        self.epochs.append(
            {
                "mode": getattr(strategy, "mode", "ddp"),
                "threads": threading.active_count(),
                "names": sorted(thread.name for thread in threading.enumerate()),
                "server": servers is not None and servers.hosted is not None,
                "client": servers is not None and servers.client is not None,
                "server_loop": servers is not None and servers.loop is not None,
                "rss_mb": resident_mb(),
                **reducer_census(strategy.model),
            }
        )


def main(out_dir: Path, run: str, hidden: int = 256) -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    L.seed_everything(0)
    census = Census()
    before_mb = resident_mb()
    callbacks = [census]
    if run == "ddp":
        strategy = "ddp"
    elif run == "switch":
        strategy = AsyncPSStrategy(mode="bsp")
        callbacks.append(SyncSwitchCallback(policy="bsp:0,asp:1-", verbose=False))
    else:
        strategy = AsyncPSStrategy(mode=run)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=2, strategy=strategy, max_epochs=2, callbacks=callbacks,
        default_root_dir=str(out_dir / run), limit_val_batches=2,
    )  # fmt: skip
    trainer.fit(MLPClassifier(hidden=hidden), SyntheticClassificationDataModule(num_samples=512, batch_size=32))
    switch_s = getattr(trainer.strategy, "last_switch_s", None)
    report = {"epochs": census.epochs, "last_switch_s": switch_s, "rss_before_fit_mb": before_mb}
    (out_dir / f"{run}_rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:4]))
