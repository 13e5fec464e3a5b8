"""BSP (``mode="bsp"``): every rank all-reduces its batch-weighted gradient
(:mod:`lightning_hetero.batch_weighting`) and steps its own copy of the optimizer, as DDP does; no server traffic.

Example (one rank: the all-reduce of a single rank's weighted gradient is the gradient itself)::

    >>> from lightning_hetero.async_ps.runtime.context import BatchWeighting
    >>> engine = SynchronousEngine(settings=None, weighting=BatchWeighting(world_size=lambda: 1))
    >>> engine.lock_step, engine.through_server, engine.state_dict()
    (True, False, None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_hetero.asp.layout import flatten_grads_into
from lightning_hetero.asp.protocol import SERVER_RANK, all_reduce_weighted
from lightning_hetero.async_ps.runtime.grad_scaling import agree_scalers
from lightning_hetero.async_ps.runtime.reporting import report_hyperparameters
from lightning_hetero.batch_weighting import gradient_weight

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
        weighting: this rank's batch share and compute-end mark.
    """

    title = "BSP"
    lock_step = True
    through_server = False
    state_key = None

    def __init__(self, settings: PSSettings | None, weighting: BatchWeighting) -> None:
        self._weighting = weighting
        self._ctx: PSContext | None = None
        self._fault: FaultTolerance | None = None

    def setup(self, ctx: PSContext, fault: FaultTolerance, gate: CollectiveGate) -> None:
        self._ctx, self._fault = ctx, fault

    def enter(self, switch: bool) -> None:
        """The ranks' parameters agree when BSP is entered (from ASP, the server's state was handed to all); their
        fp16 gradient scalers are made one (:mod:`~lightning_hetero.async_ps.runtime.grad_scaling`: each rank unscales the same
        all-reduced gradient, so each then skips and backs off alike)."""
        ctx, fault = self._ctx, self._fault
        assert ctx is not None and fault is not None
        agree_scalers(ctx.precision_plugin, fault.collective, device=ctx.flat.flat.device)

    def leave(self) -> None:
        """Nothing to do: every rank holds the same model and optimizer state."""

    def batch_start(self) -> None:
        """Nothing to do before a synchronous batch."""

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """One BSP step: the closure (forward, backward), then the batch-weighted all-reduce, then the optimizer."""
        ctx = self._ctx
        assert ctx is not None

        def synchronised_closure() -> Any:
            result = closure()
            self._weighting.mark_compute_end()
            self._all_reduce_gradients()
            return result

        output = ctx.precision_plugin.optimizer_step(optimizer, model=model, closure=synchronised_closure, **kwargs)
        ctx.counter.version += 1
        return output

    def _all_reduce_gradients(self) -> None:
        assert self._ctx is not None and self._fault is not None
        model = self._ctx.flat
        flatten_grads_into(model.params, model.grad_flat)
        weight = gradient_weight(self._weighting.share())
        self._fault.collective(lambda: all_reduce_weighted(model.grad_flat, weight))
        for param, grad in zip(model.params, model.layout.views(model.grad_flat), strict=True):
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.copy_(grad)

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
