import pytest

from lightning_hetero.emulation.presets import OMNILEARN_CORES, Allocation, apportion, parse_cpuset, preset_level


@pytest.mark.parametrize("variant", ["bsp", "asp"])
@pytest.mark.parametrize("name", ["HL1", "HL2", "HL4", "HL8"])
def test_tables_at_48_cores_are_omnilearns(variant, name):
    level = preset_level(name, variant, host_cpus=48)
    cores = [len(parse_cpuset(a.cpuset)) for a in level.allocations]
    assert tuple(cores) == OMNILEARN_CORES[variant][name]
    pinned = [parse_cpuset(a.cpuset) for a in level.allocations]
    assert frozenset().union(*pinned) == frozenset(range(48))
    assert sum(map(len, pinned)) == 48  # disjoint


def test_heterogeneity_level_is_max_over_min_cores():
    for name, hl in [("HL1", 1), ("HL2", 2), ("HL4", 4), ("HL8", 8)]:
        cores = OMNILEARN_CORES["bsp"][name]
        assert max(cores) / min(cores) == hl


def test_quota_scaling_keeps_ratios_on_a_small_host():
    level = preset_level("HL8", "bsp", host_cpus=2)
    cpus = [a.cpus for a in level.allocations]
    assert all(a.cpuset is None for a in level.allocations)
    assert max(cpus) / min(cpus) == pytest.approx(8, rel=0.01)
    assert sum(cpus) == pytest.approx(2, abs=0.01)


def test_cpuset_scaling_rounds_to_whole_cores():
    level = preset_level("HL2", "bsp", host_cpus=8, allocation="cpuset")
    assert [a.cpuset for a in level.allocations] == ["0-1", "2-3", "4", "5-7"]


def test_auto_pins_from_48_cores():
    assert preset_level("HL1", "bsp", host_cpus=96).allocations[0] == Allocation(cpuset="0-23")
    assert preset_level("HL1", "bsp", host_cpus=24).allocations[0] == Allocation(cpus=6.0)


def test_apportion_sums_exactly_and_respects_minimum():
    for total in range(4, 60):
        shares = apportion([6, 6, 4, 32], total)
        assert sum(shares) == total
        assert min(shares) >= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "HL3"}, "unknown preset 'HL3'"),
        ({"name": "HL1", "variant": "sync"}, "unknown variant"),
        ({"name": "HL1", "allocation": "pin"}, "unknown allocation"),
        ({"name": "HL1", "host_cpus": 0}, "host_cpus must be an integer >= 1"),
        ({"name": "HL1", "host_cpus": 3, "allocation": "cpuset"}, "the host has 3 cores; use allocation=quota"),
    ],
)
def test_bad_preset_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        preset_level(**kwargs)


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "0,,2"])
def test_parse_cpuset_rejects_malformed(text):
    with pytest.raises(ValueError, match="cpuset"):
        parse_cpuset(text)
