"""``AsyncPSStrategy``'s synchronisation modes: one engine each, behind the
:class:`~lightning_hetero.async_ps.interfaces.Engine` interface, and the registry :data:`ENGINES`, the one place that
maps a mode's name to its engine.

Adding a mode is a module here with its engine class, a line in :data:`ENGINES` and its name in
:data:`~lightning_hetero.contracts.MODES`.

Example::

    >>> sorted(ENGINES)
    ['asp', 'bsp', 'local']
    >>> [(name, engine.lock_step, engine.through_server) for name, engine in sorted(ENGINES.items())]
    [('asp', False, True), ('bsp', True, False), ('local', False, False)]
"""

from __future__ import annotations

from lightning_hetero.async_ps.engines.asp import AsynchronousEngine
from lightning_hetero.async_ps.engines.bsp import SynchronousEngine
from lightning_hetero.async_ps.engines.local import LocalSGDEngine
from lightning_hetero.async_ps.interfaces import Engine
from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance
from lightning_hetero.contracts import Mode


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
