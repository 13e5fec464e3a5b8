from types import SimpleNamespace

import torch

from lightning_hetero._lightning_internals import NEVER_STEPPED as NEVER
from lightning_hetero.lr_schedules import CountedLRSchedulers


def _config(interval="step", frequency=1, plateau=False):
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if plateau:
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    else:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.step()
    return SimpleNamespace(scheduler=scheduler, interval=interval, frequency=frequency, reduce_on_plateau=plateau)


def test_only_step_interval_schedulers_are_taken_and_frequency_counts_updates():
    every_third, epoch, plateau = _config(frequency=3), _config(interval="epoch"), _config(plateau=True)
    schedules = CountedLRSchedulers()
    schedules.take_over([every_third, epoch, plateau])
    assert schedules.active
    assert (every_third.frequency, epoch.frequency, plateau.frequency) == (NEVER, 1, 1)
    for version in range(1, 8):
        schedules.step_at(version)
    assert every_third.scheduler.last_epoch == 2  # stepped at updates 3 and 6
    assert epoch.scheduler.last_epoch == 0


def test_taking_over_twice_or_a_config_owned_elsewhere_is_a_no_op():
    config, owned = _config(frequency=2), _config(frequency=NEVER)
    schedules = CountedLRSchedulers()
    schedules.take_over([config, owned])
    schedules.take_over([config, owned])
    for version in range(1, 5):
        schedules.step_at(version)
    assert config.scheduler.last_epoch == 2, "stepped once per two updates, not twice"
    assert owned.scheduler.last_epoch == 0
    schedules.release()
    assert (config.frequency, owned.frequency) == (2, NEVER)
    assert not schedules.active
