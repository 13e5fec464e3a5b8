import pytest
import torch

from lightning_hetero.ps.asp_client import AsynchronousClient, RemoteStepOptimizer
from lightning_hetero.ps.layout import FlatLayout, bind_parameters_to_flat
from lightning_hetero.ps.protocol import FLAG_JOIN, FLAG_LAST, PeerLostError
from lightning_hetero.ps.server import ParameterServer


def _client(world_size=2, lr=0.5):
    model = torch.nn.Linear(2, 1)
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params))
    bind_parameters_to_flat(params, flat)
    server = ParameterServer(
        FlatLayout.from_named_parameters(model.named_parameters()),
        flat,
        torch.optim.SGD(params, lr=lr),
        {id(p): i for i, p in enumerate(params)},
        world_size=world_size,
    )
    client = AsynchronousClient(flat, 0, server, None, 1.0, lost_cause=lambda err: err, recorded_fault=lambda s: None)
    return client, server, params, flat


def test_a_push_applies_the_weighted_gradient_and_writes_the_reply_into_the_model():
    client, server, params, flat = _client(world_size=2, lr=0.5)
    start = flat.clone()
    for p in params:
        p.grad = torch.ones_like(p)
    header = client.push(params, flags=FLAG_LAST, base_version=0, share=0.25, epoch=3, chunk=4)
    assert (header.version, header.staleness) == (1, 0)
    # lr 0.5 x weight (share 0.25 alone among 2 ranks) 0.5 x gradient 1
    torch.testing.assert_close(flat, start - 0.25)
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in params]), flat)  # the model sees the reply
    assert server.applied_chunks == {3: {4}} and server.finished_epoch == {0: 3}


def test_a_pull_copies_the_servers_parameters_without_an_update():
    client, server, _, flat = _client()
    server.params.fill_(7.0)
    header = client.pull(version=0, flags=FLAG_JOIN)
    assert header.version == 0 and server.version == 0
    assert flat.tolist() == [7.0, 7.0, 7.0]


def test_an_aborted_reply_names_the_rank_the_server_lost():
    client, server, _, _ = _client()
    server.fail(PeerLostError(2, "worker", "its connection broke"))
    with pytest.raises(PeerLostError, match="lost the worker on rank 2"):
        client.pull(version=0)


def test_the_remote_step_optimizer_runs_the_closure_remotely_and_reads_the_rest_from_the_optimizer():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    calls = []
    remote = RemoteStepOptimizer(optimizer, lambda closure: calls.append(closure()) or "stepped")
    assert remote.step(lambda: "loss") == "stepped" and calls == ["loss"]
    assert remote.param_groups is optimizer.param_groups
