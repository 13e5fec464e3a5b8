"""Hosting the parameter server's shards (``AsyncPSStrategy(server_shards=k)``): rank ``s`` hosts shard ``s`` for
``s < k``, rank 0 gathers the whole server's state (checkpoints, switches into BSP) and statistics from the shards,
and every host loads its cut of a whole state (resume, switches into ASP).

Whatever the number of shards, what is saved or broadcast is the unsharded state (flat parameters and an optimizer
``state_dict`` laid out like the user's optimizer, see :mod:`~lightning_hetero.ps.sharding`); shard 0's version is the
model's. With one shard this is rank 0's server as it is.

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lightning_hetero.ps.sharding import cut_optimizer_state, gather_optimizer_state

if TYPE_CHECKING:
    from lightning_hetero.ps.asp_client import AsynchronousClient
    from lightning_hetero.ps.bootstrap import FlatModel
    from lightning_hetero.ps.server import ParameterServer, ServerLoop
    from lightning_hetero.ps.sharding import Shard


class ShardHosting:
    """The shards' state and summaries (see the module's docstring)."""

    # provided by AsyncPSStrategy
    fault_timeout_s: float
    global_rank: int
    _server: ParameterServer | None  # rank 0's server (shard 0)
    _loop: ServerLoop | None
    _shard_server: ParameterServer | None  # the shard a rank 1..k-1 hosts
    _shard_loop: ServerLoop | None
    _shards: list[Shard] | None  # None: one server
    _group_indices: list[list[int]]  # per group of the user's optimizer, the layout index of each parameter
    _client: AsynchronousClient | None
    _flat_model: FlatModel | None

    @property
    def _hosted_server(self) -> ParameterServer | None:
        """The server (shard) this rank hosts, if any."""
        return self._server if self._server is not None else self._shard_server

    def _server_state(self) -> dict[str, Any]:
        """Rank 0: the whole server's state, ``{"params", "optimizer", "version"}``: each shard's a consistent
        snapshot under its lock; with shards, the others are asked for theirs one after the other."""
        assert self._server is not None
        if self._shards is None:
            return self._server.state_dict()
        assert self._client is not None
        states = [self._client.report(shard.index)["state"] for shard in self._shards]
        return {
            "params": torch.cat([state["params"] for state in states]),
            "optimizer": gather_optimizer_state(
                [state["optimizer"] for state in states], self._group_indices, self._shards
            ),
            "version": states[0]["version"],
        }

    def _load_hosted(self, optimizer_state: dict[str, Any] | None, version: int) -> None:
        """Load this rank's shard (if it hosts one) from the model's flat parameters and ``optimizer_state`` (the
        whole model's, laid out like the user's optimizer; ``None`` keeps the shard's optimizer state)."""
        server = self._hosted_server
        if server is None:
            return
        assert self._flat_model is not None
        flat = self._flat_model.flat
        if self._shards is not None:
            shard = self._shards[self.global_rank]  # rank s hosts shard s
            flat = flat[shard.start : shard.stop]
            if optimizer_state is not None:
                optimizer_state = cut_optimizer_state(optimizer_state, self._group_indices, shard)
        server.load(flat, optimizer_state, version)

    def _server_summary(self) -> dict[str, Any]:
        """Rank 0, at the end of training: shard 0's staleness summary, ``"server"`` (shard 0's statistics, see
        :meth:`~lightning_hetero.ps.server.ParameterServer.statistics`) and, with shards, ``"shards"`` (each
        shard's staleness summary and statistics, in shard order)."""
        assert self._server is not None
        summary = {**self._server.tracker.summary(), "server": self._server.statistics()}
        if self._shards is not None:
            assert self._client is not None
            reports = [self._client.report(shard.index) for shard in self._shards]
            summary["shards"] = [{**report["summary"], **report["statistics"]} for report in reports]
        return summary

    def _leave_servers(self) -> None:
        """At the end of training: leave every shard hosted elsewhere, then wait (at most ``fault_timeout_s``) for
        the other workers to leave the shard this rank hosts."""
        assert self._client is not None
        self._client.leave()
        loop = self._loop if self._loop is not None else self._shard_loop
        if loop is not None:
            loop.join(self.fault_timeout_s)
