"""memory_caps="auto": caps lowered by out-of-memory errors, steps redone in chunks with the same gradient."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_hetero import HeteroBatchCallback
from lightning_hetero.hetero_batch.memory import (
    MemoryCaps,
    MemoryGuard,
    cap_from_memory,
    restore_caps,
    saved_caps,
)
from lightning_hetero.synthetic import MLPClassifier, make_classification
from tests.helpers import read_json, single_device_trainer


class RunsOutOfMemory(MLPClassifier):
    """Raises torch.OutOfMemoryError in forward for batches above ``limit`` samples; records the samples it trains on
    (the dataset's last feature holds each sample's index)."""

    def __init__(self, limit: int | None) -> None:
        super().__init__(num_features=8, num_classes=3, lr=0.5)
        self.limit, self.seen = limit, []

    def training_step(self, batch, batch_idx):
        if self.limit is not None and len(batch[0]) > self.limit:
            raise torch.OutOfMemoryError(f"a batch of {len(batch[0])} does not fit")
        self.seen += batch[0][:, -1].tolist()
        return super().training_step(batch, batch_idx)


class _FailsInBackward(torch.autograd.Function):
    """The identity, whose backward raises torch.OutOfMemoryError above ``module.limit`` samples and otherwise
    records the samples whose gradient it passed on."""

    @staticmethod
    def forward(ctx, logits, index, module):
        ctx.index, ctx.module = index, module
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx, grad):
        if ctx.module.limit is not None and len(grad) > ctx.module.limit:
            raise torch.OutOfMemoryError(f"the backward of a batch of {len(grad)} does not fit")
        ctx.module.seen += ctx.index.tolist()
        return grad, None, None


class RunsOutOfMemoryInBackward(RunsOutOfMemory):
    """Runs out of memory in the backward pass above ``limit`` samples; ``seen`` holds the samples back-propagated."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = _FailsInBackward.apply(self(x), x[:, -1], self)
        return torch.nn.functional.cross_entropy(logits, y)


def _indexed(samples: int):
    data = make_classification(samples, num_features=8, num_classes=3, seed=1)
    return [(torch.cat([x[:-1], torch.tensor([float(i)])]), y) for i, (x, y) in enumerate(data)]


def _fit(limit, memory_caps, model_class=RunsOutOfMemory, accumulate=1, samples=96, multiple="auto"):
    torch.manual_seed(0)
    model = model_class(limit)
    callback = HeteroBatchCallback(memory_caps=memory_caps, verbose=False, batch_size_multiple=multiple)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=DataLoader(_indexed(samples), batch_size=32, shuffle=True))
    return model, callback


def test_an_out_of_memory_step_is_redone_in_chunks_with_the_big_batch_gradient():
    reference, _ = _fit(limit=None, memory_caps=None)
    model, callback = _fit(limit=20, memory_caps="auto")
    guard = callback._memory
    assert guard.redone == 1 and guard.chunked == 5  # the first step failed; the other five ran in chunks
    assert guard.caps.own == 18  # 3/4 of 32 = 24 failed too (over 20); 3/4 of 24 = 18 fits
    assert sorted(model.seen) == sorted(reference.seen) == sorted(2 * list(range(96)))  # every sample once an epoch
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_an_out_of_memory_backward_is_redone_in_chunks_with_the_big_batch_gradient():
    reference, _ = _fit(limit=None, memory_caps=None, model_class=RunsOutOfMemoryInBackward)
    model, callback = _fit(limit=20, memory_caps="auto", model_class=RunsOutOfMemoryInBackward)
    guard = callback._memory
    # 32 failed in Lightning's backward (the closure redone); 24 in its first chunk's backward, inside the step's guard
    assert guard.caps.own == 18 and guard.redone == 2
    assert guard.chunked == 5  # the other five steps ran in chunks of 18
    assert sorted(model.seen) == sorted(reference.seen) == sorted(2 * list(range(96)))  # every sample once an epoch
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_an_out_of_memory_backward_under_accumulation_says_how_to_cap():
    with pytest.raises(
        torch.OutOfMemoryError, match=r"rank 0 ran out of memory in backward at a batch of 32.*memory_caps=\[\.\.\.\]"
    ):
        _fit(limit=20, memory_caps="auto", model_class=RunsOutOfMemoryInBackward, accumulate=3)


