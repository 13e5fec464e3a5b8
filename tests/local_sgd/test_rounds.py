import pytest
import torch

from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.local_sgd.rounds import LocalRounds, RoundBudget
from lightning_hetero.measurement import ThroughputMeter


def averaging() -> OuterOptimizer:
    return OuterOptimizer(torch.optim.SGD, {"lr": 1.0})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_ranks(
    world_size, budget=None, outer=averaging, local_steps="proportional", warmup=0, weighting="mean", clock=None
):
    ranks = [
        LocalRounds(
            budget or RoundBudget(samples=8),
            rank,
            world_size,
            outer(),
            local_steps,
            ThroughputMeter(smoothing=1.0, warmup_steps=warmup),
            weighting,
            clock=clock or FakeClock(),
        )
        for rank in range(world_size)
    ]
    return ranks


def all_reduce(ranks, params, buffers=None, done=None):
    """Simulates the SUM all-reduce of the round's end across ranks."""
    done = done or [False] * len(ranks)
    buffers = buffers or [None] * len(ranks)
    total = sum(r.message(p, b, d) for r, p, b, d in zip(ranks, params, buffers, done, strict=True))
    return [r.apply(total.clone(), p, b) for r, p, b in zip(ranks, params, buffers, strict=True)]


# ---------------------------------------------------------------- LocalRounds


def test_the_message_is_one_buffer_kept_across_rounds_that_apply_may_take_in_place():
    # one rank: the all-reduce is the identity, so apply gets the rank's own message, as the engine's in-place
    # all-reduce hands it over
    rounds = make_ranks(1, weighting="samples")[0]
    flat, buffers = torch.tensor([1.0, 2.0]), torch.tensor([4.0])
    rounds.begin(flat, batch_size=1)
    pointers = []
    for end, samples in (([0.0, 4.0], 2), ([2.0, 0.0], 4)):
        start = flat.clone()
        flat.copy_(torch.tensor(end))
        rounds.samples_in_round, rounds.steps_in_round = samples, 1
        message = rounds.message(flat, buffers)
        pointers.append(message.data_ptr())
        assert message[:3].tolist() == [*((start - flat) * samples).tolist(), 4.0 * samples]  # weighted by samples
        rounds.apply(message, flat, buffers)
        assert flat.tolist() == end and buffers.tolist() == [4.0]  # averaging one rank: its own end and buffers
        assert rounds.outer.anchor.tolist() == end
    assert pointers[0] == pointers[1]  # no new buffer of the model's size per round end
    assert rounds.message(flat).numel() == 2 + 4 + 2  # without buffers: a message of its own size


def finish_round(ranks, params, ends, samples):
    start = torch.tensor([1.0, 2.0])
    for r, p, end, n in zip(ranks, params, ends, samples, strict=True):
        p.copy_(start)
        r.begin(p, batch_size=1)
        p.copy_(end)
        r.samples_in_round = n
        r.steps_in_round = 1
    return all_reduce(ranks, params)


ENDS = [torch.tensor([0.0, 2.0]), torch.tensor([1.0, 5.0]), torch.tensor([4.0, -1.0])]


def test_pseudo_gradients_are_combined_weighted_by_samples():
    ranks = make_ranks(3, weighting="samples")
    params = [torch.zeros(2) for _ in ranks]
    samples = [1, 2, 5]
    outcomes = finish_round(ranks, params, ENDS, samples)
    expected = sum(n * e for n, e in zip(samples, ENDS, strict=True)) / sum(samples)
    for p in params:
        assert torch.allclose(p, expected)
    assert outcomes[0].samples == 8 and outcomes[0].steps == 3 and not outcomes[0].all_done
    assert all(r.rounds == 1 and r.steps_total == 3 for r in ranks)


def test_pseudo_gradients_are_combined_as_a_plain_mean_by_default():
    ranks = make_ranks(3)
    assert ranks[0].weighting == "mean"
    params = [torch.zeros(2) for _ in ranks]
    outcomes = finish_round(ranks, params, ENDS, [1, 2, 5])  # the fast rank's 5 samples weigh as the slow one's 1
    for p in params:
        assert torch.allclose(p, sum(ENDS) / 3)
    assert outcomes[0].samples == 8


