"""What the features offer each other: the synchronisation ``Mode`` and the strategy contracts the callbacks rely on.

``HeteroBatchCallback`` and ``SyncSwitchCallback`` work with any strategy that offers what they need, not only with
:class:`~lightning_hetero.AsyncPSStrategy`; these protocols say what that is (``isinstance`` checks the methods and
attributes are there). Plain typing, no Lightning import.

Example::

    >>> check_mode("asp")
    'asp'
    >>> class Switchable:
    ...     mode = "bsp"
    ...     last_switch_s = None
    ...     def set_mode(self, mode): self.mode = mode
    >>> isinstance(Switchable(), SwitchableStrategy), isinstance(object(), SwitchableStrategy)
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, cast, runtime_checkable

#: how the ranks combine their gradients: ``"bsp"`` synchronously (all-reduce), ``"asp"`` asynchronously (through a
#: parameter server), ``"local"`` by local SGD (an all-reduce of pseudo-gradients per round, see docs/local_sgd.md)
Mode = Literal["bsp", "asp", "local"]
MODES: tuple[Mode, ...] = ("bsp", "asp", "local")


def check_mode(mode: str, what: str = "mode") -> Mode:
    """Return ``mode`` if it is one of :data:`MODES`, else raise a ``ValueError`` naming ``what``.

    Example::

        >>> check_mode("sync", what="first")
        Traceback (most recent call last):
        ...
        ValueError: first must be one of ('bsp', 'asp', 'local'), got 'sync'
    """
    if mode not in MODES:
        raise ValueError(f"{what} must be one of {MODES}, got {mode!r}")
    return cast(Mode, mode)


@runtime_checkable
class ComputeEndMark(Protocol):
    """Told when a rank's local gradients are ready, before any communication (a
    :class:`~lightning_hetero.measurement.ComputeTimer` is one)."""

    def mark_compute_end(self) -> None: ...


@runtime_checkable
class CpuQuotaClock(Protocol):
    """A CPU quota the rank runs under, emulated in process (``SlowdownEmulator(throttle="cfs")`` is one): the clock
    whose advance it charges, and its quota in CPUs now. ``HeteroBatchCallback`` finds one among the Trainer's
    callbacks through this protocol and costs each step at least at the quota's rate.

    Example::

        >>> class Emulated:
        ...     emulates_cpu_quota = True
        ...     cpu_quota = 0.25
        ...     def cpu_clock(self): return 0.0
        >>> isinstance(Emulated(), CpuQuotaClock), isinstance(object(), CpuQuotaClock)
        (True, False)
    """

    #: the CPU time charged against the quota, in seconds
    cpu_clock: Callable[[], float]

    @property
    def emulates_cpu_quota(self) -> bool:
        """Whether the quota is in effect (an emulator of another kind offers none)."""
        ...

    @property
    def cpu_quota(self) -> float | None:
        """The rank's quota in CPUs for the current step (``None``: not throttled now)."""
        ...


@runtime_checkable
class HeteroBatchStrategy(Protocol):
    """What a strategy offers ``HeteroBatchCallback`` to combine unequal local batches itself (instead of the DDP
    communication hook the callback installs on ``strategy="ddp"``)."""

    @property
    def in_lock_step(self) -> bool:
        """Whether the ranks train in lock-step now; ``False`` while asynchronous, when the callback exchanges
        measurements at epoch ends only."""
        ...

    def attach_hetero_batches(self, compute_timer: ComputeEndMark, batch_share: Callable[[], float]) -> None:
        """Called once at fit start: mark ``compute_timer`` as soon as local gradients are ready, and weight this
        rank's gradient by :func:`~lightning_hetero.batch_weighting.gradient_weight` of ``batch_share()`` (its
        ``b_k / sum(b)`` for the current step)."""
        ...


@runtime_checkable
class ModeSwitcher(Protocol):
    """What marks a callback that switches the strategy's mode during training (``SyncSwitchCallback``): its switching
    ``policy``. With one, the mode the strategy starts in is not the only one, so what holds in one mode only (manual
    optimization, mid-epoch validation, a step estimate per rank) does not hold for the run."""

    #: chooses the mode of each epoch (a ``lightning_hetero.switching.policies.SwitchPolicy``)
    policy: object


@runtime_checkable
class SwitchableStrategy(Protocol):
    """What a strategy offers ``SyncSwitchCallback``: its mode, switched in process at epoch boundaries."""

    #: seconds the last effective switch took (``None`` before any)
    last_switch_s: float | None

    @property
    def mode(self) -> Mode: ...

    def set_mode(self, mode: Mode) -> None:
        """Switch to ``mode`` for the next epoch; called on every rank with the same value at an epoch's end."""
        ...


@runtime_checkable
class CompensatedStrategy(Protocol):
    """A strategy that adapts its asynchronous phase's hyper-parameters itself (``None`` turns that off)."""

    asynchrony_compensation: str | None
