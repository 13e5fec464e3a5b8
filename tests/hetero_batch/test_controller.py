import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hetero.allocation import apportion, order_by_speed, step_time_s
from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy
from tests.hetero_batch.simulated_ranks import SimulatedRanks, best_static, run_controller


@st.composite
def splits(draw):
    world = draw(st.integers(1, 8))
    lower = draw(st.lists(st.integers(1, 8), min_size=world, max_size=world))
    upper = [lo + draw(st.integers(0, 64)) for lo in lower]
    total = draw(st.integers(sum(lower), sum(upper)))
    weights = draw(st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=world, max_size=world))
    offsets = draw(st.none() | st.lists(st.floats(0.0, 1.0), min_size=world, max_size=world))
    return weights, total, lower, upper, offsets


@settings(max_examples=400, deadline=None)
@given(splits())
def test_apportion_sums_exactly_and_respects_bounds(case):
    weights, total, lower, upper, offsets = case
    sizes = apportion(weights, total, lower, upper, offsets)
    assert sum(sizes) == total
    assert all(lo <= b <= hi for b, lo, hi in zip(sizes, lower, upper, strict=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(1.0, 1e4, allow_nan=False), min_size=2, max_size=8), st.integers(0, 200))
def test_apportion_is_monotone_in_throughput_under_equal_bounds(weights, extra):
    world = len(weights)
    total = world + extra
    sizes = apportion(weights, total, [1] * world, [total] * world)
    for i in range(world):
        for j in range(world):
            if weights[i] > weights[j]:
                assert sizes[i] >= sizes[j]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(10.0, 1e3), st.sampled_from([0.0, 0.0, 0.01, 0.05])), min_size=2, max_size=6),
    st.integers(20, 400),
)
def test_fixed_overheads_are_balanced_not_ignored(costs, total):
    """The split minimises the synchronous step max_k a_k + b_k / X_k (with or without overheads): moving one
    sample from any rank to any other never shortens it."""
    throughputs = [x for x, _ in costs]
    overheads = [a for _, a in costs]
    world = len(costs)
    sizes = apportion(throughputs, total, [1] * world, [total] * world, offsets=overheads)
    best = step_time_s(sizes, throughputs, overheads)
    for i in range(world):
        for j in range(world):
            if i != j and sizes[i] > 1:
                moved = list(sizes)
                moved[i] -= 1
                moved[j] += 1
                assert step_time_s(moved, throughputs, overheads) >= best - 1e-9


def test_clipped_excess_goes_to_the_other_ranks_in_proportion():
    # rank 0 would get 80 of 100, but is capped at 40: the other 60 split 2:1 between ranks 1 and 2
    assert apportion([8.0, 2.0, 1.0], 100, [1, 1, 1], [40, 100, 100]) == [40, 40, 20]
    # rank 2 would get ~1, but its floor is 10
    assert sum(apportion([100.0, 100.0, 1.0], 60, [10, 10, 10], [60, 60, 60])) == 60
    assert apportion([100.0, 100.0, 1.0], 60, [10, 10, 10], [60, 60, 60])[2] == 10


def test_controller_keeps_global_batch_and_follows_throughput():
    controller = BatchSizeController(global_batch_size=96, world_size=3, min_batch_size=4)
    decision = controller.decide([32, 32, 32], [100.0, 200.0, 300.0])
    assert decision.sizes == (16, 32, 48)
    assert decision.apply


def test_deadband_suppresses_changes_with_a_small_predicted_gain():
    controller = BatchSizeController(global_batch_size=100, world_size=2, deadband=0.2)
    # proposed (55, 45): the step shortens from 50/45 to 45/45 (10%), under the 20% deadband
    small = controller.decide([50, 50], [55.0, 45.0])
    assert small.sizes == (55, 45) and small.predicted_gain == pytest.approx(0.1) and not small.apply
    # proposed (70, 30): the step shortens from 50/30 to 30/30 (40%)
    assert controller.decide([50, 50], [70.0, 30.0]).apply
    # the current split is already the best: nothing to apply even with no deadband
    assert (
        not BatchSizeController(global_batch_size=100, world_size=2, deadband=0.0).decide([70, 30], [70.0, 30.0]).apply
    )


