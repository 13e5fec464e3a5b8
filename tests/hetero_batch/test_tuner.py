"""The tuner: its decisions (caps, where a new split comes into force) without processes, its metrics and summary."""

import warnings

import torch

from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.period import read_rows
from lightning_hetero.hetero_batch.settings import HeteroBatchAdvanced, HeteroBatchSettings
from lightning_hetero.hetero_batch.tuner import SplitTuner, adjustment_metrics, format_summary, respect_caps


def test_summary_shows_times_not_samples_per_second_and_counts_rollbacks():
    text = format_summary(
        [60, 4], [0.031, 0.030], [0.032, float("nan")], [{"reason": "balance"}, {"reason": "rollback"}], 0.033, None
    )
    lines = text.splitlines()
    assert "ms/step" in lines[1] and "samples/s" not in text
    assert lines[3].split() == ["1", "4", "30.0", "n/a"]
    assert "split changes 2 (1 rolled back)" in text and "33.0 ms" in text
    assert "equal batches" not in text  # no model prediction without a fit of the equal split


def test_summary_before_any_fit_says_n_a():
    text = format_summary([32, 32], [], None, [], None, None)
    assert text.count("n/a") == 4 and "synchronous step" not in text


def test_adjustment_metrics_name_each_rank():
    metrics = adjustment_metrics([0.02, 0.04], None, [48, 16])
    assert metrics == {
        "hetero/predicted_step_ms_rank0": 20.0,
        "hetero/predicted_step_ms_rank1": 40.0,
        "hetero/batch_size_rank0": 48.0,
        "hetero/batch_size_rank1": 16.0,
    }


def test_respect_caps_moves_a_split_within_them_or_leaves_it_to_chunks():
    controller = BatchSizeController(global_batch_size=64, world_size=2)
    decision = respect_caps(None, (32, 32), controller, (None, 12))
    assert decision.sizes == (52, 12) and decision.reason == "memory" and controller.upper == [64, 12]
    assert respect_caps(None, (52, 12), BatchSizeController(64, 2), (20, 12)) is None  # 32 < 64: chunks instead


def test_a_split_moved_within_memory_caps_keeps_the_multiples():
    controller = BatchSizeController(global_batch_size=64, world_size=2, batch_size_multiple=8)
    decision = respect_caps(None, (32, 32), controller, (None, 20))
    assert decision.reason == "memory" and decision.sizes == (48, 16)  # 16: the largest multiple within rank 1's 20


def _two_ranks(settings: HeteroBatchSettings) -> list[SplitTuner]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [SplitTuner.from_settings(settings, 64, rank, 2, "cpu") for rank in (0, 1)]


def _exchange(tuners: list[SplitTuner], position: int, caps=(None, None)):
    """Rank 1 three times slower per sample; every tuner reads the same rows."""
    for _ in range(6):
        for rank, tuner in enumerate(tuners):
            tuner.record_step((32, 32), busy_s=0.001 * 32 * (3 if rank else 1), floor_s=0.0, wall_s=0.1)
    return read_rows(torch.stack([t.close_period(position, cap) for t, cap in zip(tuners, caps, strict=True)]))


def test_an_applied_split_comes_into_force_after_every_ranks_loader_position_or_the_next_epoch():
    settings = HeteroBatchSettings(advanced=HeteroBatchAdvanced(warmup_steps=0))
    tuners = _two_ranks(settings)
    seen = _exchange(tuners, position=6)
    decisions = [tuner.adjust(seen, step=6, epoch=0) for tuner in tuners]
    assert decisions[0] == decisions[1] and decisions[0].apply and decisions[0].sizes == (48, 16)
    assert [t.plan.split_at(6) for t in tuners] == [(32, 32)] * 2 and tuners[0].plan.split_at(7) == (48, 16)
    tuners = _two_ranks(settings)
    seen = _exchange(tuners, position=6)
    tuners[0].adjust(seen, step=6, epoch=0, not_before=16)  # at an epoch's end: the next epoch's first step
    assert tuners[0].plan.split_at(15) == (32, 32) and tuners[0].plan.split_at(16) == (48, 16)


def test_with_automatic_caps_the_tuner_splits_within_every_ranks_exchanged_cap():
    tuners = _two_ranks(HeteroBatchSettings(memory_caps="auto", advanced=HeteroBatchAdvanced(warmup_steps=0)))
    seen = _exchange(tuners, position=6, caps=(20, None))
    decision = tuners[0].adjust(seen, step=6, epoch=0)
    assert decision.reason == "memory" and decision.sizes == (20, 44) and tuners[0].split == (20, 44)
    assert tuners[0].controller.upper == [20, 64]  # the tuner's own controller holds the cap from now on


def test_without_automatic_caps_exchanged_caps_are_not_applied():
    tuners = _two_ranks(HeteroBatchSettings(memory_caps=[None, None], advanced=HeteroBatchAdvanced(warmup_steps=0)))
    seen = _exchange(tuners, position=6, caps=(20, None))
    assert tuners[0].adjust(seen, step=6, epoch=0).sizes == (48, 16)


def test_the_tuner_takes_the_settings_object():
    settings = HeteroBatchSettings(
        initial_batch_sizes=[40, 24], max_batch_size=48, advanced=HeteroBatchAdvanced(deadband=0.2, warmup_steps=1)
    )
    tuner = _two_ranks(settings)[1]
    assert tuner.split == (40, 24) and tuner.controller.deadband == 0.2 and tuner.controller.upper == [48, 48]
    assert tuner.period.to_skip == 1 and tuner.rank == 1
