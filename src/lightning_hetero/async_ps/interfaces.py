"""The interfaces between ``AsyncPSStrategy``'s engines and its runtime: :class:`ModeFlags` (what the runtime reads
of the mode in force), :class:`Engine` (one synchronisation mode) and :class:`SavedState` (what an engine saves in
place of the model). A leaf: it imports nothing from the package, so the import graph has no cycle.

Example::

    >>> import torch
    >>> SavedState(torch.zeros(2)).version is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor


class ModeFlags(Protocol):
    """What the runtime's collaborators read of the mode in force (they get a callable returning it)."""

    #: the mode's name in messages (``"BSP"``)
    title: str
    #: the ranks step together (collectives inside a training batch run as usual, the ranks take fixed shares)
    lock_step: bool
    #: updates go through the parameter server (a lost worker may be tolerated; a dedicated server rank rests)
    through_server: bool


@dataclass
class SavedState:
    """What an engine saves in place of this rank's model: the flat parameters and, when they come from the server,
    its optimizer state and version.

    Args:
        params: the flat parameters to save as the model's.
        optimizer: the optimizer state to save as the user's (``None``: this rank's optimizer's own).
        version: the model's version (``None``: the strategy's).
    """

    params: Tensor
    optimizer: dict[str, Any] | None = None
    version: int | None = None


class Engine(ModeFlags, Protocol):
    """One synchronisation mode of ``AsyncPSStrategy``: how a step updates the model, what entering and leaving the
    mode at an epoch's end does, and what a checkpoint keeps of it.

    Built with the strategy (``Engine(settings, weighting)``), given the run's context at setup; the strategy calls
    :meth:`enter` when training starts in the mode or switches to it, and :meth:`leave` when it switches away (with
    every rank at the same epoch's end).
    """

    #: the key of the engine's own state in the checkpoint's ``"async_ps"`` entry (``None``: it keeps none)
    state_key: str | None

    def setup(self, ctx: Any, fault: Any, gate: Any) -> None:
        """Take the run's context and collaborators (once, at setup when fitting): the ``PSContext``, the
        ``FaultTolerance`` and the ``CollectiveGate`` of :mod:`lightning_hetero.async_ps.runtime`."""
        ...

    def enter(self, switch: bool) -> None:
        """Start training in this mode: at the start of training (``switch=False``) or at a switch from another."""
        ...

    def leave(self) -> None:
        """Stop training in this mode at an epoch's end, before the next mode's :meth:`enter`."""
        ...

    def batch_start(self) -> None:
        """Before a training batch's forward."""
        ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """One step: run ``closure`` (forward, backward) and update the model."""
        ...

    def report_step(self) -> None:
        """Report the step's numbers (logged as epoch statistics)."""
        ...

    def epoch_end(self) -> None:
        """Where every rank meets inside a fit (before validation, at the end of training): bring each rank's model
        to the one all ranks share."""
        ...

    def saved_state(self) -> SavedState | None:
        """What a checkpoint saves in place of this rank's model (``None``: the model as it is)."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """The engine's own state for a checkpoint (``None``: nothing to save)."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`'s state (``None``: the checkpoint holds none)."""
        ...
