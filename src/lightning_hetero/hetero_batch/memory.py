"""``memory_caps="auto"``: each rank's largest batch that fits, found from measured memory and from out-of-memory errors.

:class:`MemoryCaps` (pure) holds every rank's cap: this rank's is lowered when a step runs out of memory
(:meth:`~MemoryCaps.lower`) or set from the memory a sample is measured to take on CUDA
(:func:`cap_from_memory`), and all ranks' caps are read from the adjustment's exchange so that every rank splits
within them (:func:`~lightning_hetero.hetero_batch.tuner.respect_caps`). :class:`MemoryGuard` is the Lightning glue: a step that raises
``torch.OutOfMemoryError`` in ``training_step`` is not lost; the rank frees memory and redoes it in chunks no larger
than its new cap, accumulating their gradients into one backward, so DDP's all-reduce still sees the rank's whole
batch: every sample is used once and the global batch stays exact. Until the next adjustment moves the split within
the cap, that rank runs each larger batch in chunks. An out-of-memory error in the backward pass is recovered the same
way, by redoing the optimizer's closure (its ``training_step`` then in chunks), except under DDP or FSDP (whose
gradient reduction the other ranks already joined) or mid-accumulation (whose earlier gradients the failed backward
mixed into): there the error says which rank failed at which size and how to set ``memory_caps``.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero.hetero_batch.gradients import chunk_size, run_in_chunks

log = logging.getLogger("lightning_hetero.hetero_batch")

#: a cap lowered after an out-of-memory error is this fraction of the size that failed
BACKOFF = 0.75
#: the share of the device's free memory a cap estimated from the per-sample slope may plan to use
MEMORY_HEADROOM = 0.9


class MemoryCaps:
    """Every rank's largest batch known to fit (``None``: no cap known), this rank's own lowered as it learns.

    Args:
        world_size: number of ranks.
        rank: this rank.
        multiple: caps are rounded down to a multiple of this (``batch_size_multiple``; below it a cap is kept as
            it is), never below 1; the callback sets it once ``batch_size_multiple`` is resolved.

    Example::

        >>> caps = MemoryCaps(world_size=2, rank=1)
        >>> caps.lower(failed_size=40)  # a step of 40 samples ran out of memory
        30
        >>> caps.own, caps.all
        (30, (None, 30))
        >>> caps.read([None, 30]); caps.all
        (None, 30)
    """

    def __init__(self, world_size: int, rank: int, multiple: int = 1) -> None:
        self.rank, self.multiple = rank, multiple
        self.all: tuple[int | None, ...] = (None,) * world_size

    @property
    def own(self) -> int | None:
        return self.all[self.rank]

    def _set_own(self, cap: int) -> int:
        cap = chunk_size(cap, self.multiple)
        own = cap if self.own is None else min(self.own, cap)
        self.all = tuple(own if k == self.rank else c for k, c in enumerate(self.all))
        return own

    def lower(self, failed_size: int) -> int:
        """A batch of ``failed_size`` samples ran out of memory: the cap becomes ``BACKOFF`` of it (at most)."""
        return self._set_own(min(failed_size - 1, math.floor(failed_size * BACKOFF)))

    def estimate(self, cap: int) -> int:
        """A cap estimated from measured memory (:func:`cap_from_memory`): kept if below the one known."""
        return self._set_own(cap)

    def read(self, caps: Sequence[float | None]) -> None:
        """Every rank's cap as exchanged (NaN or ``None``: none)."""
        self.all = tuple(None if c is None or not math.isfinite(c) else int(c) for c in caps)

    def restore(self, caps: Sequence[int | None]) -> None:
        """Every rank's cap from a checkpoint (where one is known already, the lower is kept); caps saved for another
        number of ranks are ignored.

        Example::

            >>> caps = MemoryCaps(world_size=2, rank=0)
            >>> caps.lower(failed_size=40), caps.restore([24, 16]), caps.all
            (30, None, (24, 16))
        """
        if len(caps) != len(self.all):
            return
        self.all = tuple(c if k is None else k if c is None else min(c, k) for c, k in zip(self.all, caps, strict=True))


def saved_caps(guard: MemoryGuard | None) -> dict[str, Any]:
    """The callback's checkpoint entry for ``memory_caps="auto"``: every rank's own cap, gathered from the ranks
    (:meth:`MemoryGuard.gathered_caps`; Lightning saves rank 0's entry)."""
    return {} if guard is None else {"memory_caps": guard.gathered_caps()}


def restore_caps(guard: MemoryGuard | None, state: Mapping[str, Any]) -> None:
    """Restore :func:`saved_caps`'s entry: each rank takes its own cap, and the others' as they were saved (nothing
    to do for a checkpoint without one or a run without "auto"; a checkpoint from before the caps were gathered holds
    rank 0's view of them and loads the same way)."""
    if guard is not None and state.get("memory_caps") is not None:
        guard.caps.restore(state["memory_caps"])