def test_a_rank_without_samples_is_left_out_of_the_mean():
    ranks = make_ranks(3)
    params = [torch.zeros(2) for _ in ranks]
    finish_round(ranks, params, ENDS, [1, 0, 5])  # rank 1's share of the epoch is done: it only meets the others
    for p in params:
        assert torch.allclose(p, (ENDS[0] + ENDS[2]) / 2)


def test_unknown_weighting_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="pseudo_gradient_weighting must be one of"):
        make_ranks(1, weighting="steps")


def test_outer_nesterov_step_is_applied_to_the_start_of_round_parameters():
    ranks = make_ranks(2, outer=lambda: OuterOptimizer(torch.optim.SGD, {"lr": 0.7, "momentum": 0.9, "nesterov": True}))
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=1)
    params[0].fill_(-1.0)  # pseudo-gradients 1 and 3, equal weights: mean 2
    params[1].fill_(-3.0)
    for r in ranks:
        r.record_step(samples=4, step_s=None)
    all_reduce(ranks, params)
    # Nesterov SGD's first step: -lr * (1 + momentum) * g
    assert torch.allclose(params[0], torch.tensor([-0.7 * 1.9 * 2.0]))
    assert torch.equal(params[0], params[1])
    assert torch.equal(ranks[0].outer.anchor, params[0])


def test_buffers_are_averaged_weighted_by_samples():
    ranks = make_ranks(2, weighting="samples")
    params = [torch.zeros(1), torch.zeros(1)]
    buffers = [torch.tensor([2.0, 0.0]), torch.tensor([6.0, 4.0])]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=1)
    ranks[0].record_step(samples=3, step_s=None)
    ranks[1].record_step(samples=1, step_s=None)
    all_reduce(ranks, params, buffers)
    for b in buffers:
        assert torch.allclose(b, torch.tensor([3.0, 1.0]))


def test_a_round_without_samples_takes_no_outer_step():
    ranks = make_ranks(2, outer=OuterOptimizer)
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=1)
        p.fill_(-1.0)
        r.record_step(samples=1, step_s=None)
    all_reduce(ranks, params)
    after_first = params[0].clone()
    outcomes = all_reduce(ranks, params, done=[True, True])  # momentum alone would move the anchor again
    assert outcomes[0].samples == 0 and outcomes[0].all_done
    assert torch.equal(params[0], after_first) and torch.equal(params[1], after_first)
    assert ranks[0].rounds == 1


def test_the_epoch_ends_when_every_rank_is_done():
    ranks = make_ranks(2)
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=1)
    ranks[0].record_step(samples=1, step_s=None)
    assert not all_reduce(ranks, params, done=[True, False])[0].all_done  # rank 0 done, rank 1 still training
    params[1].fill_(2.0)
    ranks[1].record_step(samples=2, step_s=None)
    outcomes = all_reduce(ranks, params, done=[True, True])
    assert [o.all_done for o in outcomes] == [True, True]
    assert torch.equal(params[0], torch.tensor([2.0]))  # only rank 1 trained in that round: its end wins


def test_measured_rates_make_the_fast_rank_take_more_local_steps():
    clock = FakeClock()
    ranks = make_ranks(2, budget=RoundBudget(samples=40), warmup=0, clock=clock)
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=4)
    assert [r.target_steps for r in ranks] == [5, 5] and ranks[0].round_s is None  # speeds unknown: equal steps
    assert [ranks[0].record_step(4, None) for _ in range(5)] == [False] * 4 + [True]
    ranks[0].record_step(samples=4, step_s=0.01)  # 400 samples/s
    ranks[1].record_step(samples=4, step_s=0.04)  # 100 samples/s
    all_reduce(ranks, params)
    assert all(r.rates == pytest.approx([400.0, 100.0]) for r in ranks)
    assert [r.target_steps for r in ranks] == [8, 2]
    assert ranks[0].plans[-1] == ranks[1].plans[-1] == [8, 2]
    # the round now lasts its 40 samples at the summed 500 samples/s: 80 ms, whatever the steps take
    assert ranks[0].round_s == ranks[1].round_s == pytest.approx(0.08)

    def steps_until_done(rank, step_s):
        for step in range(1, 100):
            clock.now += step_s
            if ranks[rank].record_step(4, step_s):
                return step
        raise AssertionError("never done")

    clock.now = 0.0
    for r in ranks:  # both rounds start at the all-reduce's end
        r._round_start = 0.0
    assert steps_until_done(0, 0.01) == 8  # 80 ms of 10 ms steps: the planned 8
    clock.now = 0.0
    assert steps_until_done(1, 0.026) == 3  # the slow rank got faster than measured: 3 steps end at 78 ms, not 2


