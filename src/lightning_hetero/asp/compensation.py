"""Asynchrony compensation: hyper-parameters for the parameter server's optimizer so that asynchronous training
moves the model as the user's synchronous (BSP) hyper-parameters would.

Why. With ``N`` workers, BSP makes one update per ``N`` batches (the mean of ``N`` gradients) with the user's
learning rate ``lr`` and momentum ``mu``; heavy-ball momentum carries each gradient ``lr / (1 - mu)`` in total.
ASP applies every worker's gradient as its own update, and each gradient is computed on parameters that are
``tau`` updates old. Mitliagkas et al. ("Asynchrony begets momentum", 2016) show that such staleness acts, in
expectation, like momentum ``1 - 1/N`` with the step divided by ``N``: *implicit momentum*. Momenta compose as
``1 - (1 - a)(1 - b)``, so the user's ``mu`` on top of it gives far more momentum than the user tuned (0.95 for
``mu = 0.9`` and two workers). The compensation lowers the explicit momentum so that explicit and implicit momentum
together equal the user's::

    mu_explicit = max(0, 1 - N_eff * (1 - mu))

and sets the learning rate so that every gradient moves the model by ``1/N`` of what the user's optimizer would
move it by for one BSP update of ``N`` workers' gradients, i.e. per *sample* ASP moves the model as far as BSP does
(BSP applies ``lr`` to the mean of ``N`` gradients), never above the user's learning rate::

    lr_explicit = min(lr, lr * (1 - mu_explicit) / (N * (1 - mu)))

``N`` is the number of training workers; ``N_eff`` is larger with ``overlap_round_trip`` (two gradients in flight
per worker: ``N_eff = 2 N``), which calls for less explicit momentum but leaves a gradient's share of the step at
``1/N``. Where ``N_eff = N`` the learning rate is damped only once the momentum budget is spent
(``N_eff * (1 - mu) > 1``). ``N_eff`` is measured, not assumed:
in steady state the mean staleness of the updates is exactly ``N - 1`` whatever the workers' speeds (each worker
has one gradient in flight; a worker of rate ``r_k`` sees ``sum_{j != k} r_j / r_k`` other updates during one of
its steps), so ``N_eff = 1 + EWMA(staleness)``; it starts at the number of workers and follows workers that stop or
wait (a staleness bound, the end of an epoch).

The rules are derived for heavy-ball momentum, and apply to SGD (``torch.optim.SGD`` and its subclasses). Other
optimizers, adaptive ones such as Adam and AdamW first, keep their momentum (lowering Adam's ``beta1`` does not
shorten a gradient's total step, as ``beta1`` averages with unit gain, and it slowed or broke learning where
measured); only their learning rate is scaled, by :func:`adaptive_lr_factor`.

``mode="dc"`` adds delay-compensated gradients (Zheng et al., "Asynchronous stochastic gradient descent with delay
compensation", ICML 2017, the adaptive variant): ``g + lambda_t * g * g * (w_now - w_stale)`` with
``lambda_t = lambda0 / sqrt(E[g * g])`` elementwise, a first-order Taylor correction of the stale gradient with a
diagonal approximation of the Hessian.

Pure logic: no threads, no torch.distributed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from lightning_hetero._validation import check_range
from lightning_hetero.param_groups import hyperparameters, momentum_key, set_momentum
from lightning_hetero.param_groups import (
    momentum_of as momentum_of,  # re-exported: async_ps/strategy.py imports it here
)

COMPENSATION_MODES = ("auto", "dc")


def check_compensation_mode(mode: str | None) -> None:
    """Fail with an error naming the setting for an unknown mode.

    Example::

        >>> check_compensation_mode("auto"), check_compensation_mode(None)
        (None, None)
        >>> check_compensation_mode("sqrt")
        Traceback (most recent call last):
        ...
        ValueError: asynchrony_compensation must be one of ('auto', 'dc') or None, got 'sqrt'
    """
    if mode is not None and mode not in COMPENSATION_MODES:
        raise ValueError(f"asynchrony_compensation must be one of {COMPENSATION_MODES} or None, got {mode!r}")


def heavy_ball(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is of the family the compensation's rules are derived for: SGD's heavy-ball momentum.

    Example::

        >>> p = [torch.nn.Parameter(torch.zeros(1))]
        >>> heavy_ball(torch.optim.SGD(p, lr=0.1, momentum=0.9)), heavy_ball(torch.optim.AdamW(p))
        (True, False)
    """
    return isinstance(optimizer, torch.optim.SGD)