def _resumed(checkpoint, limit=20):
    """Two epochs of `_fit`'s run resumed from ``checkpoint`` (taken after its first): the resumed callback."""
    torch.manual_seed(0)
    callback = HeteroBatchCallback(memory_caps="auto", verbose=False)
    trainer = single_device_trainer(callback, max_epochs=2)
    loader = DataLoader(_indexed(96), batch_size=32, shuffle=True)
    trainer.fit(RunsOutOfMemory(limit), train_dataloaders=loader, ckpt_path=checkpoint)
    return callback


def test_learnt_caps_are_checkpointed_and_a_resumed_run_starts_within_them(tmp_path):
    torch.manual_seed(0)
    callback = HeteroBatchCallback(memory_caps="auto", verbose=False)
    trainer = single_device_trainer(callback)
    trainer.fit(RunsOutOfMemory(limit=20), train_dataloaders=DataLoader(_indexed(96), batch_size=32, shuffle=True))
    trainer.save_checkpoint(tmp_path / "epoch0.ckpt")
    held = torch.load(tmp_path / "epoch0.ckpt", weights_only=False)
    assert held["callbacks"]["HeteroBatchCallback"]["memory_caps"] == [18]  # learnt from the errors of epoch 0
    resumed = _resumed(tmp_path / "epoch0.ckpt")._memory
    assert resumed.caps.own == 18 and resumed.redone == 0 and resumed.chunked == 3  # no error: chunks from the start
    # a checkpoint without caps (before they were saved) still loads: the cap is learnt again
    del held["callbacks"]["HeteroBatchCallback"]["memory_caps"]
    torch.save(held, tmp_path / "old.ckpt")
    relearnt = _resumed(tmp_path / "old.ckpt")._memory
    assert relearnt.caps.own == 18 and relearnt.redone == 1


def test_memory_caps_auto_on_cpu_says_what_it_can_do(caplog):
    with caplog.at_level("INFO"):
        _fit(limit=None, memory_caps="auto")
    assert "cpu memory cannot be measured here" in caplog.text


def test_bad_memory_caps_and_multiples_name_the_setting():
    with pytest.raises(ValueError, match="memory_caps must be 'auto'"):
        HeteroBatchCallback(memory_caps="automatic")
    with pytest.raises(ValueError, match="batch_size_multiple"):
        HeteroBatchCallback(batch_size_multiple=0)


def test_caps_lower_geometrically_and_round_to_the_multiple():
    caps = MemoryCaps(world_size=2, rank=0, multiple=8)
    assert caps.lower(64) == 48 and caps.lower(48) == 32 and caps.lower(5) == 3
    assert caps.estimate(100) == 3  # an estimate never raises a cap learnt from an error


def test_cap_from_memory():
    assert cap_from_memory(step_bytes=3200, batch_size=32, available_bytes=9600) == 86  # 100 B a sample, 90% of 9600


class SizesSeen(RunsOutOfMemory):
    """Records the size of every piece its training_step runs."""

    def training_step(self, batch, batch_idx):
        self.sizes = [*getattr(self, "sizes", []), len(batch[0])]
        return super().training_step(batch, batch_idx)


def test_chunks_after_an_out_of_memory_step_are_multiples_of_batch_size_multiple():
    """32 fails (over 20): 3/4 of it, 24, fails too; 3/4 of 24 is 18, rounded down to 16. The epoch's last batch
    of 26 (90 samples) leaves its remainder of 10 in its last chunk: no multiple of 8 makes 26."""
    model, callback = _fit(limit=20, memory_caps="auto", model_class=SizesSeen, samples=90, multiple=8)
    assert callback._memory.caps.own == 16 and callback._memory.redone == 1
    epoch = [16, 16, 16, 16, 16, 10]  # batches of 32, 32 and 26 in chunks
    assert model.sizes == [32, 24, *epoch, *epoch]  # the two failed attempts first
    assert sorted(model.seen) == sorted(2 * list(range(90)))  # every sample once an epoch


class _TwoRanks:
    """Rank 0's strategy in a 2-rank run whose rank 1 learnt a cap of 16 since the last exchange; ``apart``: inside
    an asynchronous batch of AsyncPSStrategy, where its all_gather stays local."""

    root_device = torch.device("cpu")

    def __init__(self, apart=False):
        self.apart = apart
        self.training_step = self.optimizer_step = self.backward = lambda *args, **kwargs: None

    def all_gather(self, tensor):
        return tensor.unsqueeze(0) if self.apart else torch.stack([tensor, torch.tensor([16.0], dtype=tensor.dtype)])