def test_a_rank_stops_at_the_step_that_ends_closest_to_the_deadline():
    clock = FakeClock()
    (rounds,) = make_ranks(1, budget=RoundBudget(seconds=0.1), clock=clock)
    rounds.rates = [1000.0]
    rounds.begin(torch.zeros(1), batch_size=10)
    assert rounds.round_s == 0.1 and rounds.target_steps == 10
    done = []
    for _ in range(3):
        clock.now += 0.04
        done.append(rounds.record_step(10, 0.04))
    # 80 ms + half a 40 ms step = 100 ms: the second step ends it (a third would end 20 ms late, not 20 ms early)
    assert done == [False, True, True]


def test_a_slower_rank_stops_at_its_last_step_that_ends_before_the_fastest_ranks_half_step_past_the_deadline():
    clock = FakeClock()
    ranks = make_ranks(2, budget=RoundBudget(seconds=0.1), clock=clock)
    for r in ranks:
        r.rates = [1000.0, 250.0]  # steps of 10 and 40 ms for batches of 10
        r.begin(torch.zeros(1), batch_size=10)

    def steps_until_done(rank, step_s):
        clock.now = ranks[rank]._round_start = 0.0
        for step in range(1, 100):
            clock.now += step_s
            if ranks[rank].record_step(10, step_s):
                return step
        raise AssertionError("never done")

    assert steps_until_done(0, 0.01) == 10  # the fastest rank ends at the deadline (100 ms)
    # 36 ms steps: a third would end at 108 ms, nearer the deadline than 72 ms but 8 ms past it, where the fastest
    # rank's last step ends at most 5 ms past it: the others would wait for it
    assert steps_until_done(1, 0.036) == 2
    assert steps_until_done(1, 0.034) == 3  # a third ends at 102 ms: within half a step of the fastest rank


@pytest.mark.parametrize(("lefts", "to_epoch_end"), [([151, 400], False), ([149, 400], True), ([None, None], False)])
def test_a_round_runs_on_to_the_epochs_end_when_less_than_one_and_a_half_rounds_are_left(lefts, to_epoch_end):
    clock = FakeClock()
    ranks = make_ranks(2, budget=RoundBudget(samples=100), clock=clock)
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.rates = [500.0, 500.0]  # a round: 100 samples, 0.1 s
        r.begin(p, batch_size=10)
        r.record_step(10, 0.02)
    total = sum(r.message(p, epoch_left=left) for r, p, left in zip(ranks, params, lefts, strict=True))
    for r, p in zip(ranks, params, strict=True):
        r.apply(total.clone(), p)
    # every rank decides alike, from the smallest view of the pool
    assert [r.epoch_left for r in ranks] == [None if lefts[0] is None else min(lefts)] * 2
    assert [r.to_epoch_end for r in ranks] == [to_epoch_end] * 2
    clock.now = 1.0  # far past the deadline
    assert [r.record_step(10, 0.02) for r in ranks] == [not to_epoch_end] * 2


def test_equal_steps_and_unknown_speeds_have_no_deadline():
    (equal,) = make_ranks(1, budget=RoundBudget(seconds=0.1), local_steps="equal")
    equal.rates = [1000.0]
    equal.begin(torch.zeros(1), batch_size=10)
    (unknown,) = make_ranks(1, budget=RoundBudget(seconds=0.1))
    unknown.begin(torch.zeros(1), batch_size=10)
    assert equal.round_s is None and equal.target_steps == 10
    assert unknown.round_s is None and unknown.target_steps == 1


def test_the_epochs_last_round_end_starts_no_round_and_the_next_begin_restarts_the_deadline():
    clock = FakeClock()
    ranks = make_ranks(2, budget=RoundBudget(samples=40), clock=clock)
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.rates = [400.0, 100.0]
        r.begin(p, batch_size=4)
        r.record_step(4, 0.01)
    assert len(ranks[0].plans) == 1
    all_reduce(ranks, params, done=[True, True])
    assert len(ranks[0].plans) == 1  # no round started at the epoch's end
    clock.now = 5.0  # validation, the next epoch's start
    ranks[0].begin(params[0], batch_size=4)
    assert len(ranks[0].plans) == 2
    clock.now = 5.01
    assert not ranks[0].record_step(4, 0.01)  # 10 ms into a round of 80 ms, not 5 s past its deadline


