import pytest
import torch

from lightning_hetero.asp.client import AsynchronousClient
from lightning_hetero.asp.layout import FlatLayout, bind_parameters_to_flat
from lightning_hetero.asp.protocol import FLAG_JOIN, FLAG_LAST, PeerLostError, PushHeader, new_message
from lightning_hetero.asp.server import ParameterServer


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


def _setup(overlap: bool, world_size: int = 1):
    """A one-parameter model bound to its flat buffer, an in-process server (plain SGD, lr 1) and rank 0's client."""
    param = torch.nn.Parameter(torch.zeros(1))
    flat = torch.zeros(1)
    bind_parameters_to_flat([param], flat)
    template = torch.optim.SGD([param], lr=1.0)
    server = ParameterServer(
        FlatLayout.from_named_parameters([("w", param)]), flat, template, {id(param): 0}, world_size=world_size
    )
    client = AsynchronousClient(
        flat, 0, server, None, 1.0, lost_cause=lambda err: err, recorded_fault=lambda wait_s: None, overlap=overlap
    )
    return param, server, client


def _train(overlap: bool, steps: int, others_per_step: int = 0, world_size: int = 1):
    """``steps`` updates of rank 0 (gradient 1 each, the last flagged ``FLAG_LAST``), the way the strategy drives the
    client, with ``others_per_step`` updates of another worker applied directly to the server before each of rank
    0's pushes. Returns the server, the parameter each gradient was computed on, and the final parameter (the other
    worker's updates have staleness 0, so the server's largest staleness is rank 0's)."""
    param, server, client = _setup(overlap, world_size)
    version, computed_on = 0, []
    reply = new_message(1)
    for step in range(steps):
        for _ in range(others_per_step):
            server.apply(1, PushHeader(0, server.version, 1.0 / world_size), torch.zeros(1), reply)
        computed_on.append(param.item())
        param.grad = torch.ones(1)
        flags = FLAG_LAST if step == steps - 1 else 0
        version = client.push([param], flags, version, 1.0 / world_size).version
    client.close()
    return server, computed_on, param.item()


def test_textbook_asp_computes_every_gradient_on_the_latest_parameters():
    server, computed_on, final = _train(overlap=False, steps=4)
    assert computed_on == [0.0, -1.0, -2.0, -3.0] and final == -4.0
    assert server.tracker.summary()["staleness_max"] == 0


def test_overlap_lags_by_at_most_the_workers_own_previous_update():
    server, computed_on, final = _train(overlap=True, steps=5)
    # the reply to update k lands after gradient k+1 is computed: each gradient misses exactly the previous update
    assert computed_on == [0.0, 0.0, -1.0, -2.0, -3.0]
    # the last push of the epoch (FLAG_LAST) waits for its reply, so the epoch ends on the server's parameters
    assert final == -5.0 and server.version == 5 and torch.equal(server.params, torch.tensor([-5.0]))
    summary = server.tracker.summary()
    assert summary["staleness_max"] == 1 and summary["staleness_mean"] == pytest.approx(4 / 5)


@pytest.mark.parametrize("others", [1, 3])
def test_with_other_workers_overlap_still_misses_only_the_workers_previous_update(others):
    # the other worker pushes zero gradients, so the parameter counts the rank 0 updates a gradient was computed on
    textbook, computed_on, final = _train(overlap=False, steps=6, others_per_step=others, world_size=2)
    assert computed_on == [0.0, -1.0, -2.0, -3.0, -4.0, -5.0] and final == -6.0
    assert textbook.tracker.summary()["staleness_max"] == others  # the others' updates since the last reply
    overlapped, computed_on, final = _train(overlap=True, steps=6, others_per_step=others, world_size=2)
    assert computed_on == [0.0, 0.0, -1.0, -2.0, -3.0, -4.0] and final == -6.0
    # plus its own previous update and the others' updates while it was in flight
    assert overlapped.tracker.summary()["staleness_max"] > others


def test_a_pull_waits_for_the_update_in_flight():
    param, server, client = _setup(overlap=True)
    param.grad = torch.ones(1)
    assert client.push([param], 0, 0, 1.0).version == 0 and param.item() == 0.0  # in flight
    assert client.pull(0).version == 1 and param.item() == -1.0
    client.close()
    assert server.tracker.summary()["updates"] == 1  # the pull applied nothing


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_parameters_are_staged_through_pinned_messages():
    """As the class's example, with the parameters on CUDA: the pushes and replies travel through pinned messages and
    every reply lands on the device before the next one reuses its message."""
    param = torch.nn.Parameter(torch.ones(1000, device="cuda"))
    server = ParameterServer(
        FlatLayout.from_named_parameters([("w", param)]),
        param.detach().cpu(),
        torch.optim.SGD([param], lr=0.5),
        {id(param): 0},
        world_size=1,
    )
    flat = param.detach()
    client = AsynchronousClient(flat, rank=0, server=server, group=None, timeout_s=5.0, lost_cause=lambda err: err,
                                recorded_fault=lambda wait_s: None, pin_memory=True, overlap=True)  # fmt: skip
    for version in range(5):
        param.grad = torch.ones_like(param)
        client.push([param], 0, base_version=version, share=1.0)
    client.close()
    assert torch.allclose(flat.cpu(), torch.full((1000,), 1.0 - 5 * 0.5))
