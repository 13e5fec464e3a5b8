"""The elastic strategies' expert knobs (:class:`ElasticLocalSGDAdvanced`, :class:`ElasticHeteroBatchAdvanced`), and
their old keywords and attributes, taken in with a ``DeprecationWarning`` for one release (:func:`old_keywords`,
:func:`moved_attribute`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from lightning_hetero._deprecation import moved_keywords, warn_renamed
from lightning_hetero._validation import check_range
from lightning_hetero.elastic.connection import moved_attribute as moved_connection_attribute
from lightning_hetero.local_sgd.rounds import check_weighting

#: local steps per worker and round unless ``round_length`` says otherwise
DEFAULT_ROUND_LENGTH = 16

OWNER = "ElasticLocalSGDStrategy"


@dataclass(frozen=True)
class ElasticLocalSGDAdvanced:
    """Expert knobs of :class:`~lightning_hetero.elastic.ElasticLocalSGDStrategy`, given as its ``advanced=``: every
    guide's example runs with their defaults.

    Args:
        pseudo_gradient_weighting: ``"mean"`` (the workers that trained in the round count equally, as in
            ``AsyncPSStrategy(mode="local")``, whose measurements chose it) or ``"samples"`` (weighted by the samples
            each trained).
        startup_timeout_s: how long a starting worker waits for the lighthouse to accept connections.
        join_timeout_s: after a worker was lost, how long the hosted lighthouse waits for the live workers that
            have not reached the round end before it forms the round without them (they rejoin at the next one).
            Far below ``round_timeout_s`` (a live worker can be stuck in the collective the lost one broke) and
            longer than a round (a worker waiting longer than this for the round end splits the round, see
            ``docs/elastic.md``).
        heartbeat_timeout_s: a worker silent this long is dropped (hosted lighthouse), and the lighthouse
            unreachable this long during a round end ends the worker with an error naming it.

    Raises:
        ValueError: a knob is out of range, naming it.

    Example::

        >>> ElasticLocalSGDAdvanced(join_timeout_s=10.0).join_timeout_s
        10.0
        >>> ElasticLocalSGDAdvanced(heartbeat_timeout_s=0)
        Traceback (most recent call last):
        ...
        ValueError: heartbeat_timeout_s must be > 0, got 0
    """

    pseudo_gradient_weighting: str = "mean"
    startup_timeout_s: float = 30.0
    join_timeout_s: float = 5.0
    heartbeat_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        check_weighting(self.pseudo_gradient_weighting)
        for name in ("startup_timeout_s", "join_timeout_s", "heartbeat_timeout_s"):
            check_range(name, getattr(self, name), low=0, low_open=True)


@dataclass(frozen=True)
class ElasticHeteroBatchAdvanced:
    """Expert knobs of :class:`~lightning_hetero.elastic.ElasticHeteroBatchStrategy`, given as its ``advanced=``:
    every guide's example runs with their defaults.

    Args:
        startup_timeout_s: how long a starting worker waits for the lighthouse to accept connections.
        join_timeout_s: after a worker was lost, how long the hosted lighthouse waits for live workers that have not
            reached the step's quorum before it forms the step without them (longer than a step, below
            ``step_timeout_s``).
        heartbeat_timeout_s: a worker silent this long is dropped (hosted lighthouse), and the lighthouse
            unreachable this long during a quorum ends the worker with an error naming it.

    Raises:
        ValueError: a knob is out of range, naming it.

    Example::

        >>> ElasticHeteroBatchAdvanced(join_timeout_s=0)
        Traceback (most recent call last):
        ...
        ValueError: join_timeout_s must be > 0, got 0
    """

    startup_timeout_s: float = 30.0
    join_timeout_s: float = 2.0
    heartbeat_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("startup_timeout_s", "join_timeout_s", "heartbeat_timeout_s"):
            check_range(name, getattr(self, name), low=0, low_open=True)


def sync_old_keywords(
    advanced: ElasticHeteroBatchAdvanced | None, kwargs: dict[str, Any]
) -> tuple[ElasticHeteroBatchAdvanced, dict[str, Any]]:
    """``advanced`` (default: :class:`ElasticHeteroBatchAdvanced`'s defaults) with ``ElasticHeteroBatchStrategy``'s
    deprecated keywords among its ``kwargs`` taken in (the expert knobs' own), each with a warning; and the other
    ``kwargs``, ``SingleDeviceStrategy``'s.

    Raises:
        TypeError: an old keyword given with ``advanced``.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     warnings.simplefilter("always")
        ...     sync_old_keywords(None, {"join_timeout_s": 1.0, "checkpoint_io": None})
        (ElasticHeteroBatchAdvanced(startup_timeout_s=30.0, join_timeout_s=1.0, heartbeat_timeout_s=2.0), {'checkpoint_io': None})
    """
    knobs = {knob.name for knob in fields(ElasticHeteroBatchAdvanced)}
    old = {name: value for name, value in kwargs.items() if name in knobs}
    rest = {name: value for name, value in kwargs.items() if name not in knobs}
    return moved_keywords("ElasticHeteroBatchStrategy", ElasticHeteroBatchAdvanced, knobs, advanced, old), rest


def old_keywords(
    round_length: int, advanced: ElasticLocalSGDAdvanced | None, kwargs: dict[str, Any]
) -> tuple[int, ElasticLocalSGDAdvanced, dict[str, Any]]:
    """``round_length`` and ``advanced`` (default: :class:`ElasticLocalSGDAdvanced`'s defaults) with the deprecated
    keywords among the strategy's ``kwargs`` taken in (``steps_per_round``, ``round_length``'s old name, and the
    expert knobs' own), each with a warning; and the other ``kwargs``, ``SingleDeviceStrategy``'s.

    Raises:
        TypeError: an old keyword given with its new place.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     old_keywords(16, None, {"steps_per_round": 8, "join_timeout_s": 9.0, "checkpoint_io": None})
        (8, ElasticLocalSGDAdvanced(pseudo_gradient_weighting='mean', startup_timeout_s=30.0, join_timeout_s=9.0, heartbeat_timeout_s=2.0), {'checkpoint_io': None})
        >>> [str(warning.message).split("; ")[1] for warning in caught]
        ['use ElasticLocalSGDStrategy(round_length=...)', 'use ElasticLocalSGDStrategy(advanced=ElasticLocalSGDAdvanced(join_timeout_s=...))']
    """
    knobs = {knob.name for knob in fields(ElasticLocalSGDAdvanced)}
    old = {name: value for name, value in kwargs.items() if name in knobs}
    rest = {name: value for name, value in kwargs.items() if name not in knobs and name != "steps_per_round"}
    if "steps_per_round" in kwargs:
        if round_length != DEFAULT_ROUND_LENGTH:
            raise TypeError(f"{OWNER}: give round_length only (steps_per_round is its deprecated old name)")
        round_length = kwargs["steps_per_round"]
        warn_renamed(f"{OWNER}(steps_per_round=...)", f"{OWNER}(round_length=...)", stacklevel=4)
    return round_length, moved_keywords(OWNER, ElasticLocalSGDAdvanced, knobs, advanced, old), rest


def moved_attribute(strategy: Any, name: str) -> Any:
    """``strategy.name`` for a former attribute, read where it now lives with a ``DeprecationWarning``:
    ``steps_per_round`` (``round_length``), ``pseudo_gradient_weighting`` (``advanced``), and the connection's
    settings (:func:`~lightning_hetero.elastic.connection.moved_attribute`); for the strategy's ``__getattr__``.

    Raises:
        AttributeError: ``name`` never was one.
    """
    owned = vars(strategy)
    if name == "steps_per_round" and "round_length" in owned:
        warn_renamed(f"{OWNER}.steps_per_round", f"{OWNER}.round_length")
        return owned["round_length"]
    if name == "pseudo_gradient_weighting" and "advanced" in owned:
        warn_renamed(f"{OWNER}.{name}", f"{OWNER}.advanced.{name}")
        return owned["advanced"].pseudo_gradient_weighting
    return moved_connection_attribute(strategy, name, "round_timeout_s")
