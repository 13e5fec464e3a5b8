from types import SimpleNamespace

import pytest

from lightning_hetero.async_ps.runtime.stopping import STOP_KEY, AgreedStop, StepCeiling


class _Store:
    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value

    def check(self, keys):
        return all(key in self.keys for key in keys)


def _stop(max_steps=-1, lock_step=False, last_batch=False):
    claims = []
    progress = SimpleNamespace(is_last_batch=last_batch)
    trainer = SimpleNamespace(
        max_steps=max_steps, current_epoch=3, should_stop=False,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )  # fmt: skip
    sampler = SimpleNamespace(close=claims.append)
    ctx = SimpleNamespace(
        trainer=trainer, active=True, claim_sampler=sampler, store=_Store(), counter=SimpleNamespace(version=0)
    )
    meetings, epoch_ends = [], []
    fault = SimpleNamespace(meet=lambda: meetings.append(1))
    engine = SimpleNamespace(lock_step=lock_step, epoch_end=lambda: epoch_ends.append(1))
    return AgreedStop(ctx, fault, lambda: engine), trainer, claims, (meetings, epoch_ends)


def test_a_spent_budget_closes_the_pool_once_and_no_rank_sees_max_steps_before_its_epoch_ends():
    stop, trainer, claims, _ = _stop(max_steps=30)
    assert stop.shown_step(29, in_step=True) == 29 and claims == []
    assert stop.shown_step(30, in_step=True) == 29
    assert stop.shown_step(31, in_step=True) == 29
    assert claims == [3]  # the rest of epoch 3's pool, claimed once
    trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
    assert stop.shown_step(31, in_step=True) == 31  # its last batch: Lightning may see it
    assert stop.shown_step(31, in_step=False) == 31


def test_in_lock_step_lightnings_own_decisions_hold():
    stop, trainer, claims, (meetings, _) = _stop(max_steps=30, lock_step=True)
    assert stop.shown_step(31, in_step=True) == 31
    trainer.should_stop = True
    stop.batch_end(trainer)
    stop.epoch_end(trainer)
    assert trainer.should_stop and claims == [] and meetings == []


def test_a_stop_asked_inside_an_asynchronous_batch_waits_for_the_epochs_end_on_every_rank():
    stop, trainer, claims, (meetings, epoch_ends) = _stop()
    trainer.should_stop = True  # e.g. Lightning's Timer for max_time, on this rank alone
    stop.batch_end(trainer)
    assert not trainer.should_stop and claims == [3] and stop.ctx.store.check([STOP_KEY])
    other, other_trainer, _, (other_meetings, _) = _stop()
    other.ctx.store = stop.ctx.store  # another rank, same store
    other.epoch_end(other_trainer)
    stop.epoch_end(trainer)
    assert trainer.should_stop and other_trainer.should_stop
    assert meetings == other_meetings == [1] and epoch_ends == [1]


@pytest.mark.parametrize(("version", "mid_epoch", "shown"), [(5, True, 5), (40, True, 9), (40, False, 40)])
def test_step_ceiling(version, mid_epoch, shown):
    assert StepCeiling(10).shown(version, mid_epoch) == shown
