import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hetero.hetero_batch.controller import BatchSizeController, apportion, step_time_s


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
        ({"global_batch_size": 64, "world_size": 2, "min_batch_size": 0}, "min_batch_size must be positive"),
        (
            {"global_batch_size": 64, "world_size": 2, "min_batch_size": 8, "max_batch_size": 4},
            "exceeds max_batch_size",
        ),
        ({"global_batch_size": 64, "world_size": 2, "min_batch_size": [1, 2, 3]}, "one entry per rank"),
        ({"global_batch_size": 0, "world_size": 2}, "global_batch_size must be positive"),
        ({"global_batch_size": 64, "world_size": 2, "deadband": -0.1}, "deadband"),
    ],
)
def test_bad_configuration_names_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchSizeController(**kwargs)


def test_step_time_is_the_slowest_rank():
    assert step_time_s([10, 30], [10.0, 60.0]) == 1.0
