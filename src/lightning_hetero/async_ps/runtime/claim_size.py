"""How many batches an ASP worker claims per trip to the epoch's shared claim counter: as many as it trains in about
:data:`CLAIM_SPAN_S` of its own steps, so that fast steps (a few milliseconds, where one trip to rank 0's store
costs a tenth of a step) share a trip and slow steps keep claiming one batch at a time.

The worker measures its own step (the time between the starts of its batches, smoothed) and sizes its next claims
from it. A claim's batches are this worker's until it trains them, so at an epoch's (a validation point's) end a
worker may still hold up to :data:`CLAIM_SPAN_S` of work while the others have run dry; the
:class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler` further caps every claim at ``1 / (2 N)`` of what is left, so
the last claims are single batches. Which batches a worker trains changes, never how many the epoch has: every
sample is still trained once.

Pure logic: no store, no Trainer.

Example::

    >>> size = ClaimSize()
    >>> size.batch_started(0.0)  # the first step's time is not known yet: one batch
    1
    >>> [size.batch_started(0.004 * k) for k in range(1, 4)]  # 4 ms steps: 10 batches make 40 ms
    [10, 10, 10]
    >>> size.restart()  # an epoch's edge: the time across it is not a step
    >>> size.batch_started(1.0), size.batch_started(1.1)  # 100 ms steps: one batch a claim
    (10, 1)
"""

from __future__ import annotations

from lightning_hetero._validation import check_range

#: seconds of a worker's own steps one claim covers
CLAIM_SPAN_S = 0.04
#: the most batches one claim takes
MAX_CLAIM_CHUNKS = 16


class ClaimSize:
    """A worker's claim size from its measured step time (see the module's docstring).

    Args:
        span_s: seconds of the worker's steps one claim covers, > 0.
        max_chunks: the most batches one claim takes, >= 1.
        smoothing: EWMA weight of each measured step, in (0, 1].
    """

    def __init__(self, span_s: float = CLAIM_SPAN_S, max_chunks: int = MAX_CLAIM_CHUNKS, smoothing: float = 0.2):
        check_range("span_s", span_s, low=0.0, low_open=True)
        check_range("max_chunks", max_chunks, low=1, integer=True)
        check_range("smoothing", smoothing, low=0.0, high=1.0, low_open=True)
        self.span_s = span_s
        self.max_chunks = max_chunks
        self.smoothing = smoothing
        #: the smoothed step time in seconds (``None`` until two batch starts were seen)
        self.step_s: float | None = None
        self._last_start: float | None = None
        self._chunks = 1

    def batch_started(self, now: float) -> int:
        """Record a batch's start (``now``, seconds on a monotonic clock) and return the batches the next claim takes.

        Args:
            now: the batch's start time.
        """
        if self._last_start is not None:
            step = now - self._last_start
            self.step_s = step if self.step_s is None else self.step_s + self.smoothing * (step - self.step_s)
            # (the tolerance keeps a span of exactly k steps at k batches through rounding)
            self._chunks = max(1, min(self.max_chunks, int(self.span_s / max(self.step_s, 1e-9) + 1e-6)))
        self._last_start = now
        return self._chunks

    def restart(self) -> None:
        """An epoch's (a validation point's) edge: the next interval between batch starts is not a step; the size
        measured so far is kept."""
        self._last_start = None


def claim_size_message(span_s: float = CLAIM_SPAN_S, max_chunks: int = MAX_CLAIM_CHUNKS) -> str:
    """What ASP's workers claim per trip to the claim counter, appended to the start line on rank 0.

    Args:
        span_s: seconds of a worker's steps one claim covers.
        max_chunks: the most batches one claim takes.

    Example::

        >>> print(claim_size_message())
         Each worker claims the batches of about 40 ms of its own steps at once (1 to 16; fewer near an epoch's end).
    """
    return (
        f" Each worker claims the batches of about {span_s * 1000:g} ms of its own steps at once "
        f"(1 to {max_chunks}; fewer near an epoch's end)."
    )
