"""Checkpoints of ``AsyncPSStrategy``: in ASP the model and optimizer saved are the parameter server's (rank 0's
worker holds only the parameters of its last pull), with the server's version and the mode; a restored checkpoint
is loaded into the server too (with ``server_shards > 1`` every host loads its cut, through
:mod:`~lightning_hetero.asp.shard_hosting`: the file is the same whatever the number of shards). An engine with state
of its own (local SGD's rounds and outer optimizer) keeps it under its key beside the version and the mode.

Example::

    >>> import torch
    >>> from lightning_hetero.async_ps.runtime.context import StepCounter
    >>> checkpointing = Checkpointing(engines={}, counter=StepCounter())
    >>> checkpointing.restore({"async_ps": {"version": 12, "mode": "asp"}}), checkpointing.counter.version
    ('asp', 12)
    >>> checkpoint = {}
    >>> checkpointing.save_into(checkpoint, "asp")
    >>> checkpoint
    {'async_ps': {'version': 12, 'mode': 'asp'}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning_hetero.async_ps.interfaces import Engine, SavedState
from lightning_hetero.contracts import Mode, check_mode
from lightning_hetero.param_groups import hyperparameters

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from lightning_hetero.async_ps.runtime.context import PSContext, StepCounter

#: the key of the strategy's own state in a checkpoint
CHECKPOINT_KEY = "async_ps"
#: the key of the claim pool's position in the strategy's entry (a checkpoint at a validation point inside an epoch)
POOL_KEY = "claim_pool"


class Checkpointing:
    """The strategy's checkpoint contents (the strategy's Lightning checkpoint hooks call it).

    Args:
        engines: the strategy's engines by mode (each keeps its state under its ``state_key``).
        counter: the model's version.
    """

    def __init__(self, engines: Mapping[str, Engine], counter: StepCounter) -> None:
        self.engines = engines
        self.counter = counter
        self._saved: SavedState | None = None  # what the checkpoint being saved holds in place of this rank's model
        #: the claim pool's position in the checkpoint restored last (``None``: none, or not inside an epoch)
        self.pool_position: dict[str, int] | None = None

    def model_state(self, state: dict[str, Any], engine: Engine, ctx: PSContext | None) -> dict[str, Any]:
        """The model's state to save: ``state``, with the parameters ``engine`` saves in their place (the server's in
        ASP, the start-of-round ones in local SGD)."""
        self._saved = engine.saved_state() if ctx is not None and ctx.active else None
        if self._saved is None:
            return state
        assert ctx is not None
        layout = ctx.flat.layout
        for name, value in zip(layout.names, layout.views(self._saved.params), strict=True):
            state[name] = value.to(dtype=state[name].dtype).clone()
        return state

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """The server's optimizer state while a checkpoint of ASP is being saved, with the hyper-parameters rank 0's
        schedulers set since the server's last update; ``None``: the optimizer's own."""
        if self._saved is None or self._saved.optimizer is None:
            return None
        state = self._saved.optimizer
        for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
            saved.update(hyperparameters(group))
        return state

    def save_into(self, checkpoint: dict[str, Any], mode: Mode, pool_position: dict[str, int] | None = None) -> None:
        """Add the strategy's entry: the model's version, the mode, each engine's own state and, at a validation
        point inside an epoch, the claim pool's ``pool_position`` (see :meth:`.ClaimSampler.position`)."""
        saved, self._saved = self._saved, None
        version = saved.version if saved is not None and saved.version is not None else self.counter.version
        entry: dict[str, Any] = {"version": version, "mode": mode}
        if pool_position is not None:
            entry[POOL_KEY] = pool_position
        for engine in self.engines.values():
            state = engine.state_dict() if engine.state_key is not None else None
            if state is not None:
                entry[engine.state_key] = state
        checkpoint[CHECKPOINT_KEY] = entry

    def restore(self, checkpoint: dict[str, Any]) -> Mode | None:
        """Restore the version and each engine's state from a loaded checkpoint, and keep its claim pool position
        (:attr:`pool_position`; ``None`` in a checkpoint without one: its epoch starts again); the mode it was saved
        in (``None`` for a checkpoint of another strategy)."""
        restored = checkpoint.get(CHECKPOINT_KEY)
        if restored is None:
            return None
        self.counter.version = int(restored["version"])
        self.pool_position = restored.get(POOL_KEY)
        for engine in self.engines.values():
            if engine.state_key is not None:
                engine.load_state_dict(restored.get(engine.state_key))
        return check_mode(restored["mode"])