def test_memory_caps_tighten_max_batch_size():
    controller = BatchSizeController(global_batch_size=64, world_size=2, max_batch_size=60, memory_caps=[40, None])
    assert controller.propose([1000.0, 1.0]) == (40, 24)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_batch_size": 8, "world_size": 4, "min_batch_size": 4}, "smaller than world_size x min_batch_size"),
        ({"global_batch_size": 64, "world_size": 2, "max_batch_size": 16}, "exceeds the sum of the per-rank maxima"),
        (
            {"global_batch_size": 64, "world_size": 2, "min_batch_size": 0},
            r"min_batch_size \(rank 0\) must be an integer >= 1",
        ),
        (
            {"global_batch_size": 64, "world_size": 2, "min_batch_size": 8, "max_batch_size": 4},
            "exceeds max_batch_size",
        ),
        ({"global_batch_size": 64, "world_size": 2, "min_batch_size": [1, 2, 3]}, "one entry per rank"),
        ({"global_batch_size": 0, "world_size": 2}, "global_batch_size must be an integer >= 1"),
        ({"global_batch_size": 64, "world_size": 2, "deadband": -0.1}, "deadband"),
    ],
)
def test_bad_configuration_names_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchSizeController(**kwargs)


def test_step_time_is_the_slowest_rank():
    assert step_time_s([10, 30], [10.0, 60.0]) == 1.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 0.05), st.floats(1e-5, 1e-2)), min_size=2, max_size=6),
    st.integers(0, 200),
)
def test_decisions_never_give_a_slower_rank_more_samples(costs, extra):
    """Whatever the fitted costs (crossing lines included), no applied or proposed split is inverted: a rank with a
    longer predicted step at the equal share never gets more samples than a faster one."""
    world = len(costs)
    total = world + extra
    controller = BatchSizeController(total, world)
    policy = AdjustmentPolicy(controller)
    decision = policy.decide(controller.equal_split(), costs, sync_step_s=1.0)
    times = [a + c * total / world for a, c in costs]
    for i in range(world):
        for j in range(world):
            if times[i] < times[j] * (1 - 1e-9):
                assert decision.sizes[i] >= decision.sizes[j], (decision, times)
    assert sum(decision.sizes) == total


def test_order_by_speed_swaps_within_bounds_only():
    assert order_by_speed([10, 30, 20], [1.0, 2.0, 3.0], [1] * 3, [64] * 3) == (30, 20, 10)
    assert order_by_speed([10, 30], [1.0, 2.0], [1, 1], [20, 64]) == (10, 30)  # rank 0 cannot take 30


def test_rollback_returns_to_the_split_before_a_change_that_made_the_step_slower():
    policy = AdjustmentPolicy(BatchSizeController(64, 2), rollback_tolerance=0.1)
    costs = [(0.0, 0.001), (0.0, 0.004)]
    assert policy.decide([32, 32], costs, sync_step_s=0.128).sizes == (52, 12)
    # within the tolerance: no rollback
    assert policy.decide([52, 12], costs, sync_step_s=0.138).reason != "rollback"
    policy = AdjustmentPolicy(BatchSizeController(64, 2), rollback_tolerance=0.1)
    policy.decide([32, 32], costs, sync_step_s=0.128)
    rollback = policy.decide([52, 12], costs, sync_step_s=0.150)
    assert (rollback.sizes, rollback.apply, rollback.reason) == ((32, 32), True, "rollback")
    # the rejected split is not proposed again for reject_periods adjustments
    assert not policy.decide([32, 32], costs, sync_step_s=0.128).apply