def adaptive_lr_factor(workers: int) -> float:
    """The learning-rate multiplier for an adaptive optimizer (Adam, AdamW, ...) in ASP with ``workers`` training
    workers: ``1 / sqrt(workers)``. Each update takes one worker's batch, ``workers`` times as many updates as BSP
    makes, and an adaptive step's length does not shrink with its batch; the square-root rule for adaptive
    optimizers (Malladi et al., 2022) sizes the step to the smaller batch. Measured: it kept a small CNN trained with
    AdamW at lr 1e-2 from collapsing in ASP (docs/results.md).

    Example::

        >>> adaptive_lr_factor(1), adaptive_lr_factor(4)
        (1.0, 0.5)
    """
    return 1.0 / math.sqrt(workers)


def compensated_momentum(momentum: float, n_eff: float) -> float:
    """The explicit momentum that, composed with asynchrony's implicit ``1 - 1/n_eff``, gives ``momentum``.

    Args:
        momentum: the user's momentum, in [0, 1).
        n_eff: the effective number of concurrent workers (mean staleness + 1), >= 1.

    Example::

        >>> [round(compensated_momentum(0.9, n), 6) for n in (1, 2, 4, 8, 16)]
        [0.9, 0.8, 0.6, 0.2, 0.0]
    """
    return max(0.0, 1.0 - n_eff * (1.0 - momentum))


def compensated_lr_factor(momentum: float, n_eff: float, averaged: float | None = None) -> float:
    """The learning-rate multiplier that goes with :func:`compensated_momentum`, so that every gradient moves the
    model ``lr / (averaged (1 - momentum))`` in total, as far as its share of a BSP update of ``averaged`` gradients;
    never above 1 (the explicit learning rate never exceeds the user's).

    Args:
        momentum: the user's momentum, in [0, 1).
        n_eff: the effective number of concurrent workers, >= 1.
        averaged: the gradients one BSP update averages (the training workers); ``None``: ``n_eff``. With
            ``overlap_round_trip`` each worker has two gradients in flight, so ``n_eff`` is twice the workers: the
            staleness calls for that much less momentum, but a gradient's share of the step stays ``1 / workers``.

    Example::

        >>> [round(compensated_lr_factor(0.9, n), 6) for n in (2, 8, 16)]
        [1.0, 1.0, 0.625]
        >>> [round(compensated_lr_factor(0.0, n), 6) for n in (1, 2, 4)]
        [1.0, 0.5, 0.25]
        >>> compensated_lr_factor(0.0, 4, averaged=2), compensated_lr_factor(0.9, 4, averaged=2)
        (0.5, 1.0)
    """
    target = n_eff if averaged is None else averaged
    return min(1.0, (1.0 - compensated_momentum(momentum, n_eff)) / (target * (1.0 - momentum)))


