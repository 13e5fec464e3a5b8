"""BSP on DDP's reducer: while the ranks train in lock-step, the strategy's model is the LightningModule wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel` as ``DDPStrategy`` wraps it (gradient buckets all-reduced while
backward still runs). ASP and local SGD train the module itself: the wrapper, built the first time BSP is entered,
is set aside, so its forward prepares no all-reduce and broadcasts no buffers there.

The batch-weighted gradient (:mod:`lightning_hetero.batch_weighting`) comes from the loss, as under DDP with
``HeteroBatchCallback``: each rank back-propagates ``N x share`` instead of 1, and DDP's average over the ``N`` ranks
is the big batch's gradient. No Python hook runs per bucket; with equal shares the loss is left untouched.

Example (one process: the weight of an equal share is exactly 1)::

    >>> import torch
    >>> reducer = DDPReducer(torch.nn.Identity(), wrap=repr, install=print, share=lambda: 0.5, world_size=lambda: 2)
    >>> reducer.loss_weight()
    1.0
    >>> reducer.place(lock_step=True)  # the wrapped module (here its repr) becomes the strategy's model
    Identity()
    >>> reducer.place(lock_step=False)
    Identity()
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_hetero.batch_weighting import weight_backward

#: the start of DDP's error for a parameter no loss used (``find_unused_parameters=False``)
UNUSED_PARAMETERS = "Expected to have finished reduction in the prior iteration"


class DDPReducer:
    """Puts the wrapped model in place while BSP trains and the module itself otherwise, and weights BSP's losses.

    Args:
        module: the LightningModule, as the strategy set it up (on its device, converted for the precision).
        wrap: wraps the module in ``DistributedDataParallel`` (``DDPStrategy._setup_model``); called once, by every
            rank together, the first time BSP is entered.
        install: makes its argument the strategy's model.
        share: this rank's batch share ``b_k / sum(b)`` now.
        world_size: the number of ranks.
        on_compute_end: called when this rank's backward has computed every gradient (before DDP waits for its
            all-reduce).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
        install: Callable[[torch.nn.Module], None],
        share: Callable[[], float],
        world_size: Callable[[], int],
        on_compute_end: Callable[[], None] = lambda: None,
    ) -> None:
        self._module, self._wrap, self._install = module, wrap, install
        self._share, self._world_size, self._on_compute_end = share, world_size, on_compute_end
        self._wrapped: torch.nn.Module | None = None
        #: whether the wrapped model is in place (BSP trains now)
        self.placed = False

    def place(self, lock_step: bool) -> None:
        """Make the wrapped module the strategy's model if the mode in force trains in ``lock_step``, the module
        itself otherwise."""
        if lock_step and self._wrapped is None:
            self._wrapped = self._wrap(self._module)
        self._install(self._wrapped if lock_step else self._module)
        self.placed = lock_step

    def loss_weight(self) -> float:
        """What this rank back-propagates from its loss: ``N x share``, exactly 1 for an equal share."""
        weight = self._world_size() * self._share()
        return 1.0 if abs(weight - 1.0) < 1e-12 else weight

    def weight(self, loss: torch.Tensor) -> None:
        """Weight the coming backward from ``loss`` by :meth:`loss_weight` and mark the end of this rank's compute."""
        weight_backward(loss, self.loss_weight(), self._on_compute_end, by="bsp")


def name_the_setting(exception: BaseException) -> None:
    """Rewrite DDP's error for an unused parameter so that it names this strategy's setting."""
    if any(isinstance(arg, str) and UNUSED_PARAMETERS in arg for arg in exception.args):
        exception.args = (
            "AsyncPSStrategy(mode='bsp') trains through DDP's reducer, and a parameter of the LightningModule was not "
            "used to produce the loss of training_step. If that is intended, pass "
            "AsyncPSStrategy(advanced=PSAdvanced(find_unused_parameters=True)), as DDPStrategy takes "
            "find_unused_parameters=True.",
        )
