"""AdjustmentPolicy's memory of rolled-back moves (issue 25): a rejected move is not retried until the evidence
changes, so under a CPU quota the split settles instead of alternating at every adjustment."""

from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy, Rejection

# rank 1 fitted 1.9-2.4x slower per sample than rank 0: from [50, 14] the fits propose [42, 22], [44, 20] or
# [45, 19] (the log), but the synchronous step measures [50, 14] fastest
FITS = [[(0.0, 0.001), (0.0, 0.0019)], [(0.0, 0.001), (0.0, 0.0022)], [(0.0, 0.001), (0.0, 0.00237)]]
SETTLED = (50, 14)


def measured_s(split: tuple[int, ...]) -> float:
    """The quota's truth: every split away from [50, 14] measures 30% slower."""
    return 0.050 if split == SETTLED else 0.065


def run_quota(policy: AdjustmentPolicy, adjustments: int) -> list[tuple[int, ...]]:
    """The split in force at each adjustment, the fits cycling through FITS, from [50, 14]."""
    split, splits = SETTLED, []
    for n in range(adjustments):
        splits.append(split)
        decision = policy.decide(split, FITS[n % len(FITS)], sync_step_s=measured_s(split), sync_steps=6)
        if decision.apply:
            split = decision.sizes
    return splits


def test_the_fits_propose_a_neighbour_of_the_rejected_split_at_every_adjustment():
    """The premise: each fit's balancing split differs from the last one rolled back."""
    controller = BatchSizeController(global_batch_size=64, world_size=2)
    rates = [[1.0 / c for _, c in fit] for fit in FITS]
    assert [controller.decide(SETTLED, r, [0.0, 0.0]).sizes for r in rates] == [(42, 22), (44, 20), (45, 19)]


def test_a_rolled_back_move_is_not_retried_with_a_neighbouring_split():
    """Before the memory the split alternated at every adjustment ([50, 14] -> [42, 22] -> [50, 14] -> [44, 20]
    -> ...): half the periods ran at a worse split. Now one trial is spent away from the settled split, and the
    move is not retried while the speeds stay."""
    splits = run_quota(AdjustmentPolicy(BatchSizeController(64, 2)), adjustments=48)
    away = [n for n, split in enumerate(splits) if split != SETTLED]
    assert away == [1], away


def test_a_reported_speed_change_without_a_measured_one_keeps_the_memory():
    """Under a quota the cost models report a change after nearly every move: it forgets only when the synchronous
    step at the unchanged split measures the change too."""
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    policy.decide(SETTLED, FITS[0], sync_step_s=0.050, sync_steps=6)
    assert policy.decide((42, 22), FITS[0], sync_step_s=0.065, sync_steps=6).reason == "rollback"
    assert not policy.decide(SETTLED, FITS[1], sync_step_s=0.050, sync_steps=6).apply  # remembered
    assert not policy.decide(SETTLED, FITS[1], sync_step_s=0.052, sync_steps=6, speeds_changed=True).apply
    retried = policy.decide(SETTLED, FITS[1], sync_step_s=0.090, sync_steps=6, speeds_changed=True)
    assert (retried.sizes, retried.apply) == ((44, 20), True)  # the evidence changed: the move is tried again


def test_a_split_measured_slower_is_not_returned_to():
    policy = AdjustmentPolicy(BatchSizeController(64, 2), rollback_tolerance=0.5)
    policy.decide(SETTLED, FITS[0], sync_step_s=0.050, sync_steps=6)
    kept = policy.decide((42, 22), FITS[0], sync_step_s=0.060, sync_steps=6)  # slower, within the tolerance
    assert not kept.apply
    back = policy.decide((42, 22), [(0.0, 0.001), (0.0, 0.004)], sync_step_s=0.060, sync_steps=12)
    assert back.sizes == (52, 12) and back.apply  # a split not measured yet: tried
    again = policy.decide((52, 12), FITS[0], sync_step_s=0.045, sync_steps=6)
    assert again.sizes == (42, 22) and not again.apply  # measured slower than (52, 12)


