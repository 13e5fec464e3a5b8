"""Checkpoints of ``AsyncPSStrategy``: in ASP the model and optimizer saved are the parameter server's (rank 0's
worker holds only the parameters of its last pull), with the server's version and the mode; a restored checkpoint
is loaded into the server too. With ``server_shards > 1`` rank 0 gathers the shards' states and every host loads its
cut, through :mod:`~lightning_hetero.ps.shard_hosting`: the file is the same whatever the number of shards.

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy`: these are Lightning's ``Strategy`` checkpoint
hooks, which the Trainer's checkpoint connector calls on the strategy itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.optim import Optimizer
from typing_extensions import override

from lightning_hetero._lightning_internals import load_strategy_checkpoint
from lightning_hetero.param_groups import hyperparameters

if TYPE_CHECKING:
    from lightning_hetero.ps.bootstrap import FlatModel
    from lightning_hetero.ps.server import ParameterServer

#: the key of the strategy's own state in a checkpoint
CHECKPOINT_KEY = "async_ps"


class Checkpointing:
    """The strategy's checkpoint hooks (see the module's docstring); the next class in the MRO is ``DDPStrategy``."""

    # provided by AsyncPSStrategy
    version: int
    optimizers: list[Optimizer]
    _mode: str
    _active: bool
    _server: ParameterServer | None
    _flat_model: FlatModel | None
    _snapshot: dict[str, Any] | None  # the server's state while a checkpoint is being saved
    _server_state: Callable[[], dict[str, Any]]  # ShardHosting
    _load_hosted: Callable[[dict[str, Any] | None, int], None]  # ShardHosting
    _restored: dict[str, Any] | None  # this strategy's state from the checkpoint being restored

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        state = super().lightning_module_state_dict()
        if self._mode == "local" and self._active:
            return self._local_state_into(state)
        if self._server is None or self._mode != "asp" or not self._active:
            return state
        assert self._flat_model is not None
        self._snapshot = self._server_state()
        layout = self._flat_model.layout
        for name, value in zip(layout.names, layout.views(self._snapshot["params"]), strict=True):
            state[name] = value.to(dtype=state[name].dtype)
        return state

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._snapshot is None:
            return super().optimizer_state(optimizer)
        # the server's state, with the hyper-parameters rank 0's schedulers set since the server's last update
        state = self._snapshot["optimizer"]
        for saved, group in zip(state["param_groups"], self.optimizers[0].param_groups, strict=True):
            saved.update(hyperparameters(group))
        return state

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        version = self._snapshot["version"] if self._snapshot is not None else self.version
        self._snapshot = None
        checkpoint[CHECKPOINT_KEY] = {"version": version, "mode": self._mode}
        local_state = self._local_checkpoint_state()
        if local_state is not None:
            checkpoint[CHECKPOINT_KEY]["local_sgd"] = local_state
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = load_strategy_checkpoint(super().load_checkpoint, checkpoint_path, weights_only)
        self._restored = checkpoint.get(CHECKPOINT_KEY)
        if self._restored is not None:
            self.version = int(self._restored["version"])
            self._mode = self._restored["mode"]
            self._restore_local(self._restored.get("local_sgd"))
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        super().load_model_state_dict(checkpoint, strict=strict)
        self._load_server(None)

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        super().load_optimizer_state_dict(checkpoint)
        self._load_server(checkpoint["optimizer_states"][0])

    def _load_server(self, optimizer_state: dict[str, Any] | None) -> None:
        self._load_hosted(optimizer_state, self.version)