@pytest.mark.parametrize(("rates", "chunks"), [([None, None], [16, 16]), ([700.0, 100.0], [28, 4])])
def test_claims_take_the_planned_steps_at_once(rates, chunks):
    ranks = make_ranks(2, budget=RoundBudget(samples=128))  # 32 steps of 4: [16, 16], then [28, 4]
    for r in ranks:
        r.rates = list(rates)
        r.begin(torch.zeros(1), batch_size=4)
    assert [r.claim_chunks for r in ranks] == chunks


def test_equal_local_steps_keep_the_plan_equal_after_measuring():
    ranks = make_ranks(2, budget=RoundBudget(samples=40), local_steps="equal")
    params = [torch.zeros(1), torch.zeros(1)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=4)
    ranks[0].record_step(samples=4, step_s=0.01)
    ranks[1].record_step(samples=4, step_s=0.04)
    all_reduce(ranks, params)
    assert [r.target_steps for r in ranks] == [5, 5]


def test_bytes_sent_count_every_round_end_message():
    ranks = make_ranks(2)
    params = [torch.zeros(10), torch.zeros(10)]
    for r, p in zip(ranks, params, strict=True):
        r.begin(p, batch_size=1)
    all_reduce(ranks, params)
    all_reduce(ranks, params)
    assert ranks[0].bytes_sent == 2 * (10 + 4 + 2 + 2) * 4


def test_state_dict_resumes_rounds_rates_and_outer_momentum():
    def run(rounds_before_save):
        ranks = make_ranks(2, outer=OuterOptimizer)
        params = [torch.zeros(2), torch.zeros(2)]
        for r, p in zip(ranks, params, strict=True):
            r.begin(p, batch_size=1)
        for i in range(3):
            if i == rounds_before_save:
                states = [r.state_dict() for r in ranks]
                ranks = make_ranks(2, outer=OuterOptimizer)
                for r, s, p in zip(ranks, states, params, strict=True):
                    r.load_state_dict(s)
                    r.begin(p, batch_size=1)
            for k, (r, p) in enumerate(zip(ranks, params, strict=True)):
                p.sub_(torch.tensor([0.1 * (i + 1), -0.2 * k]))
                r.record_step(samples=k + 1, step_s=0.01 * (k + 1))
            all_reduce(ranks, params)
        return params[0], ranks[0]

    uninterrupted, reference = run(rounds_before_save=-1)
    resumed, rounds = run(rounds_before_save=2)
    assert torch.allclose(uninterrupted, resumed)
    assert (rounds.rounds, rounds.steps_total, rounds.rates) == (
        reference.rounds,
        reference.steps_total,
        reference.rates,
    )


def test_message_before_begin_fails():
    with pytest.raises(RuntimeError, match="before begin"):
        LocalRounds(RoundBudget(samples=8), 0, 1).message(torch.zeros(1))


def test_an_unknown_local_steps_policy_is_refused_by_the_rounds():
    with pytest.raises(ValueError, match="local_steps must be one of"):
        LocalRounds(RoundBudget(samples=8), 0, 1, local_steps="fast")


def test_a_ranks_speed_is_its_rounds_samples_over_busy_seconds_so_a_throttled_period_counts_in_full():
    # a CPU quota of 1/4: seven steps of 3 ms at full speed, then one that waits out the throttled period (78 ms)
    (quota,) = make_ranks(1, budget=RoundBudget(samples=32 * 8))
    quota.begin(torch.zeros(1), batch_size=32)
    for step_s in [0.003] * 7 + [0.078]:
        quota.record_step(32, step_s)
    all_reduce([quota], [torch.zeros(1)])
    assert quota.rates[0] == pytest.approx(8 * 32 / 0.099)  # 2,586 samples/s; a mean of the steps' rates: 9,350
    (default,) = [LocalRounds(RoundBudget(samples=64), 0, 1)]  # its own meter leaves the first 3 steps out
    default.begin(torch.zeros(1), batch_size=32)
    for step_s in [1.0, 1.0, 1.0, 0.01, 0.03]:
        default.record_step(32, step_s)
    all_reduce([default], [torch.zeros(1)])
    assert default.rates[0] == pytest.approx(64 / 0.04)
