"""The parameter server: the authoritative flat parameters and the user's optimizer applied to pushed gradients.

:class:`ParameterServer` is thread-safe state (usable without any process group: the worker that shares its process
calls :meth:`ParameterServer.apply` directly); :class:`~lightning_hetero.asp.server_loop.ServerLoop` feeds it from the
network.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.optim import Optimizer

from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.asp.layout import FlatLayout
from lightning_hetero.asp.protocol import (
    FLAG_JOIN,
    FLAG_LAST,
    FLAG_PULL_ONLY,
    FLAG_SKIPPED,
    STATUS_ABORTED,
    STATUS_OK,
    STATUS_STOPPED,
    PeerLostError,
    PushHeader,
    ReplyHeader,
    payload,
    write_reply_header,
)
from lightning_hetero.asp.server_optimizer import IMPLEMENTATION_KEYS, fast_clone_optimizer
from lightning_hetero.asp.staleness import StalenessGate, StalenessTracker, staleness_lr_factor
from lightning_hetero.batch_weighting import gradient_weight


class ParameterServer:
    """Applies pushed gradients with the user's optimizer, one at a time, and bumps a version per update.

    Args:
        layout: the flat parameter layout.
        initial: the initial flat parameters (copied).
        template: the user's optimizer; the server's optimizer is a clone, and before every update its
            hyper-parameters (learning rate and the rest) are copied from the template, so learning-rate schedulers
            stepping the template steer the server (:attr:`on_update` can step them once per update).
        index_of: ``id(model_parameter) -> layout index``.
        world_size: number of workers (an update's gradient is scaled by
            :func:`~lightning_hetero.batch_weighting.gradient_weight` of its share, alone among them).
        max_staleness: stale-synchronous bound, see :class:`~lightning_hetero.asp.staleness.StalenessGate`.
        lr_scaling: staleness-aware learning-rate rule, see :func:`~lightning_hetero.asp.staleness.staleness_lr_factor`.
        compensator: rewrites the hyper-parameters copied from the template before each update so that the
            asynchronous dynamics match the synchronous ones, see :mod:`~lightning_hetero.asp.compensation`
            (``None``: the template's values as they are); :attr:`compensator` may be replaced under :attr:`cond`.
        foreign: ``id`` of the template's parameters that other server shards hold (see
            :mod:`~lightning_hetero.asp.sharding`); ``layout``, ``initial`` and ``index_of`` then describe this
            shard's parameters only.

    Example::

        >>> import torch
        >>> from lightning_hetero.asp.layout import FlatLayout
        >>> from lightning_hetero.asp.protocol import PushHeader, new_message, payload
        >>> model = torch.nn.Linear(1, 1, bias=False)
        >>> torch.nn.init.ones_(model.weight)
        Parameter containing:
        tensor([[1.]], requires_grad=True)
        >>> server = ParameterServer(FlatLayout.from_named_parameters(model.named_parameters()),
        ...     torch.ones(1), torch.optim.SGD(model.parameters(), lr=0.5), {id(model.weight): 0}, world_size=2)
        >>> reply = new_message(1)
        >>> server.apply(worker=1, header=PushHeader(0, base_version=0, share=0.5), grad=torch.ones(1), reply=reply)
        ReplyHeader(status=0, version=1, staleness=0, lost_rank=-1)
        >>> payload(reply).tolist()
        [0.5]
    """

    def __init__(
        self,
        layout: FlatLayout,
        initial: torch.Tensor,
        template: Optimizer,
        index_of: dict[int, int],
        world_size: int,
        max_staleness: int | None = None,
        lr_scaling: str = "none",
        compensator: AsynchronyCompensator | None = None,
        foreign: Collection[int] = frozenset(),
    ) -> None:
        staleness_lr_factor(0, lr_scaling)  # validates the rule name
        self.layout = layout
        self.params = initial.detach().to(device="cpu", dtype=torch.float32).clone()
        self._views = layout.views(self.params)
        self._template = template
        self.optimizer, self.implementation = fast_clone_optimizer(template, self._views, index_of, foreign)
        self._implementation_keys = [
            {key: value for key, value in group.items() if key in IMPLEMENTATION_KEYS}
            for group in self.optimizer.param_groups
        ]
        # the hyper-parameters copied from the template before each update (no dict built per update)
        self._copied_keys = [
            [key for key in group if key != "params" and key not in IMPLEMENTATION_KEYS]
            for group in template.param_groups
        ]
        # per pushed-gradient buffer (one per receiving thread, plus rank 0's own), its per-parameter views
        self._grad_views: dict[int, list[torch.Tensor]] = {}
        self._busy_s = 0.0
        self._first_update_s: float | None = None
        self._last_update_s = 0.0
        self.world_size = world_size
        self.lr_scaling = lr_scaling
        self.compensator = compensator
        # parameters each worker was last sent (the base of its next gradient), kept for delay compensation
        self._sent: dict[int, torch.Tensor] = {}
        self.version = 0
        self.max_updates = -1
        self.gate = StalenessGate(max_staleness)
        self.tracker = StalenessTracker()
        #: the first lost rank the job does not survive (every waiting or later request is answered with an abort)
        self.lost: PeerLostError | None = None
        #: lose workers without aborting (elastic ASP): they are dropped and the others go on
        self.tolerate_lost_workers = False
        #: every rank whose connection broke
        self.lost_ranks: set[int] = set()
        #: called (from the thread that noticed, outside the lock) with each newly lost rank's error
        self.on_lost: Callable[[PeerLostError], None] | None = None
        #: per epoch, the chunks (``PushHeader.chunk``) whose gradients were applied
        self.applied_chunks: dict[int, set[int]] = {}
        #: per worker, the last epoch it made its last push of (``FLAG_LAST``)
        self.finished_epoch: dict[int, int] = {}
        self.cond = threading.Condition()
        #: called with the new version after each update, under the server's lock (steps LR schedulers)
        self.on_update: Callable[[int], None] | None = None

    @property
    def budget_spent(self) -> bool:
        return 0 <= self.max_updates <= self.version

    def apply(self, worker: int, header: PushHeader, grad: torch.Tensor, reply: torch.Tensor) -> ReplyHeader:
        """Apply one push from ``worker`` and fill ``reply`` with the resulting parameters.

        Blocks while the stale-synchronous gate holds ``worker`` back. ``grad`` is scaled in place.

        Args:
            worker: the pushing worker's global rank.
            header: the push's header.
            grad: the pushed flat gradient (float32, CPU).
            reply: the reply message to fill.
        """
        with self.cond:
            if self.lost is not None:
                return self._reply(reply, STATUS_ABORTED, 0)
            if header.flags & FLAG_PULL_ONLY:
                if header.flags & FLAG_JOIN:
                    self.gate.join(worker)
                return self._reply(reply, STATUS_OK, 0, worker)
            if header.flags & FLAG_SKIPPED:  # the worker's step was skipped: the server skips it too
                if header.flags & FLAG_LAST:
                    self.gate.finish(worker)
                    self.finished_epoch[worker] = header.epoch
                    self.cond.notify_all()
                return self._reply(reply, STATUS_OK, 0, worker)
            if self.budget_spent:
                self.gate.finish(worker)
                self.cond.notify_all()
                return self._reply(reply, STATUS_STOPPED, 0)
            staleness = self.version - header.base_version
            started = time.perf_counter()
            self._step(worker, grad, header.share, staleness)
            self.version += 1
            if header.chunk >= 0:
                self.applied_chunks.setdefault(header.epoch, set()).add(header.chunk)
            if self.on_update is not None:
                self.on_update(self.version)
            self.tracker.record(worker, staleness)
            self.gate.tick(worker)
            if header.flags & FLAG_LAST:
                self.gate.finish(worker)
                self.finished_epoch[worker] = header.epoch
            self.cond.notify_all()
            if self.gate.may_proceed(worker):  # the common case: reply at once, the copy counts as the update's cost
                result = self._reply(reply, STATUS_OK, staleness, worker)
                self._count_busy(started)
                return result
            self._count_busy(started)
            while not self.gate.may_proceed(worker) and self.lost is None and not self.budget_spent:
                self.cond.wait()
            if self.lost is not None:
                return self._reply(reply, STATUS_ABORTED, staleness)
            if not self.budget_spent:
                self.tracker.record_lead(self.gate.lead(worker))
            return self._reply(reply, STATUS_OK, staleness, worker)

    def _count_busy(self, started: float) -> None:
        now = time.perf_counter()
        self._busy_s += now - started
        if self._first_update_s is None:
            self._first_update_s = started
        self._last_update_s = now

    def statistics(self) -> dict[str, Any]:
        """The server's cost: ``busy_s`` (time spent applying updates and copying their replies, under the lock),
        ``busy_fraction`` (of the time from the first update's start to the last one's end: near 1 means the server
        is the bottleneck), ``us_per_update``, ``us_per_mb`` (per update and MB of parameters), ``implementation``
        (of the optimizer step: ``"fused"``, ``"foreach"`` or ``"default"``).

        Example::

            >>> import torch
            >>> from lightning_hetero.asp.layout import FlatLayout
            >>> from lightning_hetero.asp.protocol import PushHeader, new_message
            >>> model = torch.nn.Linear(1, 1)
            >>> server = ParameterServer(FlatLayout.from_named_parameters(model.named_parameters()),
            ...     torch.zeros(2), torch.optim.SGD(model.parameters(), lr=0.1), {id(p): i for i, p in
            ...     enumerate(model.parameters())}, world_size=1)
            >>> _ = server.apply(worker=0, header=PushHeader(0, 0, 1.0), grad=torch.ones(2), reply=new_message(2))
            >>> stats = server.statistics()
            >>> stats["updates"], stats["implementation"], 0 < stats["busy_fraction"] <= 1
            (1, 'fused', True)
        """
        with self.cond:
            updates = self.tracker.updates
            span = self._last_update_s - self._first_update_s if self._first_update_s is not None else 0.0
            us_per_update = self._busy_s / updates * 1e6 if updates else 0.0
            return {
                "updates": updates,
                "busy_s": self._busy_s,
                "busy_fraction": min(1.0, self._busy_s / span) if span > 0 else 0.0,
                "us_per_update": us_per_update,
                "us_per_mb": us_per_update / (self.layout.numel * 4 / 1e6),
                "implementation": self.implementation,
            }

    def _step(self, worker: int, grad: torch.Tensor, share: float, staleness: int) -> None:
        factor = staleness_lr_factor(staleness, self.lr_scaling)
        for group, source, keys in zip(
            self.optimizer.param_groups, self._template.param_groups, self._copied_keys, strict=True
        ):
            for key in keys:
                group[key] = source[key]
        compensator = self.compensator
        if compensator is not None:
            compensator.observe(staleness)
            compensator.apply(self.optimizer.param_groups)
        if factor != 1.0:
            for group in self.optimizer.param_groups:
                group["lr"] *= factor
        grad.mul_(gradient_weight(share, alone_among=self.world_size))
        if compensator is not None and compensator.delay_compensation and worker in self._sent:
            compensator.compensate_delay(grad, self.params, self._sent[worker])
        for param, grad_view in zip(self._views, self._views_of(grad), strict=True):
            param.grad = grad_view
        self.optimizer.step()
        for param in self._views:
            param.grad = None

    def _views_of(self, grad: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of a pushed-gradient buffer, made once per buffer: the workers' buffers (one per
        receiving thread, plus rank 0's own) live as long as the server. The cached views keep their memory alive,
        so an address seen again is the same buffer; a caller passing new buffers each time empties the cache."""
        views = self._grad_views.get(grad.data_ptr())
        if views is None:
            if len(self._grad_views) >= self.world_size:
                self._grad_views.clear()
            views = self._grad_views[grad.data_ptr()] = self.layout.views(grad)
        return views

    def _reply(self, reply: torch.Tensor, status: int, staleness: int, worker: int | None = None) -> ReplyHeader:
        lost_rank = self.lost.rank if self.lost is not None else -1
        write_reply_header(reply, status, self.version, staleness, lost_rank)
        payload(reply).copy_(self.params)
        if worker is not None and self.compensator is not None and self.compensator.delay_compensation:
            self._sent.setdefault(worker, torch.empty_like(self.params)).copy_(self.params)
        return ReplyHeader(status, self.version, staleness, lost_rank)

    def finish(self, worker: int) -> None:
        """``worker`` has no more updates for now (for example it stopped early); stop gating others on it.

        Args:
            worker: the worker's global rank.
        """
        with self.cond:
            self.gate.finish(worker)
            self.cond.notify_all()

    def fail(self, error: PeerLostError) -> None:
        """Record a lost rank. Unless it is a worker and :attr:`tolerate_lost_workers` is set, every waiting or later
        request is answered with an abort naming the first lost rank; a tolerated lost worker stops counting for the
        staleness bound and the others go on.

        Args:
            error: what was lost.
        """
        with self.cond:
            new = error.rank not in self.lost_ranks
            self.lost_ranks.add(error.rank)
            if self.tolerate_lost_workers and error.role == "worker":
                self.gate.finish(error.rank)
            elif self.lost is None:
                self.lost = error
            self.cond.notify_all()
        if new and self.on_lost is not None:
            self.on_lost(error)

    def wait_lost(self, timeout_s: float) -> PeerLostError | None:
        """The recorded lost rank, waiting up to ``timeout_s`` for one to be recorded (``None`` if none is).

        Args:
            timeout_s: the longest wait.
        """
        with self.cond:
            self.cond.wait_for(lambda: self.lost is not None, timeout=timeout_s)
            return self.lost

    def state_dict(self) -> dict[str, Any]:
        """A consistent snapshot: flat parameters (copy), optimizer state and version."""
        with self.cond:
            return {
                "params": self.params.clone(),
                "optimizer": self.optimizer.state_dict(),
                "version": self.version,
            }

    def report(self) -> dict[str, Any]:
        """What a remote worker asks for with ``FLAG_REPORT`` (rank 0 gathering the shards): ``state``
        (:meth:`state_dict`), ``summary`` (the staleness tracker's) and ``statistics`` (:meth:`statistics`)."""
        return {"state": self.state_dict(), "summary": self.tracker.summary(), "statistics": self.statistics()}

    def load(self, params: torch.Tensor, optimizer_state: dict[str, Any] | None, version: int) -> None:
        """Replace the server's state (resume, or a switch from synchronous training).

        Args:
            params: flat parameters (any device or float dtype).
            optimizer_state: an optimizer ``state_dict`` laid out like the template's, or ``None`` to keep the state.
            version: the version to continue from.
        """
        with self.cond:
            self.params.copy_(params.detach().reshape(-1))
            if optimizer_state is not None:
                self.optimizer.load_state_dict(optimizer_state)
                # a state saved from the template (a checkpoint, a switch from BSP) names the template's implementation
                for group, keys in zip(self.optimizer.param_groups, self._implementation_keys, strict=True):
                    group.update(keys)
            self.version = version
            self.gate = StalenessGate(self.gate.max_staleness)
            self._sent.clear()
            if self.compensator is not None:
                self.compensator.reset()
            self.cond.notify_all()
