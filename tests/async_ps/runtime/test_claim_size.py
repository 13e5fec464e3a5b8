import pytest

from lightning_hetero.async_ps.runtime.claim_size import CLAIM_SPAN_S, MAX_CLAIM_CHUNKS, ClaimSize


def starts(size: ClaimSize, step_s: float, count: int, first: float = 0.0) -> list[int]:
    return [size.batch_started(first + step_s * k) for k in range(count)]


def test_fast_steps_share_a_claim_and_slow_steps_claim_one_batch():
    assert starts(ClaimSize(), 0.0045, 6)[-1] == int(CLAIM_SPAN_S / 0.0045)  # the issue's ~4.5 ms steps: 4 a claim
    assert starts(ClaimSize(), 0.065, 6) == [1] * 6  # 65 ms steps: one batch a claim, as before
    assert starts(ClaimSize(), 0.0001, 6)[1:] == [MAX_CLAIM_CHUNKS] * 5  # capped


def test_the_size_follows_a_changed_step_and_ignores_the_time_across_an_epochs_edge():
    size = ClaimSize()
    fast = starts(size, 0.004, 10)
    size.restart()  # a 5 s validation at the epoch's end is not a step
    after_edge = starts(size, 0.004, 3, first=0.036 + 5.0)
    assert fast[-1] == after_edge[-1] == 10
    slowed = starts(size, 0.05, 30, first=10.0)
    assert slowed[-1] == 1  # the worker slowed down: its claims shrink to one batch


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [({"span_s": 0.0}, "span_s"), ({"max_chunks": 0}, "max_chunks"), ({"smoothing": 2}, "smoothing")],
)
def test_bad_settings_fail_naming_them(kwargs, setting):
    with pytest.raises(ValueError, match=setting):
        ClaimSize(**kwargs)
