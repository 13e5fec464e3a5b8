"""Collective gating: ``AsyncPSStrategy``'s collectives (``reduce``, ``barrier``, ``broadcast``, ``all_gather``, the
boolean decisions Lightning's callbacks take) stay local inside an asynchronous training batch, where ranks are not
in lock-step, and otherwise run on the remaining ranks' group (after a loss in elastic ASP), naming the rank lost
first when a peer is gone.

The strategy's Lightning methods hand each collective to :meth:`CollectiveGate.gated`; the engines use the ungated
ones (every rank is there) and :meth:`CollectiveGate.average_buffers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import RunningStage

from lightning_hetero._lightning_internals import inside_training_batch
from lightning_hetero.asp.placement import reserved_only

if TYPE_CHECKING:
    from lightning_hetero.async_ps.interfaces import ModeFlags
    from lightning_hetero.async_ps.runtime.context import PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance

#: an ungated collective of the parent strategy: ``reduce(tensor, group, reduce_op)``, ``broadcast(obj, src)``
Reduce = Callable[[torch.Tensor, Any, str], torch.Tensor]
Broadcast = Callable[[Any, int], Any]


def broadcast_object(obj: Any, src: int, group: Any, broadcast: Broadcast) -> Any:
    """Broadcast a picklable object from ``src`` over ``group`` (``None``: the default group, by ``broadcast``)."""
    if group is None:
        return broadcast(obj, src)
    objects = [obj]
    dist.broadcast_object_list(objects, src, group=group)
    return objects[0]


class CollectiveGate:
    """Decides where each of the strategy's collectives runs (see the module's docstring).

    Args:
        ctx: the run's shared context.
        fault: the fault tolerance (the remaining ranks' group, naming the rank lost first).
        mode: the mode in force (collectives stay local inside its batches unless it trains in lock-step).
        reduce: DDP's ``reduce`` on the default group, ungated.
        broadcast: DDP's ``broadcast`` on the default group, ungated.
    """

    def __init__(
        self,
        ctx: PSContext,
        fault: FaultTolerance,
        mode: Callable[[], ModeFlags],
        reduce: Reduce,
        broadcast: Broadcast,
    ) -> None:
        self.ctx = ctx
        self.fault = fault
        self._mode = mode
        self._reduce = reduce
        #: DDP's broadcast on the default group, for switches where every rank is present
        self.broadcast = broadcast

    def inside_asynchronous_batch(self) -> bool:
        """True inside a training batch while ranks are not in lock-step (ASP, local SGD): collectives stay local."""
        trainer = self.ctx.trainer
        if self._mode().lock_step or not self.ctx.active or trainer.state.stage != RunningStage.TRAINING:
            return False
        return inside_training_batch(trainer)

    def gated(self, local: Callable[[], Any], run: Callable[[Any], Any], group: Any = None) -> Any:
        """``local()`` inside an asynchronous batch; else ``run(group)`` on the remaining ranks' group (the default
        one: ``None``), naming the rank lost first if it breaks."""
        if self.inside_asynchronous_batch():
            return local()
        group = self.fault.collective_group(group)
        return self.fault.collective(lambda: run(group))

    def boolean_decision(self, decision: bool, all: bool, reduce_sum: Callable[[torch.Tensor], Any]) -> bool:
        """Whether every remaining rank (``all``) or any decided so; this rank's alone inside an asynchronous batch.

        Args:
            decision: this rank's.
            all: every rank must agree, else any.
            reduce_sum: the strategy's gated SUM reduce.
        """
        if self.inside_asynchronous_batch():
            return decision
        count = reduce_sum(torch.tensor(int(decision), device=self.ctx.root_device))
        return bool(count == len(self.ctx.membership.members)) if all else bool(count)

    def average_buffers(self) -> None:
        """Average the workers' floating-point module buffers (BatchNorm running statistics): in ASP each worker
        updates its own from its own batches, and the server holds parameters only. Called where all ranks meet.
        A dedicated server rank's buffers, which saw one batch of the ASP epoch, get weight 0."""
        ctx = self.ctx
        buffers = ctx.float_buffers()
        if not buffers or ctx.world_size == 1:
            return
        reserved = reserved_only(ctx.settings.advanced.server_placement, self._mode().through_server, ctx.rank)
        flat = torch.cat(
            [b.detach().reshape(-1).to(torch.float64) for b in buffers] + [torch.ones(1, dtype=torch.float64)]
        )
        flat.mul_(0.0 if reserved else 1.0)
        group = self.fault.collective_group()
        flat = self.fault.collective(lambda: self._reduce(flat, group, "sum"))
        flat = flat[:-1] / flat[-1]
        offset = 0
        for buffer in buffers:
            buffer.copy_(flat[offset : offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()
