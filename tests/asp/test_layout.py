import pytest
import torch

from lightning_hetero.asp.layout import FlatLayout, bind_parameters_to_flat, flatten_grads_into


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def test_layout_round_trips_parameters():
    model = _model()
    layout = FlatLayout.from_named_parameters(model.named_parameters())
    assert layout.names == ("0.weight", "0.bias", "2.weight", "2.bias")
    assert layout.numel == sum(p.numel() for p in model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for view, param in zip(layout.views(flat), model.parameters(), strict=True):
        assert torch.equal(view, param.detach())


def test_views_reject_wrong_length():
    layout = FlatLayout.from_named_parameters([("w", torch.zeros(2))])
    with pytest.raises(ValueError, match="2 elements"):
        layout.views(torch.zeros(3))


def test_flatten_grads_counts_missing_as_zero_and_casts():
    model = _model()
    model(torch.randn(5, 3)).sum().backward()
    model[2].bias.grad = None
    out = flatten_grads_into(list(model.parameters()), torch.empty(26, dtype=torch.float64))
    expected = torch.cat([model[0].weight.grad.reshape(-1), model[0].bias.grad, model[2].weight.grad.reshape(-1)])
    assert torch.allclose(out[:24], expected.double())
    assert torch.equal(out[24:], torch.zeros(2, dtype=torch.float64))


def test_bound_parameters_follow_the_flat_buffer_and_keep_training():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params))
    bind_parameters_to_flat(params, flat)
    for param, value in zip(params, before, strict=True):
        assert torch.equal(param.detach(), value)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in params]))
    flat.zero_()
    assert all(bool((p == 0).all()) for p in params)
