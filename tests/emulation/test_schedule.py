import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.emulation.schedule import OMNILEARN_SCHEDULES, LevelSchedule


def test_omnilearn_resnet18_routine():
    schedule = LevelSchedule.named("omnilearn-resnet18")
    levels = [schedule.level_at(epoch) for epoch in range(45)]
    assert levels[:5] == ["HL1"] * 5
    assert levels[15:25] == ["HL8"] * 10
    assert levels[35:] == ["HL1"] * 10
    assert schedule.final_start == 35


def test_wall_clock_schedule_uses_fractional_seconds():
    schedule = LevelSchedule.from_steps("seconds", [(0, "HL1"), (1.5, "HL8")])
    assert [schedule.level_at(t) for t in (0.0, 1.49, 1.5, 1e6)] == ["HL1", "HL1", "HL8", "HL8"]


@given(st.lists(st.integers(min_value=1, max_value=500), unique=True, max_size=8), st.integers(0, 600))
def test_level_at_is_the_last_step_started(later_starts, position):
    starts = [0, *sorted(later_starts)]
    schedule = LevelSchedule.from_steps("epoch", [(s, f"L{s}") for s in starts])
    assert schedule.level_at(position) == f"L{max(s for s in starts if s <= position)}"


@pytest.mark.parametrize(
    ("unit", "steps", "message"),
    [
        ("epochs", [(0, "HL1")], "unit must be one of"),
        ("epoch", [], "at least one step"),
        ("epoch", [(1, "HL1")], "first step must start at 0"),
        ("epoch", [(0, "HL1"), (5, "HL2"), (5, "HL4")], "increase strictly"),
    ],
)
def test_bad_schedules(unit, steps, message):
    with pytest.raises(ValueError, match=message):
        LevelSchedule.from_steps(unit, steps)


def test_unknown_named_schedule_lists_the_known_ones():
    with pytest.raises(ValueError, match=", ".join(OMNILEARN_SCHEDULES)):
        LevelSchedule.named("resnet18")


def test_the_old_name_of_level_schedule_still_works_with_a_deprecation_warning():
    from lightning_hetero.emulation import schedule

    with pytest.deprecated_call(match="emulation.schedule.Schedule is deprecated"):
        assert schedule.Schedule is LevelSchedule
