"""The old path of :mod:`lightning_hetero.lr_schedules` (``StepSchedules`` is now ``CountedLRSchedulers``).

Kept while ``ps/strategy.py`` still imports from here (issue 13 renamed the module so that "schedule" names one
concept per module); remove once nothing imports it.
"""

from lightning_hetero.lr_schedules import NEVER as NEVER
from lightning_hetero.lr_schedules import CountedLRSchedulers as StepSchedules

__all__ = ["NEVER", "StepSchedules"]
