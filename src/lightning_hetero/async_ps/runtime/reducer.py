"""BSP on DDP's reducer: while the ranks train in lock-step, the strategy's model is the LightningModule wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel` as ``DDPStrategy`` wraps it (gradient buckets all-reduced while
backward still runs). ASP and local SGD train the module itself: the wrapper, built the first time BSP is entered,
is set aside, so its forward prepares no all-reduce and broadcasts no buffers there.

The batch-weighted gradient (:mod:`lightning_hetero.batch_weighting`) comes from the loss, as under DDP with
``HeteroBatchCallback``: each rank back-propagates ``N x share`` instead of 1, and DDP's average over the ``N`` ranks
is the big batch's gradient. No Python hook runs per bucket; with equal shares the loss is left untouched.

Example::

    >>> import torch
    >>> from lightning_hetero.async_ps.runtime.context import BatchWeighting
    >>> reducer = DDPReducer(torch.nn.Identity(), wrap=repr, install=print, weighting=BatchWeighting(lambda: 2))
    >>> reducer.place(lock_step=True)  # the wrapped module (here its repr) becomes the strategy's model
    Identity()
    >>> reducer.place(lock_step=False)
    Identity()
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_hetero.async_ps.runtime.context import BatchWeighting
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
        weighting: this rank's loss weight (``N x share``) and compute-end mark, called when this rank's backward has
            computed every gradient (before DDP waits for its all-reduce).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
        install: Callable[[torch.nn.Module], None],
        weighting: BatchWeighting,
    ) -> None:
        self._module, self._wrap, self._install, self._weighting = module, wrap, install, weighting
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

    def weight(self, loss: torch.Tensor) -> None:
        """Weight the coming backward from ``loss`` by ``N x share`` and mark the end of this rank's compute."""
        weighting = self._weighting
        weight_backward(loss, weighting.loss_weight(), weighting.mark_compute_end, by="bsp")


def name_the_setting(exception: BaseException) -> None:
    """Rewrite DDP's error for an unused parameter so that it names this strategy's setting."""
    if any(isinstance(arg, str) and UNUSED_PARAMETERS in arg for arg in exception.args):
        exception.args = (
            "AsyncPSStrategy(mode='bsp') trains through DDP's reducer, and a parameter of the LightningModule was not "
            "used to produce the loss of training_step. If that is intended, pass "
            "AsyncPSStrategy(advanced=PSAdvanced(find_unused_parameters=True)), as DDPStrategy takes "
            "find_unused_parameters=True.",
        )
