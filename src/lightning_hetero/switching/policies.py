"""Switching policies: which synchronisation mode ("bsp" or "asp") each epoch trains in.

A policy is a small pure object. Before every epoch :class:`~lightning_hetero.switching.SyncSwitchCallback` hands it
an :class:`EpochContext` (the epoch, the planned number of epochs, the modes of the epochs already trained and
whether a straggler is currently detected on any rank) and applies the mode it returns. Everything a built-in
policy decides follows from that context, so the callback's checkpointed history is all a resumed run needs.

Writing your own policy: subclass :class:`SwitchPolicy` and implement :meth:`SwitchPolicy.mode_for_epoch`. It must
be deterministic in its context, because every rank asks it independently and all ranks must get the same answer.

Example::

    >>> class AlternatePolicy(SwitchPolicy):
    ...     def mode_for_epoch(self, context):
    ...         return "bsp" if context.epoch % 2 == 0 else "asp"
    >>> plan(AlternatePolicy(), max_epochs=4)
    ['bsp', 'asp', 'bsp', 'asp']
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

from lightning_hetero._validation import check_range
from lightning_hetero.contracts import MODES, Mode, check_mode  # noqa: F401  (check_mode: the old import path)

# Fractions such as 0.07 * 100 = 7.000000000000001 must not round up to an extra epoch.
_EPS = 1e-9


def share_in_epochs(fraction: float, max_epochs: int) -> int:
    """The number of whole epochs that make up ``fraction`` of ``max_epochs``, rounded up (a positive share gets at
    least one epoch, since modes change only at epoch boundaries).

    Example::

        >>> share_in_epochs(0.05, 10), share_in_epochs(0.25, 8), share_in_epochs(0.0, 8)
        (1, 2, 0)
    """
    return max(0, math.ceil(fraction * max_epochs - _EPS))


@dataclass(frozen=True)
class EpochContext:
    """What a policy sees when it chooses the mode of one epoch.

    Args:
        epoch: the epoch about to be trained (0-based).
        max_epochs: the Trainer's ``max_epochs``, or ``None`` when training is not bounded in epochs.
        history: the modes the epochs ``0 .. epoch - 1`` trained in.
        straggler: whether a straggler is detected on any rank at the end of the previous epoch.
    """

    epoch: int
    max_epochs: int | None
    history: tuple[str, ...] = ()
    straggler: bool = False


class SwitchPolicy(ABC):
    """Base class of switching policies; see the module docstring for the contract.

    Subclasses implement :meth:`mode_for_epoch`. They set ``needs_max_epochs = True`` when they cannot plan without
    the Trainer's ``max_epochs``, may override :meth:`check_max_epochs` to reject other run lengths (called once at
    setup), and set ``uses_stragglers = True`` when their decision depends on :attr:`EpochContext.straggler` (the
    callback then measures per-rank throughput and runs the detector).
    """

    needs_max_epochs: bool = False
    uses_stragglers: bool = False

    @abstractmethod
    def mode_for_epoch(self, context: EpochContext) -> Mode:
        """Return ``"bsp"`` or ``"asp"`` for ``context.epoch``."""

    def check_max_epochs(self, max_epochs: int | None) -> None:
        """Raise ``ValueError`` when this policy cannot plan a run of ``max_epochs`` epochs."""
        if max_epochs is None and self.needs_max_epochs:
            raise ValueError(f"{type(self).__name__} needs the Trainer's max_epochs to plan its phases")


class FixedFractionPolicy(SwitchPolicy):
    """A share of the epochs in BSP and the rest in ASP (Sync-Switch's offline policy).

    The share is rounded up to whole epochs: ``bsp_fraction=0.05`` of 10 epochs trains 1 epoch in BSP.

    Args:
        bsp_fraction: the share of ``max_epochs`` trained in BSP, in [0, 1].
        first: the mode of the first phase; ``"bsp"`` (BSP then ASP, the order Sync-Switch found best) or
            ``"asp"`` (ASP then BSP).

    Example::

        >>> plan(FixedFractionPolicy(bsp_fraction=0.25), max_epochs=8)
        ['bsp', 'bsp', 'asp', 'asp', 'asp', 'asp', 'asp', 'asp']
        >>> plan(FixedFractionPolicy(bsp_fraction=0.25, first="asp"), max_epochs=4)
        ['asp', 'asp', 'asp', 'bsp']
    """

    needs_max_epochs = True

    def __init__(self, bsp_fraction: float = 0.05, first: Mode = "bsp") -> None:
        check_range("bsp_fraction", bsp_fraction, low=0, high=1)
        self.bsp_fraction = bsp_fraction
        if first not in ("bsp", "asp"):
            raise ValueError(f"first must be 'bsp' or 'asp', got {first!r}")
        self.first: Mode = first

    def mode_for_epoch(self, context: EpochContext) -> Mode:
        self.check_max_epochs(context.max_epochs)
        assert context.max_epochs is not None
        bsp_epochs = share_in_epochs(self.bsp_fraction, context.max_epochs)
        if self.first == "bsp":
            return "bsp" if context.epoch < bsp_epochs else "asp"
        return "bsp" if context.epoch >= context.max_epochs - bsp_epochs else "asp"

    def __repr__(self) -> str:
        return f"FixedFractionPolicy(bsp_fraction={self.bsp_fraction}, first={self.first!r})"


_SEGMENT = re.compile(r"^(?P<mode>[a-z]+):(?P<start>\d+)(?:(?P<dash>-)(?P<end>\d+)?)?$")


@dataclass(frozen=True)
class Phase:
    """Epochs ``start .. end`` (inclusive; ``end=None``: to the end of training) trained in ``mode``."""

    mode: Mode
    start: int
    end: int | None

    def __str__(self) -> str:
        end = "" if self.end is None else str(self.end)
        return f"{self.mode}:{self.start}" if self.end == self.start else f"{self.mode}:{self.start}-{end}"


def parse_schedule(schedule: str) -> tuple[Phase, ...]:
    """Parse ``"bsp:0-4,asp:5-"`` into phases sorted by their first epoch.

    Segments are ``mode:first-last`` (inclusive), ``mode:first-`` (to the end of training) or ``mode:epoch``, in any
    order. The phases must cover the epochs from 0 without gaps or overlaps; only the last may be open-ended.

    Example::

        >>> [str(p) for p in parse_schedule("asp:5-, bsp:0-4")]
        ['bsp:0-4', 'asp:5-']
        >>> parse_schedule("bsp:0-4,asp:3-")
        Traceback (most recent call last):
        ...
        ValueError: schedule 'bsp:0-4,asp:3-': phases bsp:0-4 and asp:3- overlap at epoch 3
    """
    where = f"schedule {schedule!r}"
    segments = [segment.strip().lower() for segment in schedule.split(",")] if schedule.strip() else []
    if not segments:
        raise ValueError(f"{where} is empty; expected segments such as 'bsp:0-4,asp:5-'")
    phases = []
    for segment in segments:
        match = _SEGMENT.match(segment)
        if match is None:
            raise ValueError(f"{where}: cannot parse segment {segment!r}; expected 'mode:first-last' or 'mode:first-'")
        if match["mode"] not in MODES:
            raise ValueError(f"{where}: unknown mode {match['mode']!r} in segment {segment!r}; modes are {MODES}")
        start = int(match["start"])
        end = None if match["dash"] and match["end"] is None else int(match["end"] or start)
        if end is not None and end < start:
            raise ValueError(f"{where}: segment {segment!r} ends before it starts")
        phases.append(Phase(match["mode"], start, end))
    phases.sort(key=lambda phase: phase.start)
    expected = 0
    for previous, phase in zip([None, *phases], phases, strict=False):
        if previous is not None and previous.end is None:
            raise ValueError(f"{where}: phase {previous} runs to the end of training, but {phase} follows it")
        if phase.start < expected:
            assert previous is not None
            raise ValueError(f"{where}: phases {previous} and {phase} overlap at epoch {phase.start}")
        if phase.start > expected:
            raise ValueError(f"{where}: no mode for epochs {expected}-{phase.start - 1}")
        expected = phase.end + 1 if phase.end is not None else expected
    return tuple(phases)


class SchedulePolicy(SwitchPolicy):
    """An explicit epoch schedule such as ``"bsp:0-4,asp:5-"``; see :func:`parse_schedule` for the syntax.

    Args:
        schedule: the schedule string. Empty, overlapping, gapped or unknown-mode schedules raise ``ValueError``.

    Example::

        >>> policy = SchedulePolicy("asp:0-1,bsp:2-3,asp:4-")
        >>> plan(policy, max_epochs=6)
        ['asp', 'asp', 'bsp', 'bsp', 'asp', 'asp']
        >>> SchedulePolicy("bsp:0-4,ssp:5-")
        Traceback (most recent call last):
        ...
        ValueError: schedule 'bsp:0-4,ssp:5-': unknown mode 'ssp' in segment 'ssp:5-'; modes are ('bsp', 'asp', 'local')
    """

    def __init__(self, schedule: str) -> None:
        self.schedule = schedule
        self.phases = parse_schedule(schedule)

    @property
    def covered_epochs(self) -> int | None:
        """How many epochs the schedule covers; ``None`` when its last phase is open-ended."""
        return None if self.phases[-1].end is None else self.phases[-1].end + 1

    def check_max_epochs(self, max_epochs: int | None) -> None:
        covered = self.covered_epochs
        if covered is not None and (max_epochs is None or max_epochs > covered):
            raise ValueError(
                f"schedule {self.schedule!r} covers epochs 0-{covered - 1} only, but the Trainer may run "
                f"{'unbounded' if max_epochs is None else max_epochs} epochs; end the last phase with '-'"
            )

    def mode_for_epoch(self, context: EpochContext) -> Mode:
        for phase in self.phases:
            if phase.start <= context.epoch and (phase.end is None or context.epoch <= phase.end):
                return phase.mode
        raise ValueError(f"schedule {self.schedule!r} has no mode for epoch {context.epoch}")

    def __repr__(self) -> str:
        return f"SchedulePolicy({self.schedule!r})"


class GreedyPolicy(SwitchPolicy):
    """Sync-Switch's online greedy policy: BSP, except that while a straggler lasts the job trains in ASP; once the
    BSP budget is spent, ASP for the rest of training.

    Epochs trained in ASP because of a straggler do not use up the budget, so the job still gets its full BSP
    share (as long as training is long enough).

    Args:
        bsp_fraction: the BSP budget as a share of ``max_epochs``, in [0, 1], rounded up to whole epochs. With 1.0
            (the default) the job is BSP throughout except while a straggler lasts, and needs no ``max_epochs``.

    Example::

        >>> policy = GreedyPolicy(bsp_fraction=0.5)
        >>> stragglers = [False, True, True, False, False, False]
        >>> plan(policy, max_epochs=6, stragglers=stragglers)
        ['bsp', 'asp', 'asp', 'bsp', 'bsp', 'asp']
    """

    uses_stragglers = True

    def __init__(self, bsp_fraction: float = 1.0) -> None:
        check_range("bsp_fraction", bsp_fraction, low=0, high=1)
        self.bsp_fraction = bsp_fraction

    def check_max_epochs(self, max_epochs: int | None) -> None:
        if max_epochs is None and self.bsp_fraction < 1.0:
            raise ValueError("GreedyPolicy with bsp_fraction < 1 needs the Trainer's max_epochs to size its budget")

    def bsp_budget(self, max_epochs: int | None) -> int | None:
        """BSP epochs to spend; ``None`` for an unlimited budget."""
        if self.bsp_fraction == 1.0:
            return None
        self.check_max_epochs(max_epochs)
        assert max_epochs is not None
        return share_in_epochs(self.bsp_fraction, max_epochs)

    def mode_for_epoch(self, context: EpochContext) -> Mode:
        budget = self.bsp_budget(context.max_epochs)
        if budget is not None and context.history.count("bsp") >= budget:
            return "asp"
        return "asp" if context.straggler else "bsp"

    def __repr__(self) -> str:
        return f"GreedyPolicy(bsp_fraction={self.bsp_fraction})"


def plan(policy: SwitchPolicy, max_epochs: int, stragglers: list[bool] | None = None) -> list[str]:
    """The modes ``policy`` chooses for ``max_epochs`` epochs, with ``stragglers[e]`` as the straggler signal seen
    before epoch ``e`` (all ``False`` by default). Handy for checking a policy before training with it.

    Example::

        >>> plan(SchedulePolicy("bsp:0,asp:1-"), max_epochs=3)
        ['bsp', 'asp', 'asp']
    """
    policy.check_max_epochs(max_epochs)
    history: list[str] = []
    for epoch in range(max_epochs):
        straggler = bool(stragglers[epoch]) if stragglers is not None else False
        history.append(policy.mode_for_epoch(EpochContext(epoch, max_epochs, tuple(history), straggler)))
    return history
