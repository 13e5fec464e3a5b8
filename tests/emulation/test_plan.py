import pytest

from lightning_hetero.emulation.plan import ContainerUpdate, PlanError, plan_level
from lightning_hetero.emulation.presets import Allocation, Level, preset_level


def test_quota_level_pins_all_cores_and_sets_quota():
    updates = plan_level(preset_level("HL2", "bsp", host_cpus=2), ["a", "b", "c", "d"], host_cpus=2)
    assert [u.cpuset_cpus for u in updates] == ["0-1"] * 4
    assert [u.cpu_quota for u in updates] == [50000, 50000, 33300, 66700]


def test_cpuset_level_lifts_the_quota():
    (update,) = plan_level(Level("x", (Allocation(cpuset="1"),)), ["a"], host_cpus=2, cpu_period_us=50_000)
    assert update == ContainerUpdate("a", "1", -1, 50_000)
    assert update.kwargs() == {"cpuset_cpus": "1", "cpu_quota": -1, "cpu_period": 50_000}


def test_cpuset_and_quota_together():
    (update,) = plan_level(Level("x", (Allocation(cpuset="0-3", cpus=1.5),)), ["a"], host_cpus=4)
    assert (update.cpuset_cpus, update.cpu_quota) == ("0-3", 150_000)


@pytest.mark.parametrize(
    ("allocation", "message"),
    [
        (Allocation(cpuset="0-3"), r"level x, container a: cpuset 0-3 names cores \[2, 3\] beyond the host's 2"),
        (Allocation(cpus=3.0), r"cpus=3.0 must be in \(0, 2\]"),
        (Allocation(cpuset="0", cpus=1.5), r"cpus=1.5 must be in \(0, 1\]"),
        (Allocation(cpus=0.001), "below the kernel's 1 ms quota"),
        (Allocation(cpuset="x"), "invalid cpuset"),
    ],
)
def test_allocations_that_do_not_fit_the_host(allocation, message):
    with pytest.raises(PlanError, match=message):
        plan_level(Level("x", (allocation,)), ["a"], host_cpus=2)


def test_allocation_count_must_match_containers():
    with pytest.raises(PlanError, match="level HL1 has 5 allocations but there are 4 containers"):
        plan_level(preset_level("HL1", "asp", host_cpus=2), ["a", "b", "c", "d"], host_cpus=2)
