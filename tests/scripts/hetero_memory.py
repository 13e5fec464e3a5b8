"""Two ranks on gloo with HeteroBatchCallback(memory_caps="auto"); rank 1 raises torch.OutOfMemoryError for batches
above 24 samples. Each rank writes the samples it trained on, its guard's counts and the caps and split it ended with;
rank 0 saves the parameters. Under DDP the run ends with a checkpoint, ``caps.ckpt`` (every rank's cap gathered).

Usage: python hetero_memory.py OUT_DIR [ddp|asp] [step|backward]   (asp: AsyncPSStrategy(mode="asp"), whose own
training_step claims the batch's chunk of data: a step redone in chunks must claim once; backward: rank 1 runs out of
memory in the backward pass instead of in training_step)
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from lightning_hetero import AsyncPSStrategy, HeteroBatchCallback
from lightning_hetero.synthetic import MLPClassifier, make_classification


class CountingAsyncPS(AsyncPSStrategy):
    """Counts its own training_step calls: one per step (it claims the batch's data chunk)."""

    calls = 0

    def training_step(self, *args, **kwargs):
        self.calls += 1
        return super().training_step(*args, **kwargs)


class FailsInBackward(torch.autograd.Function):
    """The identity, whose backward raises torch.OutOfMemoryError on rank 1 above 24 samples."""

    @staticmethod
    def forward(ctx, logits, module):
        ctx.module = module
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx, grad):
        if ctx.module.global_rank == 1 and len(grad) > 24:
            raise torch.OutOfMemoryError(f"the backward of a batch of {len(grad)} does not fit")
        return grad, None


class RunsOutOfMemoryInBackward(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(num_features=8, num_classes=3, lr=0.5)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(FailsInBackward.apply(self(x), self), y)


class RunsOutOfMemory(MLPClassifier):
    def __init__(self) -> None:
        super().__init__(num_features=8, num_classes=3, lr=0.5)
        self.seen: list[int] = []
        self.steps = 0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.steps += 1

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and len(batch[0]) > 24:
            raise torch.OutOfMemoryError(f"a batch of {len(batch[0])} does not fit")
        self.seen += [int(i) for i in batch[0][:, -1].tolist()]
        return super().training_step(batch, batch_idx)


def main(out: Path, strategy: str, where: str) -> None:
    data = make_classification(320, num_features=8, num_classes=3, seed=1)
    indexed = [(torch.cat([x[:-1], torch.tensor([float(i)])]), y) for i, (x, y) in enumerate(data)]
    torch.manual_seed(0)
    model = RunsOutOfMemory() if where == "step" else RunsOutOfMemoryInBackward()
    hetero = HeteroBatchCallback(memory_caps="auto", verbose=False, adjust_every_n_steps=2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=CountingAsyncPS(mode="asp", fault_timeout_s=60)
        if strategy == "asp"
        else DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        max_epochs=2,
        callbacks=[hetero],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=DataLoader(indexed, batch_size=32, shuffle=True))
    guard = hetero._memory
    report = {
        "seen": model.seen,
        "redone": guard.redone,
        "chunked": guard.chunked,
        "caps": [None if c is None else int(c) for c in guard.caps.all],
        "final_split": list(hetero.batch_sizes),
        "steps": model.steps,
        "strategy_steps": getattr(trainer.strategy, "calls", None),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out / "params.pt")
    if strategy == "ddp" and where == "step":
        trainer.save_checkpoint(out / "caps.ckpt")  # every rank: the caps are gathered


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp", sys.argv[3] if len(sys.argv) > 3 else "step")
