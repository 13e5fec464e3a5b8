import pytest

from lightning_hetero.switching.search import search_bsp_fraction


def threshold_accuracy(knee):
    """Accuracy that matches full BSP (0.9) from a BSP share of ``knee`` up, and is 5 points lower below it."""
    return lambda fraction: 0.9 if fraction >= knee else 0.85


def test_halving_stops_at_the_first_share_that_loses_accuracy():
    calls = []

    def run(fraction):
        calls.append(fraction)
        return threshold_accuracy(0.2)(fraction)

    result = search_bsp_fraction(run)
    assert result.bsp_fraction == 0.25
    assert result.reference_accuracy == 0.9
    assert calls == [1.0, 0.5, 0.25, 0.125]
    assert result.trials == ((1.0, 0.9), (0.5, 0.9), (0.25, 0.9), (0.125, 0.85))


def test_refinement_bisects_towards_the_knee():
    result = search_bsp_fraction(threshold_accuracy(0.2), refine_steps=6)
    assert 0.2 <= result.bsp_fraction < 0.2 + 0.125 / 2**6


def test_tolerance_counts_small_losses_as_matching():
    accuracy = {1.0: 0.900, 0.5: 0.897, 0.25: 0.893, 0.125: 0.880}
    assert search_bsp_fraction(accuracy.__getitem__, tolerance=0.005).bsp_fraction == 0.5
    assert search_bsp_fraction(accuracy.__getitem__, tolerance=0.01).bsp_fraction == 0.25


def test_stops_at_min_fraction_when_everything_matches():
    result = search_bsp_fraction(lambda f: 0.9, min_fraction=0.1)
    assert result.bsp_fraction == 0.125
    assert [f for f, _ in result.trials] == [1.0, 0.5, 0.25, 0.125]


def test_full_bsp_when_no_smaller_share_matches():
    result = search_bsp_fraction(threshold_accuracy(1.0), refine_steps=2)
    assert result.bsp_fraction == 1.0
    assert [f for f, _ in result.trials] == [1.0, 0.5, 0.75, 0.875]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"tolerance": -1}, "tolerance"), ({"min_fraction": 0}, "min_fraction"), ({"refine_steps": -1}, "refine")],
)
def test_rejects_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        search_bsp_fraction(lambda f: 1.0, **kwargs)
