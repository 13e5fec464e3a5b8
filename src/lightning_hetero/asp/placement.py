"""Server placement: where the parameter server runs, and what that leaves rank 0 to train (pure logic).

- ``"worker"`` (the default): the server runs as threads inside rank 0, which trains like every other rank; all N
  ranks are workers.
- ``"dedicated"``: rank 0 is reserved for the server. In ASP it trains only its reserved first batch of each epoch,
  so that Lightning's per-epoch hooks, ``sync_dist`` logging and callbacks see a batch on every rank as usual, and
  claims nothing else: ranks 1..N-1 train the rest of the epoch, and every sample is still used exactly once. Before
  the epoch-end meeting it waits for the workers' last batches (see ``FaultTolerance.meet``). In BSP and local SGD
  the server is idle and rank 0 trains its share like the others.

Example::

    >>> check_server_placement("dedicated", world_size=3)
    >>> training_workers(4, "dedicated"), training_workers(4, "worker")
    (3, 4)
    >>> reserved_only("dedicated", through_server=True, rank=0), reserved_only("dedicated", False, rank=0)
    (True, False)
    >>> reserved_only("dedicated", True, rank=1), reserved_only("worker", True, rank=0)
    (False, False)
"""

from __future__ import annotations

from lightning_hetero.asp.protocol import SERVER_RANK

#: the accepted values of ``PSAdvanced(server_placement=...)``
SERVER_PLACEMENTS = ("worker", "dedicated")


def check_server_placement(
    placement: str, server_shards: int = 1, on_worker_lost: str = "fail", world_size: int | None = None
) -> None:
    """Fail naming the setting when ``placement`` is unknown, cannot combine with the other settings, or (given the
    world size) leaves no rank to train.

    Example::

        >>> check_server_placement("dedicated", server_shards=2)
        Traceback (most recent call last):
        ...
        ValueError: PSAdvanced(server_placement='dedicated') does not support server_shards=2: shards 1..k-1 would run inside training ranks. Use server_shards=1, or server_placement='worker'.
        >>> check_server_placement("dedicated", world_size=1)
        Traceback (most recent call last):
        ...
        ValueError: PSAdvanced(server_placement='dedicated') needs at least 2 ranks (rank 0 hosts the server, the others train); the job has 1.
    """
    if placement not in SERVER_PLACEMENTS:
        raise ValueError(f"PSAdvanced(server_placement=...) must be one of {SERVER_PLACEMENTS}, got {placement!r}")
    if placement != "dedicated":
        return
    if server_shards != 1:
        raise ValueError(
            f"PSAdvanced(server_placement='dedicated') does not support server_shards={server_shards}: shards "
            "1..k-1 would run inside training ranks. Use server_shards=1, or server_placement='worker'."
        )
    if on_worker_lost != "fail":
        raise ValueError(
            f"PSAdvanced(server_placement='dedicated') does not support on_worker_lost={on_worker_lost!r} "
            "(elastic ASP trains a lost worker's batches on rank 0). Use on_worker_lost='fail', or "
            "server_placement='worker'."
        )
    if world_size is not None and world_size < 2:
        raise ValueError(
            "PSAdvanced(server_placement='dedicated') needs at least 2 ranks (rank 0 hosts the server, the "
            f"others train); the job has {world_size}."
        )


def training_workers(world_size: int, placement: str) -> int:
    """The ranks that train in ASP: all of them, or all but the dedicated server rank."""
    return world_size - 1 if placement == "dedicated" else world_size


def concurrency(world_size: int, placement: str, overlap: bool) -> tuple[int, int]:
    """The training workers (the gradients one BSP update averages) and the gradients on their way to the server at
    once in ASP: one per training worker, two when the round trip overlaps the next batch (it computes while the
    last push travels). The asynchrony compensation starts its effective number of workers from the second, before
    any staleness is measured, and sizes a gradient's step by the first.

    Example::

        >>> concurrency(4, "worker", overlap=True), concurrency(4, "dedicated", overlap=False)
        ((4, 8), (3, 3))
    """
    workers = training_workers(world_size, placement)
    return workers, 2 * workers if overlap else workers


def reserved_only(placement: str, through_server: bool, rank: int) -> bool:
    """Whether ``rank`` trains only its reserved first batch of an epoch instead of claiming batches: the dedicated
    server rank while training goes through the server (``through_server``: ASP)."""
    return placement == "dedicated" and through_server and rank == SERVER_RANK


def refuse_hetero_batches(placement: str, on_worker_lost: str) -> None:
    """``HeteroBatchCallback`` splits each global batch over all ranks by their measured speed: neither a dedicated
    server rank (which trains one batch per epoch in ASP) nor elastic ASP (a changing set of ranks) fits that.

    Example::

        >>> refuse_hetero_batches("worker", "fail")
        >>> refuse_hetero_batches("dedicated", "fail")
        Traceback (most recent call last):
        ...
        ValueError: PSAdvanced(server_placement='dedicated') does not support HeteroBatchCallback: rank 0 trains one batch per epoch in ASP, so its measured speed would not describe it. Use server_placement='worker' with it.
    """
    if on_worker_lost == "continue":
        raise ValueError(
            "AsyncPSStrategy(on_worker_lost='continue') does not support HeteroBatchCallback: its split of each "
            "global batch assumes a fixed set of ranks. Use on_worker_lost='fail' with it."
        )
    if placement == "dedicated":
        raise ValueError(
            "PSAdvanced(server_placement='dedicated') does not support HeteroBatchCallback: rank 0 trains one "
            "batch per epoch in ASP, so its measured speed would not describe it. Use server_placement='worker' "
            "with it."
        )