def test_every_ranks_learnt_cap_is_checkpointed_and_each_rank_restores_its_own():
    guard = MemoryGuard(MemoryCaps(world_size=2, rank=0), local_size=lambda: 32, device=torch.device("cpu"))
    guard.caps.lower(40)
    guard.install(_TwoRanks(), torch.nn.Linear(1, 1))
    saved = saved_caps(guard)
    assert saved == {"memory_caps": [30, 16]}  # rank 0's own and rank 1's, gathered: rank 0's view had (30, None)
    rank1 = MemoryGuard(MemoryCaps(world_size=2, rank=1), local_size=lambda: 32, device=torch.device("cpu"))
    restore_caps(rank1, saved)
    assert rank1.caps.own == 16
    # a checkpoint from before the caps were gathered (rank 0's view) still loads; so does one without caps
    old = MemoryGuard(MemoryCaps(world_size=2, rank=1), local_size=lambda: 32, device=torch.device("cpu"))
    restore_caps(old, {"memory_caps": [30, None]})
    restore_caps(old, {"split": [32, 32]})
    assert old.caps.all == (30, None)
    # where the ranks do not meet, this rank's view is saved
    guard.install(_TwoRanks(apart=True), torch.nn.Linear(1, 1))
    assert saved_caps(guard) == {"memory_caps": [30, None]}


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "asp"])
def test_two_ranks_on_gloo_survive_an_out_of_memory_rank(run_script, tmp_path, strategy):
    """Under ASP the strategy's own step claims the batch's data chunk: a step redone in chunks claims it once."""
    run_script("hetero_memory.py", str(tmp_path), strategy)
    ranks = [read_json(tmp_path / f"rank{rank}.json") for rank in range(2)]
    assert ranks[0]["caps"] == ranks[1]["caps"] and ranks[1]["caps"][1] < 40  # rank 1 failed above 24 samples
    assert ranks[1]["redone"] >= 1 and ranks[0]["redone"] == 0
    assert ranks[0]["final_split"] == ranks[1]["final_split"] and ranks[1]["final_split"][1] <= ranks[1]["caps"][1]
    seen = sorted(ranks[0]["seen"] + ranks[1]["seen"])
    assert seen == sorted(2 * list(range(320)))  # two epochs: every sample once per epoch, none lost or repeated
    if strategy == "asp":
        assert all(rank["strategy_steps"] == rank["steps"] for rank in ranks)  # the strategy's own step ran once a step
        return
    saved = torch.load(tmp_path / "caps.ckpt", weights_only=False)["callbacks"]["HeteroBatchCallback"]["memory_caps"]
    assert saved == [None, ranks[1]["caps"][1]]  # each rank's own, gathered at the save
    # the same global batches in one process (the same seeded order): the chunked steps gave the big-batch gradient
    data = _indexed(320)
    torch.manual_seed(0)
    reference = RunsOutOfMemory(limit=None)
    callback = HeteroBatchCallback(verbose=False)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(reference, train_dataloaders=DataLoader(data, batch_size=64, shuffle=True))
    trained = torch.load(tmp_path / "params.pt")
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-3, atol=2e-4)  # float noise: 2e-5


@pytest.mark.multiprocess
def test_an_out_of_memory_backward_under_ddp_names_the_rank_and_how_to_cap(run_script, tmp_path):
    """DDP's all-reduce runs inside backward, joined by the other ranks: it cannot be redone, so the run ends with
    advice instead of hanging."""
    result = run_script("hetero_memory.py", str(tmp_path), "ddp", "backward", expect_ok=False)
    assert result.returncode != 0
    assert "rank 1 ran out of memory in backward at a batch of 32" in result.stderr
    assert "set memory_caps=[...] with a size below 32 for rank 1" in result.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_caps_on_cuda_come_from_measured_memory():
    torch.manual_seed(0)
    callback = HeteroBatchCallback(memory_caps="auto", verbose=False)
    trainer = single_device_trainer(callback, accelerator="cuda")
    trainer.fit(RunsOutOfMemory(limit=None), train_dataloaders=DataLoader(_indexed(256), batch_size=32))
    cap = callback._memory.caps.own
    assert cap is not None and cap >= 32  # it ran at 32, so the estimate must hold at least that
    assert callback._memory.redone == 0
