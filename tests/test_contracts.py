import pytest

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.contracts import (
    MODES,
    CompensatedStrategy,
    HeteroBatchStrategy,
    SwitchableStrategy,
    check_mode,
)
from lightning_hetero.switching import policies


def test_async_ps_strategy_offers_every_contract():
    strategy = AsyncPSStrategy(mode="asp")
    assert isinstance(strategy, HeteroBatchStrategy) and not strategy.in_lock_step
    assert isinstance(strategy, SwitchableStrategy) and isinstance(strategy, CompensatedStrategy)
    strategy.set_mode("bsp")
    assert strategy.in_lock_step


def test_a_strategy_missing_a_member_is_not_switchable():
    class NoCost:
        mode = "bsp"

        def set_mode(self, mode):
            self.mode = mode

    assert not isinstance(NoCost(), SwitchableStrategy)
    assert not isinstance(NoCost(), HeteroBatchStrategy)


def test_one_mode_type_and_its_old_import_path():
    assert policies.MODES is MODES and policies.check_mode is check_mode
    with pytest.raises(ValueError, match="mode must be one of"):
        check_mode("sync")


def test_the_slowdown_emulator_is_a_cpu_quota_clock_only_when_it_throttles_by_quota():
    from lightning_hetero.contracts import CpuQuotaClock
    from lightning_hetero.emulation.slowdown import SlowdownEmulator

    cfs, sleep = SlowdownEmulator({0: 4.0}, throttle="cfs"), SlowdownEmulator({0: 4.0})
    assert isinstance(cfs, CpuQuotaClock) and isinstance(sleep, CpuQuotaClock)
    assert cfs.emulates_cpu_quota and not sleep.emulates_cpu_quota
