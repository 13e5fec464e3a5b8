"""Switching between synchronous (BSP) and asynchronous (ASP) training at epoch boundaries (Sync-Switch's idea,
in-process).

Modules: ``policies`` (which mode each epoch trains in), ``straggler`` (transient-straggler detection),
``search`` (the offline search for the smallest BSP share), ``hyperparams`` (per-phase learning rate and momentum)
and ``callback`` (the Lightning glue).
"""

from lightning_hetero._deprecation import renamed_attributes
from lightning_hetero.switching.callback import SyncSwitchCallback
from lightning_hetero.switching.hyperparams import LRScheduleClock, PhaseHyperparamController, PhaseHyperparams
from lightning_hetero.switching.policies import (
    EpochContext,
    FixedFractionPolicy,
    GreedyPolicy,
    SchedulePolicy,
    SwitchPolicy,
    parse_schedule,
    plan,
)
from lightning_hetero.switching.search import SearchResult, search_bsp_fraction
from lightning_hetero.switching.straggler import StragglerDetector

__all__ = [
    "EpochContext",
    "FixedFractionPolicy",
    "GreedyPolicy",
    "LRScheduleClock",
    "PhaseHyperparamController",
    "PhaseHyperparams",
    "SchedulePolicy",
    "SearchResult",
    "StragglerDetector",
    "SwitchPolicy",
    "SyncSwitchCallback",
    "parse_schedule",
    "plan",
    "search_bsp_fraction",
]


# renamed in issue 13; the old name goes in the next release
__getattr__ = renamed_attributes(__name__, {"StepScheduleClock": ("LRScheduleClock", LRScheduleClock)})
