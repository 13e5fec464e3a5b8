"""Sharding the parameter server: which contiguous slice of the flat parameters each shard holds, and the optimizer
state cut into shards and gathered back.

A shard holds a contiguous run of *whole* parameters (so any optimizer, including one with per-parameter norms, steps
a shard exactly as it would step the whole model), cut where the shards' sizes come closest to equal. Shard ``s``'s
server lives in global rank ``s``. Checkpoints and mode switches use the unsharded optimizer ``state_dict`` format
(the template optimizer's), so a checkpoint written with any number of shards resumes with any other.

Example::

    >>> import torch
    >>> from lightning_hetero.asp.layout import FlatLayout
    >>> layout = FlatLayout.from_named_parameters([("a", torch.zeros(6)), ("b", torch.zeros(2)), ("c", torch.zeros(4))])
    >>> [(shard.start, shard.stop, shard.first, shard.last) for shard in plan_shards(layout, 2)]
    [(0, 6, 0, 1), (6, 12, 1, 3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hetero._validation import check_range
from lightning_hetero.asp.layout import FlatLayout


@dataclass(frozen=True)
class Shard:
    """One shard: elements ``[start, stop)`` of the flat parameters, parameters ``[first, last)`` of the layout.

    Args:
        index: the shard's number (its server lives in global rank ``index``).
        start: its first element in the flat parameters.
        stop: one past its last element.
        first: its first parameter's index in the layout.
        last: one past its last parameter's index.
    """

    index: int
    start: int
    stop: int
    first: int
    last: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    def layout(self, layout: FlatLayout) -> FlatLayout:
        """The shard's own layout: its parameters, packed from 0."""
        return FlatLayout(layout.names[self.first : self.last], layout.shapes[self.first : self.last])


def check_server_shards(server_shards: int, world_size: int | None = None, on_worker_lost: str = "fail") -> None:
    """Fail naming the setting when ``server_shards`` is not an integer from 1 to the world size, or shards the
    server in elastic ASP (``on_worker_lost="continue"``).

    Example::

        >>> check_server_shards(2, world_size=4)
        >>> check_server_shards(3, world_size=2)
        Traceback (most recent call last):
        ...
        ValueError: PSAdvanced(server_shards=3) needs at least 3 ranks to host the shards (rank s hosts shard s); the job has 2.
    """
    check_range("PSAdvanced(server_shards=...)", server_shards, low=1, integer=True)
    if server_shards > 1 and on_worker_lost == "continue":
        raise ValueError(
            f"PSAdvanced(server_shards={server_shards}) does not support on_worker_lost='continue' (elastic "
            "ASP): a lost rank may host a shard. Use server_shards=1 or on_worker_lost='fail'."
        )
    if world_size is not None and server_shards > world_size:
        raise ValueError(
            f"PSAdvanced(server_shards={server_shards}) needs at least {server_shards} ranks to host the shards "
            f"(rank s hosts shard s); the job has {world_size}."
        )


def plan_shards(layout: FlatLayout, shards: int) -> list[Shard]:
    """Cut the layout into ``shards`` contiguous runs of whole parameters, each cut at the parameter boundary nearest
    to an equal split of the elements (every shard holds at least one parameter).

    Args:
        layout: the model's flat layout.
        shards: the number of shards.

    Raises:
        ValueError: the model has fewer trainable parameters than ``shards``.
    """
    numels = layout.numels
    if shards > len(numels):
        raise ValueError(
            f"PSAdvanced(server_shards={shards}): the model has only {len(numels)} trainable parameter tensors "
            "and a shard holds whole tensors; use fewer shards."
        )
    ends = [offset + numel for offset, numel in zip(layout.offsets, numels, strict=True)]
    cuts = [0]
    for s in range(1, shards):
        target = layout.numel * s / shards
        # a boundary after the previous cut that leaves at least one parameter for each shard still to come
        allowed = range(cuts[-1] + 1, len(numels) - (shards - s) + 1)
        cuts.append(min(allowed, key=lambda i: abs(ends[i - 1] - target)))
    cuts.append(len(numels))
    starts = (0, *ends)
    return [Shard(s, starts[cuts[s]], starts[cuts[s + 1]], cuts[s], cuts[s + 1]) for s in range(shards)]


def template_positions(group_indices: Sequence[Sequence[int]], shard: Shard) -> list[int]:
    """The positions, in the template optimizer's ``state_dict`` numbering, of the parameters the shard's optimizer
    holds, in the shard's own numbering order.

    Args:
        group_indices: per param group of the template, the layout index of each of its parameters.
        shard: the shard.

    Example::

        >>> template_positions([[2, 0], [1, 3]], Shard(0, 0, 5, first=0, last=2))  # layout indices 0 and 1
        [1, 2]
    """
    positions, position = [], 0
    for indices in group_indices:
        for index in indices:
            if shard.first <= index < shard.last:
                positions.append(position)
            position += 1
    return positions


def cut_optimizer_state(state: dict[str, Any], group_indices: Sequence[Sequence[int]], shard: Shard) -> dict[str, Any]:
    """The shard's part of an optimizer ``state_dict`` laid out like the template's.

    Args:
        state: the whole model's optimizer ``state_dict``.
        group_indices: see :func:`template_positions`.
        shard: the shard.

    Example::

        >>> whole = {"state": {0: {"m": 1}, 2: {"m": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}]}
        >>> cut_optimizer_state(whole, [[0, 1, 2]], Shard(1, 3, 9, first=1, last=3))
        {'state': {1: {'m': 3}}, 'param_groups': [{'lr': 0.1, 'params': [0, 1]}]}
    """
    positions = template_positions(group_indices, shard)
    local = {position: i for i, position in enumerate(positions)}
    groups = [{**group, "params": [local[p] for p in group["params"] if p in local]} for group in state["param_groups"]]
    return {"state": {local[p]: value for p, value in state["state"].items() if p in local}, "param_groups": groups}


def gather_optimizer_state(
    states: Sequence[dict[str, Any]], group_indices: Sequence[Sequence[int]], shards: Sequence[Shard]
) -> dict[str, Any]:
    """The whole model's optimizer ``state_dict`` (the template's layout) from the shards' (the inverse of
    :func:`cut_optimizer_state`); the hyper-parameters are shard 0's.

    Args:
        states: each shard's optimizer ``state_dict``, in shard order.
        group_indices: see :func:`template_positions`.
        shards: the shards.

    Example::

        >>> parts = [{"state": {0: {"m": 1}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        ...          {"state": {1: {"m": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}]
        >>> plan = [Shard(0, 0, 3, first=0, last=1), Shard(1, 3, 9, first=1, last=3)]
        >>> gather_optimizer_state(parts, [[0, 1, 2]], plan)
        {'state': {0: {'m': 1}, 2: {'m': 3}}, 'param_groups': [{'lr': 0.1, 'params': [0, 1, 2]}]}
    """
    gathered: dict[int, Any] = {}
    for state, shard in zip(states, shards, strict=True):
        positions = template_positions(group_indices, shard)
        gathered.update({positions[local]: value for local, value in state["state"].items()})
    groups, position = [], 0
    for group, indices in zip(states[0]["param_groups"], group_indices, strict=True):
        groups.append({**group, "params": list(range(position, position + len(indices)))})
        position += len(indices)
    return {"state": dict(sorted(gathered.items())), "param_groups": groups}
