import pytest
import torch

from lightning_hetero.asp.server_optimizer import IMPLEMENTATION_KEYS, clone_optimizer, fast_clone_optimizer


def test_a_parameter_outside_the_model_is_refused():
    stray = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="not trainable parameters"):
        clone_optimizer(torch.optim.SGD([stray], lr=0.1), [], {})


def test_a_frozen_parameter_of_the_model_is_left_out_of_the_servers_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].requires_grad_(False)  # the user passes model.parameters() anyway, as DDP allows
    trainable = [p for p in model.parameters() if p.requires_grad]
    copies = [p.detach().clone() for p in trainable]
    clone = clone_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), copies, {id(p): i for i, p in enumerate(trainable)}
    )
    assert clone.param_groups[0]["params"] == copies


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
        lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.8, 0.9)),
        lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5),
    ],
)
def test_clone_keeps_class_and_every_hyper_parameter(make):
    model = torch.nn.Linear(3, 2)
    template = make(model.parameters())
    copies = [p.detach().clone() for p in model.parameters()]
    clone = clone_optimizer(template, copies, {id(p): i for i, p in enumerate(model.parameters())})
    assert type(clone) is type(template)
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in template.param_groups]
    assert [{k: v for k, v in g.items() if k != "params"} for g in clone.param_groups] == hyper


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), "fused"),
        (lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1), "fused"),
        (lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5), "foreach"),
        (lambda params: torch.optim.LBFGS(params, lr=0.1), "default"),
    ],
)
def test_fast_clone_picks_the_fastest_implementation_and_computes_the_same_step(make, expected):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    template = make(model.parameters())
    copies = [p.detach().clone() for p in model.parameters()]
    clone, implementation = fast_clone_optimizer(template, copies, {id(p): i for i, p in enumerate(model.parameters())})
    assert implementation == expected and type(clone) is type(template)
    if expected == "default":
        return
    hyper = [{k: v for k, v in g.items() if k not in IMPLEMENTATION_KEYS | {"params"}} for g in template.param_groups]
    assert [
        {k: v for k, v in g.items() if k not in IMPLEMENTATION_KEYS | {"params"}} for g in clone.param_groups
    ] == hyper
    for _ in range(3):
        for param, copy in zip(model.parameters(), copies, strict=True):
            param.grad = torch.ones_like(param)
            copy.grad = torch.ones_like(copy)
        template.step()
        clone.step()
    for param, copy in zip(model.parameters(), copies, strict=True):
        assert torch.allclose(param, copy, atol=1e-6)
