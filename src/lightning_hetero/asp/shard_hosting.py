"""Hosting the parameter server's shards (``PSAdvanced(server_shards=k)``): rank ``s`` hosts shard ``s`` for
``s < k``, rank 0 gathers the whole server's state (checkpoints, switches into BSP) and statistics from the shards,
and every host loads its cut of a whole state (resume, switches into ASP).

Whatever the number of shards, what is saved or broadcast is the unsharded state (flat parameters and an optimizer
``state_dict`` laid out like the user's optimizer, see :mod:`~lightning_hetero.asp.sharding`); shard 0's version is the
model's. With one shard this is rank 0's server as it is.

Example (one server in this rank)::

    >>> import torch
    >>> from lightning_hetero.async_ps.runtime.bootstrap import shard_server
    >>> from lightning_hetero.asp.layout import flatten_model
    >>> from lightning_hetero.asp.sharding import Shard
    >>> flat = flatten_model(torch.nn.Linear(2, 1))
    >>> server = shard_server(flat, torch.optim.SGD(flat.params, lr=0.1), Shard(0, 0, 3, 0, 2), world_size=1)
    >>> hosting = ShardHosting(rank=0, shards=None, group_indices=[[0, 1]], fault_timeout_s=1.0)
    >>> hosting.host(server, loop=None)
    >>> hosting.hosted is server, sorted(hosting.server_state())
    (True, ['optimizer', 'params', 'version'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from lightning_hetero.asp.protocol import SERVER_RANK
from lightning_hetero.asp.sharding import Shard, cut_optimizer_state, gather_optimizer_state

if TYPE_CHECKING:
    from lightning_hetero.asp.client import AsynchronousClient
    from lightning_hetero.asp.server import ParameterServer
    from lightning_hetero.asp.server_loop import ServerLoop


class ShardHosting:
    """The parameter server as this rank sees it: the server (shard) it hosts, if any, and the client reaching all
    of them (see the module's docstring).

    Args:
        rank: this global rank (rank ``s`` hosts shard ``s``).
        shards: the server's shards (``None``: one server in rank 0).
        group_indices: per param group of the user's optimizer, the layout index of each parameter.
        fault_timeout_s: how long rank 0 waits for the others to leave at the end.
    """

    def __init__(
        self, rank: int, shards: list[Shard] | None, group_indices: list[list[int]], fault_timeout_s: float
    ) -> None:
        self.rank = rank
        self.shards = shards
        self.group_indices = group_indices
        self.fault_timeout_s = fault_timeout_s
        #: rank 0's server (shard 0, or the only one); ``None`` on the other ranks
        self.server: ParameterServer | None = None
        #: the shard a rank 1..k-1 hosts
        self.shard_server: ParameterServer | None = None
        self.loop: ServerLoop | None = None
        self.client: AsynchronousClient | None = None
        #: builds the server (shard) this rank hosts and its client (see :meth:`start`)
        self.starter: Callable[[], None] | None = None
        # the one server's parameters: every layout index (a frozen parameter the optimizer holds has none, -1)
        last = max((index + 1 for indices in group_indices for index in indices), default=0)
        self._whole = Shard(0, 0, 0, 0, last)

    def start(self) -> bool:
        """Start the server (shard) this rank hosts, if any, and the client with :attr:`starter`, once: the first time
        the run trains in ASP, so that a run in other modes holds no server, no copy of the model and no messages.
        Returns whether they started now."""
        if self.client is not None or self.starter is None:
            return False
        self.starter()
        return True

    def host(self, server: ParameterServer, loop: ServerLoop | None) -> None:
        """This rank hosts ``server`` (rank 0's, or shard ``rank``) served by ``loop``."""
        if self.rank == SERVER_RANK:
            self.server = server
        else:
            self.shard_server = server
        self.loop = loop

    @property
    def hosted(self) -> ParameterServer | None:
        """The server (shard) this rank hosts, if any."""
        return self.server if self.server is not None else self.shard_server

    def server_state(self) -> dict[str, Any]:
        """Rank 0: the whole server's state, ``{"params", "optimizer", "version"}``: each shard's a consistent
        snapshot under its lock; with shards, the others are asked for theirs one after the other."""
        assert self.server is not None
        if self.shards is None:  # the optimizer state laid out like the user's, frozen parameters included
            state = self.server.state_dict()
            whole = gather_optimizer_state([state["optimizer"]], self.group_indices, [self._whole])
            return {**state, "optimizer": whole}
        assert self.client is not None
        states = [self.client.report(shard.index)["state"] for shard in self.shards]
        return {
            "params": torch.cat([state["params"] for state in states]),
            "optimizer": gather_optimizer_state(
                [state["optimizer"] for state in states], self.group_indices, self.shards
            ),
            "version": states[0]["version"],
        }

    def load(self, flat: torch.Tensor, optimizer_state: dict[str, Any] | None, version: int) -> None:
        """Load this rank's shard (if it hosts one) from the model's flat parameters ``flat`` and
        ``optimizer_state`` (the whole model's, laid out like the user's optimizer; ``None`` keeps the shard's
        optimizer state)."""
        server = self.hosted
        if server is None:
            return
        shard = self.shards[self.rank] if self.shards is not None else self._whole
        if self.shards is not None:
            flat = flat[shard.start : shard.stop]
        if optimizer_state is not None:  # the server's part: without frozen parameters (and other shards')
            optimizer_state = cut_optimizer_state(optimizer_state, self.group_indices, shard)
        server.load(flat, optimizer_state, version)

    def summary(self) -> dict[str, Any]:
        """Rank 0, at the end of training: shard 0's staleness summary, ``"server"`` (shard 0's statistics, see
        :meth:`~lightning_hetero.asp.server.ParameterServer.statistics`) and, with shards, ``"shards"`` (each
        shard's staleness summary and statistics, in shard order)."""
        assert self.server is not None
        summary = {**self.server.tracker.summary(), "server": self.server.statistics()}
        if self.shards is not None:
            assert self.client is not None
            reports = [self.client.report(shard.index) for shard in self.shards]
            summary["shards"] = [{**report["summary"], **report["statistics"]} for report in reports]
        return summary

    def finish(self) -> dict[str, Any] | None:
        """At the end of training: rank 0's :meth:`summary` (``None`` on the other ranks, or if ASP never started),
        then :meth:`leave`."""
        if self.client is None:
            return None
        summary = self.summary() if self.server is not None else None
        self.leave()
        return summary

    def leave(self) -> None:
        """Leave every shard hosted elsewhere, then wait (at most ``fault_timeout_s``) for the other workers to leave
        the shard this rank hosts."""
        assert self.client is not None
        self.client.leave()
        if self.loop is not None:
            self.loop.join(self.fault_timeout_s)