class AsynchronyCompensator:
    """Measures the asynchrony (``N_eff`` = 1 + an EWMA of the updates' staleness) and rewrites the server's
    hyper-parameters before each update, see the module docstring for the rules.

    Args:
        mode: ``"auto"`` (momentum and learning-rate compensation) or ``"dc"`` (the same plus delay-compensated
            gradients).
        workers: the number of gradients in flight at once; ``N_eff`` starts at it (and returns to it at
            :meth:`reset`).
        smoothing: EWMA weight of each update's staleness, in (0, 1].
        dc_lambda: ``lambda0`` of the delay compensation (``mode="dc"``), > 0.
        dc_smoothing: EWMA weight of ``g * g`` in the adaptive ``lambda_t``, in (0, 1].
        averaged: the gradients one BSP update averages, the training workers (``None``: ``workers``); sets the
            learning rate (:func:`compensated_lr_factor`).
        heavy_ball: SGD's rules (momentum and learning rate); ``False``: an adaptive optimizer's, the learning rate
            times :func:`adaptive_lr_factor` and nothing else.

    Example::

        >>> compensator = AsynchronyCompensator("auto", workers=2)
        >>> group = {"lr": 0.1, "momentum": 0.9}
        >>> compensator.apply([group])
        >>> round(group["momentum"], 6), round(group["lr"], 6), compensator.n_eff
        (0.8, 0.1, 2.0)
        >>> for _ in range(400):
        ...     compensator.observe(3)  # the updates turn out 3 versions stale: four workers' worth
        >>> group = {"lr": 0.1, "momentum": 0.9}
        >>> compensator.apply([group])
        >>> round(compensator.n_eff, 2), round(group["momentum"], 2)
        (4.0, 0.6)
    """

    def __init__(
        self,
        mode: str,
        workers: int,
        smoothing: float = 0.02,
        dc_lambda: float = 2.0,
        dc_smoothing: float = 0.05,
        averaged: int | None = None,
        heavy_ball: bool = True,
    ) -> None:
        check_compensation_mode(mode)
        if mode is None:
            raise ValueError("AsynchronyCompensator needs a mode; use no compensator for None")
        check_range("workers", workers, low=1, integer=True)
        check_range("smoothing", smoothing, low=0, high=1, low_open=True)
        check_range("dc_lambda", dc_lambda, low=0, low_open=True)
        check_range("dc_smoothing", dc_smoothing, low=0, high=1, low_open=True)
        check_range("averaged", averaged, low=1, integer=True, optional=True)
        self.mode = mode
        self.averaged = averaged
        self.heavy_ball = heavy_ball
        self.workers = workers
        self.smoothing = smoothing
        self.dc_lambda = dc_lambda
        self.dc_smoothing = dc_smoothing
        self.mean_staleness = float(workers - 1)
        #: the first param group's momentum (or beta1; ``None`` without either) and learning rate as last applied
        self.momentum_effective: float | None = None
        self.lr_effective: float | None = None
        self._square_mean: torch.Tensor | None = None

    @property
    def n_eff(self) -> float:
        """The effective number of concurrent workers: mean staleness + 1."""
        return 1.0 + self.mean_staleness

    @property
    def delay_compensation(self) -> bool:
        return self.mode == "dc"

    def reset(self) -> None:
        """Forget the measured staleness (a new asynchronous phase starts with all workers)."""
        self.mean_staleness = float(self.workers - 1)

    def observe(self, staleness: int) -> None:
        """Account one applied update's staleness.

        Args:
            staleness: versions between the worker's pull and the update's application.
        """
        self.mean_staleness += self.smoothing * (staleness - self.mean_staleness)

    def apply(self, groups: list[dict[str, Any]]) -> None:
        """Rewrite the param groups' momentum (or ``beta1``) and learning rate in place; the groups hold the user's
        values on entry. The first group's results are kept in :attr:`momentum_effective` and :attr:`lr_effective`.

        Args:
            groups: param groups' hyper-parameters (``lr``, and ``momentum`` or ``betas``).
        """
        if not self.heavy_ball:
            factor = adaptive_lr_factor(self.averaged or self.workers)
            for group in groups:
                group["lr"] = group["lr"] * factor
            self.momentum_effective, self.lr_effective = momentum_of(groups[0]), float(groups[0]["lr"])
            return
        for index, group in enumerate(groups):
            key = momentum_key(group)
            user = momentum_of(group) or 0.0
            momentum = compensated_momentum(user, self.n_eff)
            set_momentum(group, momentum)
            factor = compensated_lr_factor(user, self.n_eff, self.averaged)
            if factor != 1.0:
                group["lr"] = group["lr"] * factor
            if index == 0:
                self.momentum_effective = momentum if key is not None else None
                self.lr_effective = float(group["lr"])

    def compensate_delay(self, grad: torch.Tensor, params_now: torch.Tensor, params_stale: torch.Tensor) -> None:
        """Correct a stale gradient in place: ``g + lambda_t g g (w_now - w_stale)`` (``mode="dc"`` only).

        Args:
            grad: the flat gradient, computed on ``params_stale``.
            params_now: the server's parameters now.
            params_stale: the parameters the gradient was computed on.

        Example::

            >>> compensator = AsynchronyCompensator("dc", workers=2, dc_lambda=1.0, dc_smoothing=1.0)
            >>> grad = torch.tensor([2.0, -1.0])
            >>> compensator.compensate_delay(grad, torch.tensor([1.0, 1.0]), torch.tensor([0.5, 1.0]))
            >>> grad.tolist()  # lambda_t = 1 / |g|: g + |g| (w_now - w_stale)
            [3.0, -1.0]
        """
        square = grad * grad
        if self._square_mean is None or self._square_mean.shape != grad.shape:
            self._square_mean = square.clone()
        else:
            self._square_mean.lerp_(square, self.dc_smoothing)
        scale = self.dc_lambda / self._square_mean.sqrt().clamp_min(1e-12)
        grad.add_(scale * square * (params_now - params_stale))


