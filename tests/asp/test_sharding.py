"""Sharding's pure parts: the slices, the optimizer state cut into shards and gathered back, and shard servers that
step exactly as one unsharded server does."""

import pytest
import torch
from torch import nn

from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.asp.layout import FlatLayout, flatten_model
from lightning_hetero.asp.protocol import PushHeader, new_message, payload
from lightning_hetero.asp.sharding import (
    check_server_shards,
    cut_optimizer_state,
    gather_optimizer_state,
    plan_shards,
)
from lightning_hetero.async_ps.runtime.bootstrap import shard_server
from lightning_hetero.param_groups import hyperparameters


def _layout(*sizes):
    return FlatLayout.from_named_parameters([(f"p{i}", torch.zeros(size)) for i, size in enumerate(sizes)])


def test_shards_are_contiguous_runs_of_whole_tensors_cut_nearest_to_equal():
    layout = _layout(100, 5, 100, 5, 100, 5)
    plan = plan_shards(layout, 3)
    assert [(s.start, s.stop) for s in plan] == [(0, 105), (105, 210), (210, 315)]
    assert [(s.first, s.last) for s in plan] == [(0, 2), (2, 4), (4, 6)]
    assert plan[0].layout(layout).names == ("p0", "p1")
    # one dominant tensor cannot be split: the others still get at least one tensor each
    lopsided = plan_shards(_layout(1000, 1, 1), 3)
    assert [(s.first, s.last) for s in lopsided] == [(0, 1), (1, 2), (2, 3)]
    assert [(s.start, s.stop) for s in plan_shards(layout, 1)] == [(0, 315)]


def test_bad_shard_counts_are_named():
    with pytest.raises(ValueError, match="only 2 trainable parameter tensors"):
        plan_shards(_layout(3, 3), 3)
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match=r"server_shards=\.\.\.\) must be an integer >= 1"):
            check_server_shards(bad)
    with pytest.raises(ValueError, match=r"server_shards=3.*the job has 2"):
        check_server_shards(3, world_size=2)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


def _two_groups_adam(model):
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    # groups in another order than the layout, so template numbering and layout order differ
    return torch.optim.Adam([{"params": biases, "lr": 0.01}, {"params": weights}], lr=0.05)


def _group_indices(model, optimizer):
    index_of = {id(p): i for i, p in enumerate(model.parameters())}
    return [[index_of[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def test_cutting_and_gathering_a_state_dict_are_inverse():
    model = _model()
    optimizer = _two_groups_adam(model)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    whole = optimizer.state_dict()
    layout = FlatLayout.from_named_parameters(model.named_parameters())
    groups = _group_indices(model, optimizer)
    for shards in (1, 2, 3):
        plan = plan_shards(layout, shards)
        parts = [cut_optimizer_state(whole, groups, shard) for shard in plan]
        assert sum(len(part["state"]) for part in parts) == len(whole["state"])
        assert gather_optimizer_state(parts, groups, plan) == whole


def _servers(model, optimizer, plan, compensate):
    """One server per shard of ``plan``, as ``start_server`` builds them."""
    flat = flatten_model(model)
    servers = []
    for shard in plan:
        compensator = AsynchronyCompensator("auto", workers=2) if compensate else None
        if compensator is not None:
            compensator.apply([hyperparameters(group) for group in optimizer.param_groups])
        servers.append(shard_server(flat, optimizer, shard, world_size=2, compensator=compensator))
    return servers


@pytest.mark.parametrize("compensate", [False, True], ids=["plain", "compensated"])
def test_two_shard_servers_step_exactly_as_one_server(compensate):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    layout = FlatLayout.from_named_parameters(model.named_parameters())
    plan = plan_shards(layout, 2)
    (one,) = _servers(model, optimizer, plan_shards(layout, 1), compensate)
    shards = _servers(model, optimizer, plan, compensate)
    torch.manual_seed(1)
    for step in range(6):
        grad = torch.randn(layout.numel)
        worker, base = step % 2, max(0, step - 1)  # staleness 0, then 1
        header = PushHeader(0, base_version=base, share=0.5)
        one_reply = new_message(layout.numel)
        one.apply(worker, header, grad.clone(), one_reply)
        replies = [new_message(shard.numel) for shard in plan]
        for server, shard, reply in zip(shards, plan, replies, strict=True):
            assert server.apply(worker, header, grad[shard.start : shard.stop].clone(), reply).version == step + 1
        assert torch.equal(torch.cat([payload(r) for r in replies]), payload(one_reply))
    gathered = gather_optimizer_state(
        [server.state_dict()["optimizer"] for server in shards], _group_indices(model, optimizer), plan
    )
    expected = one.state_dict()["optimizer"]
    assert gathered["param_groups"] == expected["param_groups"]
    for position, state in expected["state"].items():
        assert torch.equal(gathered["state"][position]["momentum_buffer"], state["momentum_buffer"])
