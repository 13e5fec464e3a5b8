"""The policy under a CPU quota, through the tuner as the callback drives it (issue 46): it settles on the best fixed
split and stays, at either cadence, and still follows a real change of speed."""

import pytest

from tests.hetero_batch.simulated_ranks import SimulatedRanks, best_fixed, changes, run_tuner

CADENCES = [None, 8]


def quota_ranks(world: int, quota: float, visible: bool = False, per_sample_s: float = 0.001):
    """``world`` ranks at ``per_sample_s`` of CPU per sample, the last under a CFS quota (100 ms periods): its step
    time is bimodal, and unless ``visible`` no busy floor at the quota's rate evens it out."""
    quotas = [None] * (world - 1) + [quota]
    return lambda seed=0: SimulatedRanks(
        [0.001] * world, [per_sample_s] * world, quotas=quotas, noise=0.05, seed=seed, quota_visible=visible
    )


def second_half(run: dict) -> tuple[list, list]:
    half = len(run["splits"]) // 2
    return run["splits"][half - 1 :], run["walls"][half:]


def check_settles(
    factory, global_batch: int, steps_in_epoch: int, every: int | None, ratio: float, seed: int = 1
) -> None:
    _, best_s = best_fixed(factory, global_batch)
    run = run_tuner(factory(seed), global_batch, epochs=3, steps_in_epoch=steps_in_epoch, adjust_every_n_steps=every)
    splits, walls = second_half(run)
    reached = best_s / (sum(walls) / len(walls))
    history = [(h["from"], h["to"], h["reason"]) for h in run["history"]]
    assert changes(splits) <= 1, history
    assert all(split[-1] <= min(split[:-1]) for split in run["splits"]), history  # the throttled rank: no more
    assert reached >= ratio, (reached, history)
    slower: set = set()  # splits rolled back from: measured slower
    for frm, to, reason in history:
        assert to not in slower, history
        if reason == "rollback":
            slower.add(frm)


@pytest.mark.parametrize("visible", [False, True])
@pytest.mark.parametrize("every", CADENCES)
def test_under_the_issues_quota_the_split_settles_and_is_not_revisited(every, visible):
    """2 ranks, rank 1 at 25% of a core, 1 ms of CPU per sample, global batch 64, 3 epochs of 32 steps. Before, the
    cost model reported rank 1's speed changed after every move, which forgot the rolled-back move: 4-6 changes in
    the second half, back and forth between [52, 12] and a split measured slower."""
    check_settles(quota_ranks(2, 0.25, visible), 64, 32, every, ratio=0.95)


@pytest.mark.parametrize(
    ("world", "quota", "global_batch", "steps_in_epoch", "per_sample_s"),
    [
        (2, 0.5, 64, 32, 0.001),
        (2, 0.125, 64, 32, 0.001),
        (2, 0.25, 128, 32, 0.0005),
        (2, 0.25, 64, 32, 0.002),
        (4, 0.25, 64, 32, 0.001),
        (2, 0.25, 64, 256, 0.001),
    ],
)
@pytest.mark.parametrize("every", CADENCES)
def test_the_grid_settles_near_the_best_fixed_split(world, quota, global_batch, steps_in_epoch, per_sample_s, every):
    check_settles(quota_ranks(world, quota, per_sample_s=per_sample_s), global_batch, steps_in_epoch, every, 0.93)


@pytest.mark.parametrize(
    ("quota", "global_batch", "steps_in_epoch", "per_sample_s"),
    [(0.25, 64, 32, 0.001), (0.125, 128, 32, 0.001), (0.5, 64, 32, 0.001), (0.25, 128, 256, 0.0005)],
)
@pytest.mark.parametrize("every", CADENCES)
def test_four_ranks_settle_on_the_best_fixed_split_at_every_seed(
    quota, global_batch, steps_in_epoch, per_sample_s, every
):
    """4 ranks, the last under a quota, seeds 1-3. Before, 0.62-0.86 in some runs: a trial judged on a baseline shorter
    than a quota period rolled back to the equal split; the fits read the stalling rank faster than it is sustained
    and fed it samples ([20, 20, 20, 4] -> [19, 19, 19, 7]); nothing returned to a split measured faster; and the
    last sample or two ([41, 41, 41, 5] against [41, 42, 41, 4]) were never moved off the stalling rank."""
    factory = quota_ranks(4, quota, per_sample_s=per_sample_s)
    for seed in (1, 2, 3):
        check_settles(factory, global_batch, steps_in_epoch, every, ratio=0.95, seed=seed)


@pytest.mark.parametrize("every", CADENCES)
def test_a_speed_flip_inside_an_epoch_is_followed_within_two_periods(every):
    period = 8 if every else 32  # the default cadence adjusts every 32 steps inside an epoch
    ranks = SimulatedRanks([0.002, 0.008], [0.0003, 0.0012], noise=0.05)
    flip = 128 + period + 3
    run = run_tuner(
        ranks,
        64,
        epochs=2,
        steps_in_epoch=128,
        adjust_every_n_steps=every,
        change_at=flip,
        change={"overhead_s": [0.008, 0.002], "per_sample_s": [0.0012, 0.0003]},
    )
    assert run["splits"][flip - 1][0] > 32  # rank 0 was the fast one
    followed = run["splits"][flip + 2 * period]
    assert followed[0] < 32, [(h["step"], h["to"], h["reason"]) for h in run["history"]]


@pytest.mark.parametrize("every", CADENCES)
def test_a_noisy_fast_rank_beside_a_readable_quota_is_not_taken_for_stalling(every):
    """The Docker test's shape (tests/emulation/test_docker_e2e.py): 2 ranks, rank 1 under a quarter-CPU quota it can
    read (its level is its CPU time at the quota's rate, the steadiest of all), global batch 128, 16-step epochs,
    0.75 ms per sample; rank 0's steps vary by up to 30% (a shared host). Before, rank 0's relative error (5-7% on a
    few steps) cleared the stall bar of 5% set by rank 1's, rank 0 was taken for stalling at 64 and no proposal could
    give it more: [64, 64] held for the whole run on seeds 1 and 3 (0.41 of the best fixed split)."""
    factory = lambda seed=0: SimulatedRanks(  # noqa: E731
        [0.002, 0.002], [0.00075] * 2, quotas=[None, 0.25], seed=seed, quota_visible=True, noises=[0.3, 0.05]
    )
    for seed in (1, 2, 3):
        check_settles(factory, 128, 16, every, ratio=0.9, seed=seed)
