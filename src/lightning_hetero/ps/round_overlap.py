"""Local SGD's round-end all-reduce overlapped with the next round's first steps (Streaming DiLoCo's overlapped outer
step).

At a round's end a rank sends its message (:meth:`~lightning_hetero.ps.local_sgd.LocalRounds.message`) with an
asynchronous all-reduce, keeps a copy of the parameters it sent, and goes on training the next round from where it
is. When the all-reduce has completed (seen at a later step's start, or at the next round's end at the latest) the
combined outer step is applied to the start-of-round parameters and the local progress since the message is kept on
top of it: ``params = new anchor + (params - sent)`` (:func:`rebase`). The next message's pseudo-gradient
(``anchor - params``) is then exactly the progress since the last one, so every local step enters one outer step.
At most one all-reduce is in flight; an epoch's last round end waits for it and ends with a blocking all-reduce
that leaves every rank on the same parameters.

Example: two ranks simulated in one process; the all-reduce is the sum of the messages, its "handle" completes when
both have sent::

    >>> import torch
    >>> from lightning_hetero.ps.local_sgd import LocalRounds, RoundBudget
    >>> from lightning_hetero.ps.outer_optimizer import OuterOptimizer
    >>> ranks = [LocalRounds(RoundBudget(samples=2), r, 2, OuterOptimizer(torch.optim.SGD, {"lr": 1.0})) for r in (0, 1)]
    >>> params = [torch.zeros(2), torch.zeros(2)]
    >>> for rounds, flat in zip(ranks, params):
    ...     rounds.begin(flat, batch_size=1)
    >>> params[0] += torch.tensor([1.0, 0.0]); params[1] += torch.tensor([0.0, 1.0])  # a local step each: the round is done
    >>> [rounds.record_step(samples=1, step_s=None) for rounds in ranks]
    [True, True]
    >>> messages = [rounds.message(flat) for rounds, flat in zip(ranks, params)]
    >>> total = messages[0] + messages[1]
    >>> overlaps = [RoundOverlap(start=lambda m: _Done(), wait=lambda handle: None) for _ in ranks]
    >>> for overlap, rounds, flat, message in zip(overlaps, ranks, params, messages):
    ...     overlap.launch(message.copy_(total), flat)
    ...     rounds.start_next_round()
    >>> params[0] += torch.tensor([0.0, 2.0])  # rank 0 trains on while the all-reduce runs
    >>> overlaps[0].ready(), overlaps[0].settle(lambda summed, sent: ranks[0].apply(summed, params[0], sent=sent))
    (True, RoundOutcome(all_done=False, samples=2, steps=2))
    >>> params[0], ranks[0].outer.anchor  # the mean of the round's ends, plus rank 0's progress since
    (tensor([0.5000, 2.5000]), tensor([0.5000, 0.5000]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from torch import Tensor

T = TypeVar("T")


class Handle(Protocol):
    """What an asynchronous collective returns (``torch.distributed``'s ``Work``)."""

    def is_completed(self) -> bool: ...


class _Done:
    """A handle already completed (the module's example)."""

    def is_completed(self) -> bool:
        return True


def rebase(flat: Tensor, sent: Tensor, anchor: Tensor) -> None:
    """Move ``flat`` onto the new ``anchor``, keeping its progress since ``sent``: ``flat = anchor + (flat - sent)``.

    Example::

        >>> import torch
        >>> flat = torch.tensor([3.0, 1.0])
        >>> rebase(flat, sent=torch.tensor([2.0, 1.0]), anchor=torch.tensor([0.5, 0.5]))
        >>> flat
        tensor([1.5000, 0.5000])
    """
    flat.sub_(sent).add_(anchor)


@dataclass
class PendingRound:
    """A round-end all-reduce in flight: its handle, the message (summed in place) and the parameters sent."""

    handle: Any
    message: Tensor
    sent: Tensor


class RoundOverlap:
    """At most one round-end all-reduce in flight (see the module's docstring).

    Args:
        start: starts the SUM all-reduce of a message in place and returns its handle.
        wait: waits for a handle to complete (raising what a broken collective raises).
    """

    def __init__(self, start: Callable[[Tensor], Any], wait: Callable[[Any], None]) -> None:
        self._start = start
        self._wait = wait
        #: the all-reduce in flight, if any
        self.pending: PendingRound | None = None

    def launch(self, message: Tensor, flat: Tensor) -> None:
        """Start the all-reduce of ``message``, keeping a copy of ``flat`` (the parameters it was computed from)."""
        if self.pending is not None:
            raise RuntimeError("RoundOverlap.launch with an all-reduce in flight: settle it first")
        sent = flat.detach().clone()
        self.pending = PendingRound(self._start(message), message, sent)

    def ready(self) -> bool:
        """Whether an all-reduce is in flight and has completed (settling it would not wait)."""
        return self.pending is not None and bool(self.pending.handle.is_completed())

    def settle(self, apply: Callable[[Tensor, Tensor], T]) -> T | None:
        """Wait for the all-reduce in flight (if any) and return ``apply(summed message, parameters sent)``."""
        pending = self.pending
        if pending is None:
            return None
        self.pending = None
        self._wait(pending.handle)
        return apply(pending.message, pending.sent)
