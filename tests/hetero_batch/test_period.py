import math

from lightning_hetero.hetero_batch.period import SYNC_STEPS_KEPT, MeasuredPeriod


def test_warm_up_and_the_first_step_at_a_new_split_are_not_counted():
    period = MeasuredPeriod(skip=2)
    for busy in (1.0, 1.0, 0.03):
        period.record((32, 32), 1, busy, 0.0, busy)
    period.skip_next()
    period.record((40, 24), 1, 5.0, 0.0, 5.0)
    period.record((40, 24), 1, 0.025, 0.0, 0.026)
    steps, _, _ = period.close((40, 24), 1)
    assert steps == [(32, 0.03, 0.0), (24, 0.025, 0.0)]


def test_mean_busy_time_is_at_the_current_split_only_and_raised_to_the_quota_floor():
    period = MeasuredPeriod()
    period.record((32, 32), 0, 0.05, 0.0, 0.05)
    period.record((40, 24), 0, 0.02, 0.04, 0.05)
    period.record((40, 24), 0, 0.03, 0.04, 0.05)
    _, busy, walls = period.close((40, 24), 0)
    assert busy == 0.04 and walls == [0.05, 0.05]
    _, busy, walls = period.close((40, 24), 0)
    assert math.isnan(busy) and walls == []


def test_sync_walls_accumulate_while_the_split_stays_and_restart_when_it_changes():
    period = MeasuredPeriod()
    for _ in range(3):
        for _ in range(20):
            period.record((40, 24), 0, 0.03, 0.0, 0.031)
        period.close((40, 24), 0)
    assert len(period.sync_walls) == SYNC_STEPS_KEPT
    period.record((44, 20), 0, 0.03, 0.0, 0.029)
    period.close((44, 20), 0)
    assert period.sync_walls == [0.029]
    period.restart_sync((44, 20), [0.5])
    assert period.sync_walls == [0.5]
