import math
from types import SimpleNamespace

import lightning as L
import pytest

from lightning_hetero.async_ps.runtime.validation_points import (
    ValidateTogether,
    ValidationPoints,
    check_interval,
    refuse_without_claims,
)


def _ddp_validations(interval, every_n_epochs, epochs, batches):
    """After which of a rank's batches (epoch, batch) Lightning validates under DDP (its rule, written out)."""
    per_rank = max(1, int(batches * interval)) if isinstance(interval, float) else interval
    done = []
    for epoch in range(epochs):
        if every_n_epochs is not None and (epoch + 1) % every_n_epochs:
            continue
        for batch in range(batches):
            count = batch if every_n_epochs is not None else epoch * batches + batch
            if (count + 1) % per_rank == 0:
                done.append((epoch, batch))
    return done


@pytest.mark.parametrize("interval", [0.25, 0.3, 0.5, 0.9, 1, 3, 5, 7, 12])
@pytest.mark.parametrize("every_n_epochs", [1, 2, None])
@pytest.mark.parametrize(("pool", "world_size"), [(24, 2), (25, 2), (24, 3), (7, 2), (48, 4)])
def test_the_points_are_where_ddp_validates_in_the_pool(interval, every_n_epochs, pool, world_size):
    if every_n_epochs is None and isinstance(interval, float):
        return  # Lightning refuses a fraction counted across epochs
    batches = math.ceil(pool / world_size)
    points = ValidationPoints(interval, every_n_epochs)
    expected = _ddp_validations(interval, every_n_epochs, 3, batches)
    got = []
    for epoch in range(3):
        inside, at_end = points.plan(epoch, pool, world_size)
        assert all(p % world_size == 0 and world_size <= p <= pool - world_size for p in inside)
        got += [(epoch, p // world_size - 1) for p in inside] + ([(epoch, batches - 1)] if at_end else [])
    # the same validations; one whose segment after it would hold less than a batch per rank moves to the epoch's end
    moved = [(e, b) for e, b in expected if b < batches - 1 and pool - (b + 1) * world_size < world_size]
    assert sorted(set(got)) == sorted({(e, batches - 1) if (e, b) in moved else (e, b) for e, b in expected})


def _trainer(**kwargs):
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **kwargs)


@pytest.mark.parametrize("interval", [0.5, 8])
def test_a_mid_epoch_interval_is_taken_over_and_lightning_sees_epoch_ends(interval):
    trainer = _trainer(val_check_interval=interval, check_val_every_n_epoch=2)
    assert check_interval(trainer, "asp") == ValidationPoints(interval, 2)
    assert trainer.val_check_interval == 1.0
    assert check_interval(trainer, "asp") is None  # nothing left to take over at a second fit


def test_local_sgd_refuses_mid_epoch_validation_with_accumulation_naming_both():
    trainer = _trainer(val_check_interval=0.5, accumulate_grad_batches=2)
    with pytest.raises(ValueError, match=r"val_check_interval=0.5.*accumulate_grad_batches=2.*must end a round"):
        check_interval(trainer, "local")
    assert check_interval(trainer, "asp") is not None  # a push carries what was accumulated; ASP takes it


def test_a_loader_not_claimed_from_the_pool_refuses_the_points():
    refuse_without_claims(None, "anything")
    refuse_without_claims(ValidationPoints(0.5, 1), None)
    with pytest.raises(ValueError, match=r"val_check_interval=0.5\): the loader has its own sampler.*=1.0"):
        refuse_without_claims(ValidationPoints(0.5, 1), "the loader has its own sampler")


@pytest.mark.parametrize(
    ("lock_step", "last", "ended", "batch_idx", "expected"),
    [
        (False, False, True, 0, 1),  # the rank's last batch of a segment: validate now
        (False, False, False, 11, None),  # elsewhere not, whatever its batch count
        (False, True, False, 30, 1),  # the epoch's end validates (24 batches a rank, every 12)
        (True, False, False, 11, 1),  # lock-step: a rank's 12th batch
        (True, False, False, 10, None),
    ],
)
def test_each_rank_is_told_after_each_batch_whether_it_validates_now(lock_step, last, ended, batch_idx, expected):
    progress = SimpleNamespace(is_last_batch=last)
    trainer = SimpleNamespace(
        current_epoch=0,
        val_check_batch=None,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )
    sampler = SimpleNamespace(epoch_samples=48 * 4, chunk_size=4, segment_ended=lambda: ended)
    mode = SimpleNamespace(lock_step=lock_step)
    ValidateTogether(lambda: sampler, 2, lambda: mode, ValidationPoints(0.5, 1)).on_train_batch_end(
        trainer, None, None, None, batch_idx
    )
    assert trainer.val_check_batch == 1 if expected == 1 else trainer.val_check_batch > 10**9
