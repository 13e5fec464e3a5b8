"""Per-phase hyper-parameters: what the learning rate and momentum are in BSP and in ASP, and how momentum is
ramped back up after a switch.

Sync-Switch found that a switch needs its hyper-parameters adjusted: the learning rate when the effective batch per
update changes (it saw NaN losses otherwise), and momentum, where "ramped" momentum (scaled down at the switch,
then restored) was the best variant it tried. Asynchrony itself acts like extra momentum, which is why momentum is
lowered when entering ASP.

:class:`PhaseHyperparams` describes one phase; :class:`PhaseHyperparamController` applies them to optimizers'
param groups and schedulers, with no Trainer involved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hetero._deprecation import renamed_attributes
from lightning_hetero._validation import check_range
from lightning_hetero.contracts import check_mode
from lightning_hetero.param_groups import momentum_of, scale_learning_rates, set_momentum


@dataclass(frozen=True)
class PhaseHyperparams:
    """Hyper-parameter overrides for the epochs trained in one mode.

    Args:
        lr_scale: multiplies the learning rate the optimizer and its schedulers would otherwise use, > 0. Relative,
            so that it composes with any LR schedule (and with ``HeteroBatchCallback``'s batch-size scaling).
        momentum: the momentum in this phase (SGD's ``momentum``, or Adam's first beta), in [0, 1); ``None`` keeps
            the optimizer's own.
        momentum_ramp_steps: after a switch into this phase, momentum starts at ``momentum_ramp_start`` times its
            value and returns to it linearly over this many optimizer steps; 0 disables the ramp.
        momentum_ramp_start: the fraction of the phase's momentum used on the first step after the switch, in [0, 1].

    Example::

        >>> asp = PhaseHyperparams(lr_scale=0.5, momentum_ramp_steps=4, momentum_ramp_start=0.5)
        >>> [asp.momentum_factor(step) for step in range(6)]
        [0.5, 0.625, 0.75, 0.875, 1.0, 1.0]
    """

    lr_scale: float = 1.0
    momentum: float | None = None
    momentum_ramp_steps: int = 0
    momentum_ramp_start: float = 0.0

    def __post_init__(self) -> None:
        check_range("lr_scale", self.lr_scale, low=0, low_open=True)
        check_range("momentum", self.momentum, low=0, high=1, high_open=True, optional=True)
        check_range("momentum_ramp_steps", self.momentum_ramp_steps, low=0, integer=True)
        check_range("momentum_ramp_start", self.momentum_ramp_start, low=0, high=1)

    def momentum_factor(self, steps_since_switch: int) -> float:
        """The fraction of this phase's momentum to use ``steps_since_switch`` steps after a switch into it."""
        if self.momentum_ramp_steps == 0 or steps_since_switch >= self.momentum_ramp_steps:
            return 1.0
        progress = steps_since_switch / self.momentum_ramp_steps
        return self.momentum_ramp_start + (1.0 - self.momentum_ramp_start) * progress


_DEFAULT = PhaseHyperparams()


class PhaseHyperparamController:
    """Applies :class:`PhaseHyperparams` to optimizers and LR schedulers as the mode changes.

    Learning rates are rescaled by the ratio of the new phase's ``lr_scale`` to the old one's, in the param groups
    (``lr`` and ``initial_lr``) and in the schedulers' ``base_lrs``, so a schedule goes on from where it was.
    Momentum is set on every step while a ramp is running and once at the start of a phase otherwise.

    Args:
        phases: overrides per mode (``"bsp"``, ``"asp"``), as :class:`PhaseHyperparams` or as a mapping of its
            arguments (handy in YAML configs); a mode not listed keeps the optimizer's own values.

    Example::

        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
        >>> controller = PhaseHyperparamController(
        ...     {"asp": PhaseHyperparams(lr_scale=0.5, momentum_ramp_steps=2, momentum_ramp_start=0.0)})
        >>> controller.bind([opt], [])
        >>> controller.enter("bsp", switched=False)
        >>> controller.enter("asp", switched=True)
        >>> lrs_and_momenta = []
        >>> for _ in range(3):
        ...     controller.before_optimizer_step()
        ...     lrs_and_momenta.append((opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]))
        >>> lrs_and_momenta
        [(0.05, 0.0), (0.05, 0.45), (0.05, 0.9)]
    """

    def __init__(self, phases: Mapping[str, PhaseHyperparams | Mapping[str, Any]] | None = None) -> None:
        self.phases: dict[str, PhaseHyperparams] = {}
        for mode, params in (phases or {}).items():
            check_mode(mode, "a key of hyperparams")
            if isinstance(params, Mapping):
                params = PhaseHyperparams(**params)
            if not isinstance(params, PhaseHyperparams):
                raise TypeError(
                    f"hyperparams[{mode!r}] must be a PhaseHyperparams or a mapping of its arguments, "
                    f"got {type(params).__name__}"
                )
            self.phases[mode] = params
        self.mode: str | None = None
        self.steps_since_switch = 0
        self.ramping = False
        self.base_momenta: list[list[float | None]] | None = None
        self._optimizers: list[Any] = []
        self._schedulers: list[Any] = []

    def _params(self, mode: str | None) -> PhaseHyperparams:
        return _DEFAULT if mode is None else self.phases.get(mode, _DEFAULT)

    def bind(self, optimizers: Sequence[Any], schedulers: Iterable[Any]) -> None:
        """Attach to the optimizers (and their schedulers) to control. Momentum baselines are read now, unless
        they were restored by :meth:`load_state_dict`."""
        self._optimizers = list(optimizers)
        self._schedulers = list(schedulers)
        if self.base_momenta is None:
            self.base_momenta = [[momentum_of(group) for group in opt.param_groups] for opt in self._optimizers]
        if self._touches_momentum() and any(m is None for momenta in self.base_momenta for m in momenta):
            raise ValueError(
                "hyperparams set or ramp momentum, but an optimizer param group has neither 'momentum' nor 'betas'"
            )

    def enter(self, mode: str, switched: bool) -> None:
        """Apply ``mode``'s hyper-parameters; ``switched`` says whether this is a change of mode (and so starts the
        momentum ramp) rather than the first phase of a run."""
        check_mode(mode)
        old, new = self._params(self.mode), self._params(mode)
        factor = new.lr_scale / old.lr_scale
        scale_learning_rates(self._optimizers, self._schedulers, factor)
        self.mode = mode
        self.ramping = switched and new.momentum_ramp_steps > 0
        self.steps_since_switch = 0
        self._apply_momentum()

    def before_optimizer_step(self) -> None:
        """Set the momentum for the coming optimizer step (only needed while a ramp runs)."""
        if not self.ramping:
            return
        self._apply_momentum()
        if self.steps_since_switch >= self._params(self.mode).momentum_ramp_steps:
            self.ramping = False
        else:
            self.steps_since_switch += 1

    def current_momentum_factor(self) -> float:
        """The ramp's current fraction of the phase's momentum (1.0 when no ramp runs)."""
        return self._params(self.mode).momentum_factor(self.steps_since_switch) if self.ramping else 1.0

    def _apply_momentum(self) -> None:
        # Untouched unless some phase overrides or ramps momentum; then leaving that phase restores the base value.
        if not self._touches_momentum():
            return
        params = self._params(self.mode)
        assert self.base_momenta is not None
        factor = self.current_momentum_factor()
        for optimizer, momenta in zip(self._optimizers, self.base_momenta, strict=True):
            for group, base in zip(optimizer.param_groups, momenta, strict=True):
                target = params.momentum if params.momentum is not None else base
                if target is not None:
                    set_momentum(group, target * factor)

    def _touches_momentum(self) -> bool:
        return any(p.momentum is not None or p.momentum_ramp_steps for p in self.phases.values())

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "steps_since_switch": self.steps_since_switch,
            "ramping": self.ramping,
            "base_momenta": self.base_momenta,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mode = state["mode"]
        self.steps_since_switch = state["steps_since_switch"]
        self.ramping = state["ramping"]
        self.base_momenta = state["base_momenta"]


class LRScheduleClock:
    """Keeps step-interval learning-rate schedules on an epoch footing when the steps per epoch change with the mode.

    A schedule written in optimizer steps assumes a fixed number of steps per epoch. In BSP every rank makes the
    same number of steps per epoch; in ASP a fast worker makes more and a slow one fewer (and the server makes one
    update per worker step), so a schedule stepped once per local step would run ahead on fast ranks and lag on
    slow ones. The clock instead advances schedules by exactly ``steps_per_epoch`` reference steps per epoch (the
    steps of a BSP epoch), spread over the local steps a rank expects to make in the epoch, with any remainder
    caught up at the epoch's end. Every rank's schedule is therefore at the same point at every epoch boundary.

    Args:
        steps_per_epoch: reference steps per epoch; ``None`` measures it at the end of the first epoch (and uses
            one reference step per local step until then).

    Example::

        >>> clock = LRScheduleClock(steps_per_epoch=4)
        >>> clock.begin_epoch(0, expected_local_steps=4)  # BSP: one reference step per step
        >>> [clock.step() for _ in range(4)], clock.end_epoch()
        ([1, 1, 1, 1], 0)
        >>> clock.begin_epoch(1, expected_local_steps=8)  # ASP on a fast rank: half a step per step
        >>> [clock.step() for _ in range(8)], clock.end_epoch(), clock.taken
        ([0, 1, 0, 1, 0, 1, 0, 1], 0, 8)
        >>> clock.begin_epoch(2, expected_local_steps=8)  # ... which made only 2 steps this time
        >>> [clock.step() for _ in range(2)], clock.end_epoch(), clock.taken
        ([0, 1], 3, 12)
    """

    def __init__(self, steps_per_epoch: int | None = None) -> None:
        check_range("steps_per_epoch", steps_per_epoch, low=1, integer=True, optional=True)
        self.steps_per_epoch = steps_per_epoch
        self.taken = 0
        self._epoch = 0
        self._rate = 1.0
        self._position = 0.0

    def begin_epoch(self, epoch: int, expected_local_steps: float | None) -> None:
        """Start ``epoch``, in which this rank expects to make ``expected_local_steps`` steps (``None``: unknown)."""
        self._epoch = epoch
        reference = self.steps_per_epoch
        self._rate = reference / expected_local_steps if reference and expected_local_steps else 1.0
        self._position = float(self.taken)

    def step(self) -> int:
        """One local step was made; return how many reference steps to advance the schedules by now."""
        self._position += self._rate
        target = math.floor(self._position + 1e-9)
        if self.steps_per_epoch is not None:
            target = min(target, (self._epoch + 1) * self.steps_per_epoch)
        return self._advance_to(target)

    def end_epoch(self, measured_steps_per_epoch: int | None = None) -> int:
        """The epoch ended; return the reference steps still due. ``measured_steps_per_epoch`` (the mean local
        steps per rank) fixes the reference when it was not given."""
        if self.steps_per_epoch is None:
            if measured_steps_per_epoch is None or measured_steps_per_epoch < 1:
                return 0
            self.steps_per_epoch = measured_steps_per_epoch
        return self._advance_to((self._epoch + 1) * self.steps_per_epoch)

    def _advance_to(self, target: int) -> int:
        due = max(0, target - self.taken)
        self.taken += due
        return due

    def state_dict(self) -> dict[str, Any]:
        return {"steps_per_epoch": self.steps_per_epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_per_epoch = state["steps_per_epoch"]
        self.taken = state["taken"]


# renamed in issue 13; the old name goes in the next release
__getattr__ = renamed_attributes(__name__, {"StepScheduleClock": ("LRScheduleClock", LRScheduleClock)})