def test_a_move_the_other_way_is_not_held_back():
    """A rejected move towards the slow rank says nothing about one away from it (a speed flip goes there)."""
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    policy.decide(SETTLED, FITS[0], sync_step_s=0.050, sync_steps=6)
    policy.decide((42, 22), FITS[0], sync_step_s=0.065, sync_steps=6)
    other_way = policy.decide(SETTLED, [(0.0, 0.001), (0.0, 0.008)], sync_step_s=0.050, sync_steps=6)
    assert other_way.apply and other_way.sizes[0] > SETTLED[0]


def test_a_rejection_covers_moves_within_60_degrees_of_the_rejected_one():
    rejection = Rejection(origin=(20, 20, 12, 12), rejected=(16, 20, 16, 12), left=1, strikes=1)
    assert rejection.covers((16, 20, 16, 12)) and rejection.covers((18, 19, 15, 12))
    assert not rejection.covers((16, 20, 12, 16))  # the same donor, another receiver: cosine 1/2, 60 degrees
    assert not rejection.covers((20, 20, 12, 12))  # no move


def test_the_memory_is_checkpointed_and_an_old_checkpoint_still_loads():
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    run_quota(policy, adjustments=5)
    restored = AdjustmentPolicy(BatchSizeController(64, 2))
    restored.load_state_dict(policy.state_dict())
    assert restored.state_dict() == policy.state_dict() and restored.state_dict()["rejected"]
    old = AdjustmentPolicy(BatchSizeController(64, 2))
    old.load_state_dict({"rejected": [[[42, 22], 2]], "at_floor": [0, 0]})  # the release before: [split, left]
    assert not old.decide(SETTLED, FITS[0], sync_step_s=0.050).apply  # [42, 22] itself still rejected


def test_a_split_measured_slower_than_another_returns_to_it():
    """Issue 46: a change judged on a short baseline was kept, then measured 40% slower over more steps; nothing
    proposed the split measured faster before it, so the run stayed at the slower one."""
    policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
    costs = [(0.0, 0.001), (0.0, 0.0016)]  # the fits balance at [40, 24]
    assert policy.decide((44, 20), costs, sync_step_s=0.045, sync_steps=8).sizes == (40, 24)
    assert not policy.decide((40, 24), costs, sync_step_s=0.050, sync_steps=8).apply  # within the tolerance: kept
    decision = policy.decide((40, 24), costs, sync_step_s=0.060, sync_steps=24)  # over more steps: 33% slower
    assert (decision.sizes, decision.reason, decision.apply) == ((44, 20), "return", True)


def test_a_stalling_rank_is_nudged_and_then_not_fed_again():
    """Issue 46: rank 3 stalls under a quota (its busy level varies 40x more than the others'); the step exceeds the
    busiest rank's mean busy time and the all-reduce's share by 8%, which the fits cannot see. One sample moves off
    it; afterwards no proposal gives it as many samples as it stalled at."""
    policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=4))
    costs = [(0.0, 0.00105)] * 3 + [(0.0, 0.00525)]  # the fits balance at the split in force
    stalling = {"relative_errors": [0.005, 0.005, 0.005, 0.2], "busy_s": [0.021, 0.021, 0.0205, 0.010]}
    decision = policy.decide((20, 20, 20, 4), costs, sync_step_s=0.024, sync_steps=8, wait_s=0.001, **stalling)
    assert (decision.sizes, decision.reason, decision.apply) == ((20, 20, 21, 3), "nudge", True)
    steady = {"relative_errors": [0.005] * 4, "busy_s": [0.021, 0.021, 0.022, 0.009]}
    policy.decide((20, 20, 21, 3), costs, sync_step_s=0.0225, sync_steps=8, wait_s=0.001, **steady)  # judged: kept
    cheap = [(0.0, 0.00105)] * 3 + [(0.0, 0.002)]  # the fits now read rank 3 fast: they propose [17, 17, 17, 13]
    decision = policy.decide((20, 20, 21, 3), cheap, sync_step_s=0.0225, sync_steps=16, wait_s=0.001, **steady)
    assert decision.sizes[3] > 4 and not decision.apply
    assert policy.state_dict()["stalls"] == [[3, 4]]
