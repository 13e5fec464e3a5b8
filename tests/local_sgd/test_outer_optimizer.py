import pytest
import torch

from lightning_hetero.local_sgd.outer_optimizer import DEFAULT_OUTER_KWARGS, OuterOptimizer


def test_default_is_plain_averaging():
    """DiLoCo's Nesterov outer step lost 5-8 points in 4-epoch runs; averaging kept BSP's accuracy (issue 25)."""
    outer = OuterOptimizer()
    assert outer.optimizer_class is torch.optim.SGD
    assert outer.kwargs == {"lr": 1.0} == DEFAULT_OUTER_KWARGS
    anchor = torch.tensor([1.0, 2.0])
    outer.bind(anchor)
    outer.step(torch.tensor([0.25, -0.5]))  # the mean of the ranks' parameters: anchor - mean pseudo-gradient
    assert torch.equal(anchor, torch.tensor([0.75, 2.5]))


def test_steps_match_torch_nesterov_sgd_on_the_same_gradients():
    anchor = torch.tensor([1.0, -2.0, 3.0])
    reference = torch.nn.Parameter(anchor.clone())
    torch_sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    outer = OuterOptimizer(torch.optim.SGD, {"lr": 0.7, "momentum": 0.9, "nesterov": True})
    outer.bind(anchor)
    for pseudo in (torch.tensor([0.1, 0.2, -0.3]), torch.tensor([0.05, -0.1, 0.0]), torch.tensor([1.0, 1.0, 1.0])):
        outer.step(pseudo)
        reference.grad = pseudo.clone()
        torch_sgd.step()
        assert torch.allclose(anchor, reference.detach())
    assert anchor.grad is None


def test_any_optimizer_class_with_kwargs():
    anchor = torch.zeros(2)
    outer = OuterOptimizer(torch.optim.Adam, {"lr": 0.1})
    outer.bind(anchor)
    outer.step(torch.tensor([1.0, -1.0]))
    assert torch.allclose(anchor, torch.tensor([-0.1, 0.1]))


def test_explicit_class_without_kwargs_uses_its_own_defaults():
    assert OuterOptimizer(torch.optim.Adam).kwargs == {}


@pytest.mark.parametrize(
    ("optimizer_class", "kwargs", "match"),
    [
        (torch.optim.SGD, {"lr": 0.7, "momentum": 0.9, "nesterov": True, "betas": (0.9, 0.99)}, "betas"),
        (torch.optim.SGD, {"lr": 0.7, "momentum": 0.0, "nesterov": True}, "Nesterov"),
        (torch.optim.Adam, {"lr": -1.0}, "learning rate"),
        (lambda params, **kw: object(), {}, "not a torch.optim.Optimizer"),
    ],
)
def test_an_optimizer_that_cannot_be_built_fails_at_construction_naming_the_setting(optimizer_class, kwargs, match):
    with pytest.raises(ValueError, match="outer_optimizer") as info:
        OuterOptimizer(optimizer_class, kwargs)
    assert "outer_optimizer_kwargs" in str(info.value)
    assert match in str(info.value)


def test_not_callable_is_refused():
    with pytest.raises(ValueError, match=r"outer_optimizer must be a torch\.optim\.Optimizer class"):
        OuterOptimizer("sgd")  # type: ignore[arg-type]


def test_step_before_bind_fails():
    with pytest.raises(RuntimeError, match="before bind"):
        OuterOptimizer().step(torch.zeros(1))


def test_state_round_trip_continues_the_momentum():
    pseudo = [torch.tensor([0.3, -0.2]), torch.tensor([0.1, 0.1]), torch.tensor([-0.2, 0.4])]
    uninterrupted = OuterOptimizer()
    a = torch.zeros(2)
    uninterrupted.bind(a)
    for g in pseudo:
        uninterrupted.step(g)

    first = OuterOptimizer()
    b = torch.zeros(2)
    first.bind(b)
    first.step(pseudo[0])
    state = first.state_dict()
    resumed = OuterOptimizer()
    assert resumed.state_dict() == {}
    resumed.load_state_dict(state)  # before bind: applied at bind
    assert resumed.state_dict() == state
    c = b.clone()
    resumed.bind(c)
    for g in pseudo[1:]:
        resumed.step(g)
    assert torch.allclose(a, c)