def test_a_trial_is_judged_on_enough_steps_only():
    """Issue 17's Docker runs adjusted every 4 steps: the first measurement at a new split rested on one step, and
    one throttled step rolled a right change back (511/1 back to 412/100). A change is now held until its
    synchronous step rests on min_sync_steps steps, and a baseline on fewer judges nothing."""
    costs = [(0.0, 0.001), (0.0, 0.004)]
    policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
    assert policy.decide([32, 32], costs, sync_step_s=0.128, sync_steps=6).sizes == (52, 12)
    held = policy.decide([52, 12], costs, sync_step_s=0.160, sync_steps=1)  # one slow step: not judged yet
    assert (held.reason, held.apply) == ("hold", False)
    rolled = policy.decide([52, 12], costs, sync_step_s=0.160, sync_steps=3)  # still slower on 3 steps: back
    assert (rolled.reason, rolled.apply, rolled.sizes) == ("rollback", True, (32, 32))

    policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
    policy.decide([32, 32], costs, sync_step_s=0.100, sync_steps=1)  # a baseline on one step
    kept = policy.decide([52, 12], costs, sync_step_s=0.160, sync_steps=6)
    assert kept.reason != "rollback" and not kept.apply


def test_no_rollback_to_a_split_that_the_new_speeds_make_inverted():
    """After the ranks swap speeds, the step after a change is slower than before it because the world changed; the
    split before the change is now inverted, so it is not restored."""
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    assert policy.decide([40, 24], [(0.0, 0.001), (0.0, 0.004)], sync_step_s=0.096).sizes == (52, 12)
    swapped = policy.decide([52, 12], [(0.0, 0.004), (0.0, 0.001)], sync_step_s=0.210)
    assert swapped.reason == "balance" and swapped.sizes == (13, 51)


def test_a_rank_stuck_at_its_minimum_with_one_known_size_is_explored():
    policy = AdjustmentPolicy(BatchSizeController(64, 2, min_batch_size=2), explore_after=2)
    costs = [(0.0, 0.001), (0.070, 0.001)]  # a misfit: a 70 ms overhead keeps rank 1 at the minimum
    first = policy.decide([62, 2], costs, sync_step_s=0.064, known_sizes=[2, 1])
    assert not first.apply
    explored = policy.decide([62, 2], costs, sync_step_s=0.064, known_sizes=[2, 1])
    assert explored.apply and explored.reason == "explore" and explored.sizes == (61, 3)
    # with a second size known (its cost measured), nothing is explored
    policy = AdjustmentPolicy(BatchSizeController(64, 2, min_batch_size=2), explore_after=1)
    assert not policy.decide([62, 2], costs, sync_step_s=0.064, known_sizes=[2, 2]).apply


# Issue 17, bench_controller sleep HL2 on 2 ranks: at [43, 21] the slow rank measured 52 ms and the fast one 49 ms;
# [44, 20] predicts 50 ms (4% shorter), under the 5% deadband, and the controller stopped there (0.968 of the best).
NEAR_TIE = [(0.004, 0.001), (0.006, 0.0021)]  # at [43, 21]: 47 ms and 50.1 ms; [44, 20] predicts 48 ms, 4.2% shorter


def test_a_sub_deadband_gain_proposed_twice_in_a_row_is_refined():
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    first = policy.decide([43, 21], NEAR_TIE, sync_step_s=0.051, relative_errors=[0.005, 0.005])
    assert first.sizes == (44, 20) and not first.apply and first.reason == "balance"
    second = policy.decide([43, 21], NEAR_TIE, sync_step_s=0.051, relative_errors=[0.005, 0.005])
    assert (second.sizes, second.apply, second.reason) == ((44, 20), True, "refine")
    assert second.predicted_gain == pytest.approx(0.0419, abs=1e-3)
    # without refinements the deadband keeps [43, 21]
    policy = AdjustmentPolicy(BatchSizeController(64, 2), refine_gain=None)
    assert not any(policy.decide([43, 21], NEAR_TIE, sync_step_s=0.051).apply for _ in range(4))