def cap_from_memory(step_bytes: int, batch_size: int, available_bytes: int) -> int:
    """The largest batch whose step fits: a measured step took ``step_bytes`` beyond what stays allocated between
    steps, for ``batch_size`` samples (taken as all per-sample: a pessimistic slope), and ``available_bytes`` can be
    used by a step (the device's free memory plus what torch's allocator holds beyond the memory between steps);
    ``MEMORY_HEADROOM`` of it is planned for.

    Example::

        >>> cap_from_memory(step_bytes=32_000, batch_size=32, available_bytes=100_000)  # 1000 bytes per sample
        90
    """
    per_sample = max(1.0, step_bytes / max(1, batch_size))
    return max(1, math.floor(available_bytes * MEMORY_HEADROOM / per_sample))


def free_memory(device: torch.device) -> None:
    """Drop what an out-of-memory step left allocated (Python's garbage, the CUDA caching allocator's free blocks)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class MemoryGuard:
    """Shadows ``strategy.training_step`` for a fit: a step over this rank's cap, or one that runs out of memory, is
    run in chunks within the cap (see the module's description), until :meth:`remove`.

    Args:
        caps: the caps (this rank's is lowered on an out-of-memory error).
        local_size: this step's batch size on this rank.
        device: the rank's device (whose cache is emptied after an out-of-memory error).
        on_lowered: told the new cap and the size that failed (for the user's log).
    """

    def __init__(
        self,
        caps: MemoryCaps,
        local_size: Callable[[], int],
        device: torch.device,
        on_lowered: Callable[[int, int], None] = lambda cap, failed: None,
    ) -> None:
        self.caps, self.local_size, self.device, self.on_lowered = caps, local_size, device, on_lowered
        #: steps redone in chunks after an out-of-memory error, and steps run in chunks because over the cap
        self.redone = self.chunked = 0
        # CUDA: steps 2 and 3's peak memory sets the cap (see `cap_from_memory`); the first step also allocates the
        # optimizer's state, which is not per-sample memory
        self._measure_left = 4
        self._last: tuple[int, int] | None = None  # (allocated bytes at the last step's start, its batch size)
        self._retry = False  # the optimizer's closure is being redone: the strategy's own step already ran
        self._ran: int | None = None  # the largest piece the last training_step ran (its backward's size)
        self._strategy: Any = None  # where the ranks' caps are gathered for a checkpoint (set by `install`)

    def _measure_cuda(self, size: int) -> None:
        """The previous step's peak against its start (allocator statistics: no device synchronisation)."""
        if self._last is not None and self._measure_left < 3:
            base, last_size = self._last
            free, _ = torch.cuda.mem_get_info(self.device)
            step_bytes = torch.cuda.max_memory_allocated(self.device) - base
            available = free + torch.cuda.memory_reserved(self.device) - base
            self.caps.estimate(cap_from_memory(step_bytes, last_size, available))
        self._measure_left -= 1
        torch.cuda.reset_peak_memory_stats(self.device)
        self._last = (torch.cuda.memory_allocated(self.device), size)

    def install(self, strategy: Any, module: torch.nn.Module) -> None:
        original = strategy.training_step
        plain = functools.partial(Strategy.training_step, strategy)

        def training_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if self.device.type == "cuda" and self._measure_left > 0:
                self._measure_cuda(self.local_size())
            size, failed, called = self.local_size(), False, self._retry
            self._retry, self._ran = False, None
            while True:
                cap = self.caps.own
                chunked, piece = cap is not None and size > cap, self._piece(size)
                # the strategy's own step (AsyncPSStrategy claims a chunk of data in it) runs once per step; any
                # further forward goes through Lightning's plain one
                first = plain if called else original
                called = True
                try:
                    if chunked:
                        out = run_in_chunks(first, plain, strategy, module, batch, size, piece, args, kwargs)
                    else:
                        out = first(batch, *args, **kwargs)
                    break
                except torch.OutOfMemoryError:
                    pass  # leave the handler first, so that the failed attempt's frames (and tensors) can be freed
                self._lower(piece)
                failed = True
            self.redone += failed
            self.chunked += chunked and not failed
            self._ran = self._piece(size)
            return out

        strategy.training_step = training_step
        self._install_closure_guard(strategy, module)
        self._strategy = strategy

    def _piece(self, size: int) -> int:
        """The largest piece of a batch of ``size`` run at once: the batch, or chunks within the cap
        (:func:`~lightning_hetero.hetero_batch.gradients.chunk_size`: multiples of ``batch_size_multiple``)."""
        cap = self.caps.own
        return size if cap is None or size <= cap else chunk_size(cap, self.caps.multiple)

    def gathered_caps(self) -> list[int | None]:
        """Every rank's own cap, gathered from the ranks (one all-gather: a checkpoint holds each rank's cap as that
        rank learnt it); this rank's view (the others' as of the last adjustment) where the ranks do not meet
        (before :meth:`install`, inside an asynchronous batch of ``AsyncPSStrategy``)."""
        if self._strategy is None:
            return list(self.caps.all)
        own = math.nan if self.caps.own is None else float(self.caps.own)
        mine = torch.tensor([own], dtype=torch.float64, device=self._strategy.root_device)
        gathered = self._strategy.all_gather(mine).reshape(-1).tolist()
        if len(gathered) != len(self.caps.all):
            return list(self.caps.all)
        return [None if not math.isfinite(c) else int(c) for c in gathered]

    def _lower(self, failing: int) -> None:
        if failing <= 1:
            raise torch.OutOfMemoryError(f"rank {self.caps.rank}: a step of one sample does not fit in memory")
        free_memory(self.device)
        self.on_lowered(self.caps.lower(failing), failing)

    def _install_closure_guard(self, strategy: Any, module: torch.nn.Module) -> None:
        """An out-of-memory error in the backward pass: the optimizer's closure is redone within a lowered cap (its
        ``training_step`` then in chunks, each early chunk back-propagated inside the step's guard)."""
        original = strategy.optimizer_step

        def optimizer_step(optimizer: Any, closure: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
            def guarded() -> Any:
                while True:
                    try:
                        return closure()
                    except torch.OutOfMemoryError:
                        if self._ran is None:  # training_step itself gave up (one sample does not fit)
                            raise
                    failing, self._ran = self._ran, None
                    for param in module.parameters():
                        param.grad = None  # the failed backward's partial gradients
                    self._lower(failing)
                    self.redone += 1
                    self._retry = True

            return original(optimizer, guarded, *args, **kwargs)

        strategy.optimizer_step = optimizer_step
        original_backward = strategy.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            try:
                return original_backward(*args, **kwargs)
            except torch.OutOfMemoryError:
                if self._ran is not None:
                    self._refuse_unsafe_retry(strategy, self._ran)
                raise

        strategy.backward = backward

    def _refuse_unsafe_retry(self, strategy: Any, failing: int) -> None:
        """DDP's all-reduce (FSDP's reduce-scatter) is joined by the other ranks during backward, and under gradient
        accumulation the failed backward mixed into the earlier micro-batches' gradients: neither can be redone."""
        trainer = getattr(strategy.lightning_module, "_trainer", None)
        why = None
        if isinstance(strategy.model, DistributedDataParallel | FullyShardedDataParallel):
            why = f"under {type(strategy.model).__name__} (the other ranks already joined its gradient reduction)"
        elif trainer is not None and trainer.accumulate_grad_batches > 1:
            why = "with accumulate_grad_batches > 1 (the earlier micro-batches' gradients are mixed in)"
        if why is not None:
            self._ran = None  # not to be redone
            raise torch.OutOfMemoryError(
                f"HeteroBatch: rank {self.caps.rank} ran out of memory in backward at a batch of {failing}, which "
                f"memory_caps='auto' cannot redo {why}; set memory_caps=[...] with a size below {failing} for rank "
                f"{self.caps.rank} (one entry per rank, None for no cap)"
            )

    @staticmethod
    def remove(strategy: Any) -> None:
        vars(strategy).pop("training_step", None)
        vars(strategy).pop("optimizer_step", None)
        vars(strategy).pop("backward", None)


def auto_memory_guard(rank: int, world_size: int, device: torch.device, local_size: Callable[[], int]) -> MemoryGuard:
    """The guard for ``memory_caps="auto"``, saying once what "auto" can do on ``device``.

    Example::

        >>> guard = auto_memory_guard(0, 2, torch.device("cpu"), local_size=lambda: 32)
        >>> guard.caps.all
        (None, None)
    """
    if device.type == "cuda":
        how = "each rank's cap from its measured memory per sample against torch.cuda.mem_get_info"
    else:
        how = (
            f"{device.type} memory cannot be measured here, so the caps start unbounded and a rank's cap is set only "
            "when a step raises torch.OutOfMemoryError"
        )
    rank_zero_info(
        f"HeteroBatchCallback(memory_caps='auto'): {how}; a step that runs out of memory is redone in chunks"
    )

    def lowered(cap: int, failed: int) -> None:
        log.warning(f"HeteroBatch: rank {rank} ran out of memory at a batch of {failed}; its cap is now {cap}")

    return MemoryGuard(MemoryCaps(world_size, rank), local_size, device, on_lowered=lowered)
