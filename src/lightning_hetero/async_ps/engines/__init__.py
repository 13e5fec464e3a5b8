"""``AsyncPSStrategy``'s synchronisation modes: one engine each, behind the :class:`Engine` interface, and the
registry :data:`ENGINES`, the one place that maps a mode's name to its engine.

Adding a mode is a module here with its engine class, a line in :data:`ENGINES` and its name in
:data:`~lightning_hetero.contracts.MODES`.

Example::

    >>> sorted(ENGINES)
    ['asp', 'bsp', 'local']
    >>> [(name, engine.lock_step, engine.through_server) for name, engine in sorted(ENGINES.items())]
    [('asp', False, True), ('bsp', True, False), ('local', False, False)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from lightning_hetero.async_ps.engines.asp import AsynchronousEngine
from lightning_hetero.async_ps.engines.bsp import SynchronousEngine
from lightning_hetero.async_ps.engines.local import LocalSGDEngine
from lightning_hetero.contracts import Mode

if TYPE_CHECKING:
    from lightning_hetero.async_ps.runtime.checkpointing import SavedState
    from lightning_hetero.async_ps.runtime.collectives import CollectiveGate
    from lightning_hetero.async_ps.runtime.context import PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance


class Engine(Protocol):
    """One synchronisation mode of ``AsyncPSStrategy``: how a step updates the model, what entering and leaving the
    mode at an epoch's end does, and what a checkpoint keeps of it.

    Built with the strategy (``Engine(settings, weighting)``), given the run's context at setup; the strategy calls
    :meth:`enter` when training starts in the mode or switches to it, and :meth:`leave` when it switches away (with
    every rank at the same epoch's end).
    """

    #: the mode's name in messages (``"BSP"``)
    title: str
    #: the ranks step together (collectives inside a training batch run as usual, the ranks take fixed shares)
    lock_step: bool
    #: updates go through the parameter server (a lost worker may be tolerated; a dedicated server rank rests)
    through_server: bool
    #: the key of the engine's own state in the checkpoint's ``"async_ps"`` entry (``None``: it keeps none)
    state_key: str | None

    def setup(self, ctx: PSContext, fault: FaultTolerance, gate: CollectiveGate) -> None:
        """Take the run's context and collaborators (once, at setup when fitting)."""
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


def switch(old: Engine, new: Engine, fault: FaultTolerance) -> None:
    """Switch from ``old`` to ``new`` at an epoch's end (every rank calls it): ``old.leave()``, ``new.enter()``;
    a mode that does not train through the server needs every rank, so the ranks first meet and check none was
    lost."""
    if not new.through_server:
        fault.meet()  # brings every rank's view of the lost ranks up to date
        fault.check_no_rank_lost(f"switch to {new.title}")
    old.leave()
    new.enter(switch=True)


#: the engine of each mode: the only place a mode's name is mapped to its behaviour
ENGINES: dict[Mode, type[Engine]] = {
    "bsp": SynchronousEngine,
    "asp": AsynchronousEngine,
    "local": LocalSGDEngine,
}

__all__ = ["ENGINES", "AsynchronousEngine", "Engine", "LocalSGDEngine", "SynchronousEngine", "switch"]