def test_a_refinement_needs_a_gain_beyond_the_noise_and_persistence():
    # 2% relative error per rank: two ranks' levels can differ by 2 x sqrt(2) x 2% = 5.7% by chance
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    assert not any(policy.decide([43, 21], NEAR_TIE, 0.051, relative_errors=[0.02, 0.01]).apply for _ in range(4))
    # an unmeasured level (NaN) refines nothing
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    assert not any(policy.decide([43, 21], NEAR_TIE, 0.051, relative_errors=[math.nan, 0.0]).apply for _ in range(4))
    # proposed, then not (balanced costs), then proposed again: not twice in a row
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    balanced = [(0.004, 0.001), (0.004, 0.002)]
    for costs in (NEAR_TIE, balanced, NEAR_TIE):
        assert not policy.decide([43, 21], costs, 0.051, relative_errors=[0.0, 0.0]).apply
    assert policy.decide([43, 21], NEAR_TIE, 0.051, relative_errors=[0.0, 0.0]).reason == "refine"
    # a predicted gain under refine_gain is never applied
    policy = AdjustmentPolicy(BatchSizeController(64, 2), refine_gain=0.05)
    assert not any(policy.decide([43, 21], NEAR_TIE, 0.051).apply for _ in range(4))


def test_no_refinement_back_to_the_split_the_last_change_left():
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    policy.decide([43, 21], NEAR_TIE, 0.051)
    assert policy.decide([43, 21], NEAR_TIE, 0.051).reason == "refine"
    # at [44, 20] the fits now favour [43, 21] by 2.1%: the split the refinement left is not refined back to
    back = [(0.004, 0.001), (0.006, 0.0019)]
    assert policy.decide([44, 20], back, 0.051).sizes == (43, 21)
    assert not any(policy.decide([44, 20], back, 0.051).apply for _ in range(3))
    # a move that clears the deadband still goes anywhere
    moved = policy.decide([44, 20], [(0.004, 0.001), (0.006, 0.003)], 0.051)
    assert moved.apply and moved.reason == "balance" and moved.sizes == (49, 15)


def test_refinement_state_survives_a_checkpoint():
    policy = AdjustmentPolicy(BatchSizeController(64, 2))
    policy.decide([43, 21], NEAR_TIE, 0.051)
    restored = AdjustmentPolicy(BatchSizeController(64, 2))
    restored.load_state_dict(policy.state_dict())
    assert restored.decide([43, 21], NEAR_TIE, 0.051).reason == "refine"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollback_tolerance": -0.1}, "rollback_tolerance"),
        ({"reject_periods": -1}, "reject_periods"),
        ({"explore_after": 0}, "explore_after"),
        ({"refine_gain": -0.01}, "refine_gain"),
        ({"refine_after": 0}, "refine_after"),
    ],
)
def test_policy_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdjustmentPolicy(BatchSizeController(64, 2), **kwargs)


CLOSED_LOOP = {
    # rank 1 under a CFS quota of 1/4 CPU: same CPU cost per sample, 100 ms periods
    "cfs quota 1/4": lambda seed: SimulatedRanks([0.004, 0.004], [0.0004, 0.0004], quotas=[None, 0.25], seed=seed),
    # a slower machine (everything 8x) and a fixed cost per step
    "HL8": lambda seed: SimulatedRanks([0.002, 0.016], [0.0003, 0.0024], noise=0.1, seed=seed),
    # 4x slower per sample with the same fixed cost
    "HL4 same overhead": lambda seed: SimulatedRanks([0.004, 0.004], [0.0003, 0.0012], noise=0.1, seed=seed),
}


