import pytest
import torch

from lightning_hetero.param_groups import hyperparameters, momentum_of, scale_learning_rates, set_momentum


def _param():
    return torch.nn.Parameter(torch.zeros(2))


@pytest.mark.parametrize(
    ("make", "key", "value"),
    [
        (lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9), "momentum", 0.9),
        (lambda p: torch.optim.Adam([p], lr=0.1, betas=(0.8, 0.99)), "betas", 0.8),
        (lambda p: torch.optim.RMSprop([p], lr=0.1, momentum=0.5), "momentum", 0.5),
    ],
)
def test_momentum_is_read_and_set_where_the_optimizer_keeps_it(make, key, value):
    group = make(_param()).param_groups[0]
    assert momentum_of(group) == pytest.approx(value)
    set_momentum(group, 0.25)
    assert momentum_of(group) == 0.25
    if key == "betas":
        assert group["betas"] == (0.25, 0.99), "the second beta is kept"


def test_a_group_without_momentum_is_left_alone():
    group = torch.optim.Adagrad([_param()], lr=0.1).param_groups[0]
    before = hyperparameters(group)
    assert momentum_of(group) is None
    set_momentum(group, 0.5)
    assert hyperparameters(group) == before


def test_hyperparameters_copy_everything_but_the_parameters():
    group = torch.optim.SGD([_param()], lr=0.1, momentum=0.9, weight_decay=1e-4).param_groups[0]
    hyper = hyperparameters(group)
    assert "params" not in hyper and hyper["lr"] == 0.1 and hyper["weight_decay"] == 1e-4
    hyper["lr"] = 1.0
    assert group["lr"] == 0.1, "a copy, not a view"


def test_scaling_survives_the_schedulers_next_step():
    optimizer = torch.optim.SGD([_param()], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scale_learning_rates([optimizer], [scheduler], 3.0)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.3)
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(0.3)