def unsupported_reason(optimizer: torch.optim.Optimizer) -> str | None:
    """Why the compensation leaves ``optimizer``'s hyper-parameters as they are (``None`` when it adapts them): a
    learning rate that is not a plain float.

    Example::

        >>> p = [torch.nn.Parameter(torch.zeros(1))]
        >>> unsupported_reason(torch.optim.SGD(p, lr=0.1, momentum=0.9)) is None
        True
        >>> unsupported_reason(torch.optim.SGD(p, lr=torch.tensor(0.1)))
        "SGD has no plain float 'lr': its hyper-parameters are left unchanged"
    """
    if any(isinstance(group["lr"], torch.Tensor) for group in optimizer.param_groups):
        return f"{type(optimizer).__name__} has no plain float 'lr': its hyper-parameters are left unchanged"
    return None


class Compensation:
    """The strategy's ``asynchrony_compensation`` setting and the compensator it gives the server.

    Args:
        mode: ``"auto"``, ``"dc"`` or ``None``.
        workers: the training workers and the gradients in flight at once in ASP, twice as many with
            ``overlap_round_trip`` (read when a compensator is built; :func:`~lightning_hetero.asp.placement.concurrency`).
        optimizer: the user's optimizer (the compensator starts from its hyper-parameters).

    Example::

        >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
        >>> compensation = Compensation("auto", lambda: (2, 4), lambda: sgd)
        >>> compensation.new().mode, compensation.new().n_eff, Compensation(None, lambda: (2, 2), lambda: sgd).new()
        ('auto', 4.0, None)
        >>> adam = torch.optim.Adam(sgd.param_groups[0]["params"], lr=0.01)
        >>> Compensation("auto", lambda: (4, 4), lambda: adam).new().heavy_ball
        False
    """

    def __init__(
        self,
        mode: str | None,
        workers: Callable[[], tuple[int, int]],
        optimizer: Callable[[], torch.optim.Optimizer],
    ) -> None:
        check_compensation_mode(mode)
        self.mode = mode
        self._workers = workers
        self._optimizer = optimizer

    def new(self) -> AsynchronyCompensator | None:
        """A compensator for the current mode (``None`` for none, and for ``"auto"`` with an optimizer that is not
        SGD: :func:`unsupported_reason`)."""
        optimizer = self._optimizer()
        if self.mode is None or unsupported_reason(optimizer) is not None:
            return None
        training, in_flight = self._workers()
        compensator = AsynchronyCompensator(
            self.mode, workers=in_flight, averaged=training, heavy_ball=heavy_ball(optimizer)
        )
        compensator.apply([hyperparameters(group) for group in optimizer.param_groups])
        return compensator

    def set(self, mode: str | None, server: Any) -> None:
        """Change the mode; a running ``server`` (a :class:`~lightning_hetero.asp.server.ParameterServer`) takes the
        new compensator at its next update."""
        check_compensation_mode(mode)
        self.mode = mode
        if server is not None:
            with server.cond:
                server.compensator = self.new()
