"""BSP (``mode="bsp"``): the ranks train in lock-step through DDP's reducer (the strategy puts the wrapped model in
place: :mod:`~lightning_hetero.async_ps.runtime.reducer`), which all-reduces the batch-weighted gradient while backward
runs, and every rank steps its own copy of the optimizer, as under ``DDPStrategy``; no server traffic.

Example::

    >>> engine = SynchronousEngine(settings=None, weighting=None)
    >>> engine.lock_step, engine.through_server, engine.state_dict()
    (True, False, None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_hetero.asp.protocol import SERVER_RANK
from lightning_hetero.async_ps.runtime.grad_scaling import agree_scalers
from lightning_hetero.async_ps.runtime.reporting import report_hyperparameters

if TYPE_CHECKING:
    from lightning_hetero.async_ps.interfaces import SavedState
    from lightning_hetero.async_ps.runtime.collectives import CollectiveGate
    from lightning_hetero.async_ps.runtime.context import BatchWeighting, PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance
    from lightning_hetero.async_ps.settings import PSSettings


class SynchronousEngine:
    """Synchronous training inside ``AsyncPSStrategy`` (see the module's docstring); an
    :class:`~lightning_hetero.async_ps.engines.Engine`.

    Args:
        settings: the strategy's settings.
        weighting: this rank's batch share and compute-end mark (applied on the loss by the strategy's reducer).
    """

    title = "BSP"
    lock_step = True
    through_server = False
    state_key = None

    def __init__(self, settings: PSSettings | None, weighting: BatchWeighting | None) -> None:
        self._ctx: PSContext | None = None
        self._fault: FaultTolerance | None = None

    def setup(self, ctx: PSContext, fault: FaultTolerance, gate: CollectiveGate) -> None:
        self._ctx, self._fault = ctx, fault

    def enter(self, switch: bool) -> None:
        """The ranks' parameters agree when BSP is entered (from ASP, the server's state was handed to all); their
        fp16 gradient scalers are made one (:mod:`~lightning_hetero.async_ps.runtime.grad_scaling`: each rank
        unscales the same all-reduced gradient, so each then skips and backs off alike)."""
        ctx, fault = self._ctx, self._fault
        assert ctx is not None and fault is not None
        agree_scalers(ctx.precision_plugin, fault.collective, device=ctx.root_device)

    def leave(self) -> None:
        """Nothing to do: every rank holds the same model and optimizer state."""

    def batch_start(self) -> None:
        """Nothing to do before a synchronous batch."""

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """One BSP step: the closure (forward, and backward with DDP's all-reduce: the strategy's ``backward`` names
        the rank lost first when it breaks), then the optimizer."""
        ctx = self._ctx
        assert ctx is not None
        output = ctx.precision_plugin.optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        ctx.counter.version += 1
        return output

    def report_step(self) -> None:
        """Rank 0 reports the optimizer's own momentum and learning rate."""
        ctx = self._ctx
        assert ctx is not None
        if ctx.rank == SERVER_RANK:
            group = ctx.optimizer.param_groups[0]
            report_hyperparameters(ctx.log, ctx.module, group, None, ctx.trainer.current_epoch)

    def epoch_end(self) -> None:
        """Nothing to do: the ranks agree at every step."""

    def saved_state(self) -> SavedState | None:
        return None

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """BSP keeps no state of its own."""
