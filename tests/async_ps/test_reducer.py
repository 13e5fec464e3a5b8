"""BSP's reducer: the wrapped model in place only while BSP trains, built once; the loss weighted so that DDP's
average is the batch-weighted gradient; DDP's unused-parameter error names this strategy's setting."""

from types import SimpleNamespace

import pytest
import torch

from lightning_hetero.async_ps.runtime.context import BatchWeighting
from lightning_hetero.async_ps.runtime.reducer import UNUSED_PARAMETERS, DDPReducer, name_the_setting


def reducer(share: float = 0.5, world_size: int = 2, marks: list | None = None) -> tuple[DDPReducer, list, list]:
    installed: list = []
    wraps: list = []

    def wrap(module):
        wraps.append(module)
        return ("wrapped", module)

    weighting = BatchWeighting(world_size=lambda: world_size)
    weighting.attach(SimpleNamespace(mark_compute_end=lambda: marks.append("end")) if marks is not None else None,
                     lambda: share)  # fmt: skip
    return DDPReducer(torch.nn.Linear(2, 1), wrap, installed.append, weighting), installed, wraps


def test_the_wrapper_is_built_once_at_bsps_first_entry_and_set_aside_otherwise():
    new, installed, wraps = reducer()
    new.place(lock_step=False)  # ASP first: nothing wrapped
    assert wraps == [] and installed == [new._module] and not new.placed
    new.place(lock_step=True)
    new.place(lock_step=False)
    new.place(lock_step=True)
    assert len(wraps) == 1 and installed[1] == installed[3] == ("wrapped", new._module) and new.placed
    assert installed[2] is new._module


@pytest.mark.parametrize("world_size", [2, 3, 7, 12])
def test_an_equal_share_leaves_the_loss_untouched(world_size):
    weighting = BatchWeighting(world_size=lambda: world_size)
    assert weighting.loss_weight() == 1.0  # without HeteroBatchCallback
    weighting.attach(None, lambda: 1 / world_size)
    assert weighting.loss_weight() == 1.0


def test_the_weighted_losses_average_to_the_big_batch_gradient():
    # ranks with 3 and 13 samples: DDP averages N x share x g_k over N ranks
    w = torch.ones(2, requires_grad=True)
    x = [torch.randn(3, 2), torch.randn(13, 2)]
    grads = []
    for data in x:
        marks: list = []
        new, _, _ = reducer(share=len(data) / 16, world_size=2, marks=marks)
        loss = (data @ w).pow(2).mean()
        new.weight(loss)
        new.weight(loss)  # weighted once, however often asked
        (grad,) = torch.autograd.grad(loss, w)
        grads.append(grad)
        assert marks == ["end"]
    big = torch.autograd.grad((torch.cat(x) @ w).pow(2).mean(), w)[0]
    torch.testing.assert_close(sum(grads) / 2, big)


def test_ddps_unused_parameter_error_names_the_strategys_setting():
    error = RuntimeError(f"{UNUSED_PARAMETERS} before starting a new one. This error indicates ...")
    name_the_setting(error)
    assert "PSAdvanced(find_unused_parameters=True)" in str(error)
    other = RuntimeError("something else")
    name_the_setting(other)
    assert str(other) == "something else"
