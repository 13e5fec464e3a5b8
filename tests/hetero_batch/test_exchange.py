import math

import pytest
import torch

from lightning_hetero.hetero_batch.exchange import FIELDS, gather_rows, own_row, read_rows, trimmed
from lightning_hetero.measurement import BusyTimer


def _row(fit, latest, changed=False, position=0, busy=0.03, walls=(0.031,), newest=(0.031,), error=0.01):
    return own_row(fit, latest, changed, position, busy, list(walls), list(newest), error)


def test_a_row_has_every_field_in_order():
    row = _row((0.002, 0.001, 2), (0.004, 0.0015, 1), position=7, busy=0.05, walls=[0.04, 0.06], newest=[0.06])
    fields = dict(zip(FIELDS, row.tolist(), strict=True))
    assert fields["overhead_s"] == 0.002 and fields["per_sample_s"] == 0.001 and fields["known_sizes"] == 2
    assert fields["latest_overhead_s"] == 0.004 and fields["latest_known_sizes"] == 1
    assert fields["sync_step_s"] == pytest.approx(0.05) and fields["sync_steps"] == 2
    assert fields["newest_sync_step_s"] == pytest.approx(0.06) and fields["newest_sync_steps"] == 1
    assert fields["position"] == 7 and fields["busy_s"] == 0.05 and fields["changed"] == 0
    assert fields["relative_error"] == 0.01


def test_a_change_seen_by_one_rank_restarts_every_rank_from_its_newest_period():
    steady = _row((0.002, 0.001, 3), (0.005, 0.002, 1), walls=[0.03] * 8, newest=[0.09])
    changed = _row((0.010, 0.004, 1), (0.010, 0.004, 1), changed=True, walls=[0.09], newest=[0.09])
    seen = read_rows(torch.stack([steady, changed]))
    # the steady rank's fit is replaced by its newest-period fit; the changed rank keeps its (already restarted) one
    assert seen.costs == ((0.005, 0.002), (0.010, 0.004))
    assert seen.known_sizes == [1, 1]
    assert seen.sync_step_s == pytest.approx(0.09) and seen.sync_steps == 1
    assert seen.changed == (False, True)


def test_no_costs_while_a_rank_has_no_fit_and_no_sync_step_unless_every_rank_measured_it():
    fitted = _row((0.002, 0.001, 2), (0.002, 0.001, 2))
    unfitted = _row((0.0, None, 0), (0.0, None, 0), walls=[], newest=[])
    seen = read_rows(torch.stack([fitted, unfitted]))
    assert seen.costs is None and seen.sync_step_s is None and math.isnan(seen.busy_s[1]) is False


def test_reading_leaves_the_gathered_rows_unchanged():
    rows = torch.stack([_row((1.0, 1.0, 1), (2.0, 2.0, 1)), _row((1.0, 1.0, 1), (2.0, 2.0, 1), changed=True)])
    before = rows.clone()
    read_rows(rows)
    torch.testing.assert_close(rows, before, rtol=0, atol=0, equal_nan=True)  # no memory caps: NaN columns


def test_trimmed_drops_only_the_longest_step():
    assert trimmed([0.3, 0.1, 0.2]) == [0.1, 0.2]
    assert trimmed([0.5]) == [0.5] and trimmed([]) == []


def test_gather_rows_without_a_process_group_uses_the_strategy():
    class Strategy:
        def all_gather(self, tensor):
            return torch.stack([tensor, tensor + 1])

    rows = gather_rows(Strategy(), torch.zeros(len(FIELDS)), BusyTimer())
    assert rows.shape == (2, len(FIELDS)) and rows[1, 0] == 1


def test_memory_caps_travel_in_the_rows():
    rows = torch.stack(
        [
            _row((1.0, 1.0, 1), (1.0, 1.0, 1)),
            own_row((1.0, 1.0, 1), (1.0, 1.0, 1), False, 3, 0.03, [0.03], [0.03], 0.01, memory_cap=24),
        ]
    )
    caps = read_rows(rows).memory_caps
    assert math.isnan(caps[0]) and caps[1] == 24
