"""Collective gating: ``AsyncPSStrategy``'s collectives (``reduce``, ``barrier``, ``broadcast``, ``all_gather``, the
boolean decisions Lightning's callbacks take) stay local inside an asynchronous training batch, where ranks are not
in lock-step, and otherwise run on the remaining ranks' group (after a loss in elastic ASP), naming the rank lost
first when a peer is gone.

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy`: these are Lightning's ``Strategy`` methods, which
its loops, ``self.log(sync_dist=True)`` and callbacks call on the strategy itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.trainer.states import RunningStage
from torch import Tensor
from typing_extensions import override

from lightning_hetero._lightning_internals import inside_training_batch
from lightning_hetero.ps.placement import reserved_only

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_hetero.ps.faults import Membership


class CollectiveGating:
    """The strategy's collectives (see the module's docstring), through the fault tolerance's ``_collective_group``
    and ``_collective``; ``super()`` past this class must reach ``DDPStrategy``'s."""

    # provided by AsyncPSStrategy and FaultTolerance
    _mode: str
    _active: bool
    _membership: Membership | None
    _attached_trainer: pl.Trainer | None
    world_size: int
    global_rank: int
    server_placement: str
    root_device: torch.device
    lightning_module: Any

    def _inside_asynchronous_batch(self) -> bool:
        """True inside a training batch in ASP or local SGD, where ranks are not in lock-step and collectives must
        stay local."""
        if self._mode not in ("asp", "local") or not self._active:
            return False
        trainer = self._attached_trainer
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return False
        return inside_training_batch(trainer)

    @override
    def reduce(self, tensor: Tensor | Any, group: Any = None, reduce_op: ReduceOp | str | None = "mean") -> Any:
        if self._inside_asynchronous_batch():
            return tensor
        group = self._collective_group(group)
        return self._collective(lambda: super(CollectiveGating, self).reduce(tensor, group, reduce_op))

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self._inside_asynchronous_batch():
            return decision
        members = len(self._membership.members) if self._membership is not None else self.world_size
        count = self.reduce(torch.tensor(int(decision), device=self.root_device), reduce_op=ReduceOp.SUM)
        return bool(count == members) if all else bool(count)

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if self._inside_asynchronous_batch():
            return
        group = self._collective_group()
        if group is None:
            self._collective(lambda: super(CollectiveGating, self).barrier(*args, **kwargs))
        else:
            self._collective(lambda: dist.barrier(group=group))

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._inside_asynchronous_batch():
            return obj
        group = self._collective_group()
        if group is None:
            return self._collective(lambda: super(CollectiveGating, self).broadcast(obj, src))
        objects = [obj]
        self._collective(lambda: dist.broadcast_object_list(objects, src, group=group))
        return objects[0]

    @override
    def all_gather(self, tensor: Tensor, group: Any = None, sync_grads: bool = False) -> Tensor:
        if self._inside_asynchronous_batch():
            return tensor.unsqueeze(0)
        group = self._collective_group(group)
        return self._collective(lambda: super(CollectiveGating, self).all_gather(tensor, group, sync_grads))

    def _average_buffers(self) -> None:
        """Average the workers' floating-point module buffers (BatchNorm running statistics): in ASP each worker
        updates its own from its own batches, and the server holds parameters only. Called where all ranks meet.
        A dedicated server rank's buffers, which saw one batch of the ASP epoch, get weight 0."""
        buffers = [b for b in self.lightning_module.buffers() if b.is_floating_point()]
        if not buffers or self.world_size == 1:
            return
        weight = 0.0 if reserved_only(self.server_placement, self._mode, self.global_rank) else 1.0
        flat = torch.cat(
            [b.detach().reshape(-1).to(torch.float64) for b in buffers] + [torch.ones(1, dtype=torch.float64)]
        )
        flat.mul_(weight)
        group = self._collective_group()
        flat = self._collective(lambda: super(CollectiveGating, self).reduce(flat, group, reduce_op="sum"))
        flat = flat[:-1] / flat[-1]
        offset = 0
        for buffer in buffers:
            buffer.copy_(flat[offset : offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()