@pytest.mark.parametrize("scenario", sorted(CLOSED_LOOP))
@pytest.mark.parametrize("seed", [0, 1])
def test_closed_loop_settles_near_the_best_static_split(scenario, seed):
    """Per-rank PeriodCostModels and an AdjustmentPolicy in a loop with simulated ranks (deterministic): within
    2 adjustment periods of the start the step is within 4% of the best static split's, and then the split stays.
    (Near the balance point the 5% deadband keeps a split whose predicted gain is under 1% but, with 10% noise on
    each rank, whose real one is up to 3%: HL8 with seed 1 stops at [62, 2], 0.968 of [63, 1].)"""
    ranks = CLOSED_LOOP[scenario]
    _, best = best_static(lambda: ranks(seed + 100), 64)
    run = run_controller(ranks(seed), 64, periods=16)
    steady = run["walls"][3 * 8 :]
    assert sum(steady) / len(steady) <= 1.04 * best
    late_changes = [d for d in run["decisions"][3:] if d.apply]
    assert len(late_changes) <= 1, late_changes
    assert all(split[1] <= split[0] for split in run["splits"])  # rank 1 is the slower one: never more samples


@pytest.mark.parametrize("seed", [0, 1])
def test_closed_loop_refines_a_near_tie_to_the_best_static_split(seed):
    """bench_controller's sleep HL2 on 2 ranks in miniature (5% noise): the first move lands at [43, 21], where the
    slow rank is the longer by 4%, under the deadband; the refinement reaches the best static split [44, 20].
    Without it the run stays at 0.973-0.978 of the best static split."""
    ranks = lambda s: SimulatedRanks([0.005, 0.007], [0.001, 0.0021], noise=0.05, seed=s)  # noqa: E731
    best_split, best = best_static(lambda: ranks(100), 64)
    run = run_controller(ranks(seed), 64, periods=12)
    steady = run["walls"][3 * 8 :]
    assert best_split == (44, 20) and run["splits"][-1] == best_split
    assert sum(steady) / len(steady) <= 1.01 * best
    assert [d.reason for d in run["decisions"] if d.apply] == ["balance", "refine"]


def test_closed_loop_reacts_to_a_speed_flip_within_two_periods_without_overshoot():
    ranks = SimulatedRanks([0.002, 0.008], [0.0003, 0.0012], noise=0.1)
    switch = 6 * 8 + 2  # two steps after an adjustment
    run = run_controller(
        ranks, 64, periods=14, change_at=switch, change={"overhead_s": [0.008, 0.002], "per_sample_s": [0.0012, 0.0003]}
    )
    splits = run["splits"]
    before, final = splits[switch - 1], splits[-1]
    assert before[0] > before[1] and final[0] < final[1]
    settled = splits[switch + 2 * 8 - 2 :]  # from the second adjustment after the change on
    assert all(max(abs(b - f) for b, f in zip(split, final, strict=True)) <= 3 for split in settled)
    # no overshoot: rank 0's batch never falls more than 20% below its final value
    assert min(split[0] for split in splits[switch:]) >= 0.8 * final[0]


def test_closed_loop_leaves_equal_ranks_alone_despite_noise():
    run = run_controller(SimulatedRanks([0.004, 0.004], [0.0003, 0.0003], noise=0.2), 64, periods=12)
    assert not any(d.apply for d in run["decisions"])


# Issue 17's Docker runs (containers at 1.0 and 0.25 CPU, one thread; costs fitted from the controller's own
# measurements there): the 0.25-CPU container's fixed CPU per step (Lightning's loop, the optimizer step, gloo's
# share of the all-reduce) is 10 ms, i.e. 40 ms at its quota, as long as the 1-CPU container's whole step at the full
# global batch of 512 (6 ms + 0.067 ms/sample), so its best share is the minimum; with ResNet-20 (4.3 ms of CPU per
# sample, global batch 128) the same quota makes it 4x slower per sample and its best share is about a fifth.
DOCKER = {
    "mlp": (lambda seed: SimulatedRanks([0.006, 0.010], [6.7e-5, 6.7e-5], quotas=[None, 0.25], seed=seed), 512),
    "resnet20": (lambda seed: SimulatedRanks([0.018, 0.018], [0.0043, 0.0043], quotas=[None, 0.25], seed=seed), 128),
}


@pytest.mark.parametrize("workload", sorted(DOCKER))
def test_closed_loop_under_a_real_quota_settles_at_the_best_static_split(workload):
    """The slow container at the minimum (MLP) is the controller following the measured costs, not a misfit: it is
    the best static split there, and with a compute-bound workload the same quota gets its proportional share."""
    ranks, global_batch = DOCKER[workload]
    sizes = [1, 2, 3, 4, 6, 8, 12, 16] if workload == "mlp" else list(range(14, 31, 2))
    (_, best_slow), best = best_static(lambda: ranks(100), global_batch, steps=24, rank1_sizes=sizes)
    run = run_controller(ranks(0), global_batch, periods=8, period_steps=4)
    # from the equal split, two moves (bench_docker adjusts every 4 steps; each new split is held a period, until it
    # has been measured on 3 steps)
    (_, first), (index, second_move) = [(i, d) for i, d in enumerate(run["decisions"]) if d.apply][:2]
    assert first.reason == second_move.reason == "balance" and index == 2
    second = second_move.sizes
    steady = run["walls"][(index + 2) * 4 :]  # from the period after the one the second move lands in
    assert sum(steady) / len(steady) <= 1.03 * best
    if workload == "mlp":
        # before issue 17's fix the move from 256 to 90 samples read as a change of speed: 460/52, then 476/36 ...
        assert best_slow <= 6 and second[1] <= best_slow + 6
    else:
        assert 18 <= best_slow <= 26 and abs(second[1] - best_slow) <= 3
    assert all(split[1] <= split[0] for split in run["splits"])


@pytest.mark.parametrize("min_batch_size", [2, 8])
def test_exploration_moves_whole_multiples_and_the_remainder_stays_where_it_is(min_batch_size):
    # a global batch of 100 in multiples of 8: 12 multiples, and the remainder of 4 on the faster rank
    policy = AdjustmentPolicy(BatchSizeController(100, 2, min_batch_size, batch_size_multiple=8), explore_after=2)
    costs = [(0.0, 0.001), (0.100, 0.001)]  # a misfit: a 100 ms overhead keeps rank 1 at its floor, one multiple
    assert not policy.decide([92, 8], costs, sync_step_s=0.1, known_sizes=[2, 1]).apply
    explored = policy.decide([92, 8], costs, sync_step_s=0.1, known_sizes=[2, 1])
    assert explored.apply and explored.reason == "explore" and explored.sizes == (84, 16)
    assert sum(explored.sizes) == 100 and [size % 8 for size in explored.sizes] == [4, 0]


def test_a_change_is_held_until_measured_even_when_its_baseline_cannot_judge_it():
    """Docker, ResNet-20 at 1.0/0.25 CPU, adjustments every 4 steps (issue 25): the first balance (64/64 -> 105/23)
    rested on a baseline of one step, so it could not be judged, and the next adjustment moved on (105/23 -> 109/19,
    3-4% slower than 105/23 in the static sweep) from costs fitted on one or two steps at the new size. A change is now
    held until its split has been measured on min_sync_steps steps, whatever its baseline."""
    costs = [(0.0, 0.001), (0.0, 0.004)]
    policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
    assert policy.decide([32, 32], costs, sync_step_s=0.128, sync_steps=1).sizes == (52, 12)
    skewed = [(0.0, 0.001), (0.030, 0.004)]  # a fit on one step at the new size: the slow rank's overhead inflated
    held = policy.decide([52, 12], skewed, sync_step_s=0.080, sync_steps=1)
    assert (held.reason, held.apply) == ("hold", False)
    assert policy.decide([52, 12], skewed, sync_step_s=0.080, sync_steps=1).reason == "hold"  # still one step
    # measured on enough steps (the fit settled too): decided as usual, and the baseline of one step judges nothing
    settled = policy.decide([52, 12], costs, sync_step_s=0.160, sync_steps=3)
    assert settled.reason == "balance" and not settled.apply
