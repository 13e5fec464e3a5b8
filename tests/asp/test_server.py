import threading

import pytest
import torch

from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.asp.layout import FlatLayout
from lightning_hetero.asp.protocol import (
    FLAG_LAST,
    FLAG_PULL_ONLY,
    STATUS_ABORTED,
    STATUS_OK,
    STATUS_STOPPED,
    PeerLostError,
    PushHeader,
    new_message,
    payload,
)
from lightning_hetero.asp.server import ParameterServer


def _server(
    lr: float = 0.1, momentum: float = 0.0, **kwargs
) -> tuple[ParameterServer, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    template = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    layout = FlatLayout.from_named_parameters(model.named_parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    index_of = {id(p): i for i, p in enumerate(model.parameters())}
    kwargs.setdefault("world_size", 2)
    return ParameterServer(layout, flat, template, index_of, **kwargs), model, template


def _push(server, worker, grad, base_version, share=0.5, flags=0):
    reply = new_message(server.layout.numel)
    header = server.apply(worker, PushHeader(flags, base_version, share), grad.clone(), reply)
    return header, payload(reply).clone()


def test_update_applies_the_users_optimizer_with_share_weighting():
    server, _, _ = _server(lr=0.1, momentum=0.9)
    start = server.params.clone()
    grad = torch.arange(float(server.layout.numel))
    header, params = _push(server, worker=1, grad=grad, base_version=0, share=0.25)
    assert (header.status, header.version, header.staleness) == (STATUS_OK, 1, 0)
    # SGD's first step: p - lr * (share * world_size) * g
    assert torch.allclose(params, start - 0.1 * 0.5 * grad)
    header, params2 = _push(server, worker=1, grad=grad, base_version=1, share=0.25)
    assert header.version == 2
    # momentum lives on the server: second step moves by lr * (0.9 * g' + g')
    assert torch.allclose(params2, params - 0.1 * (0.9 + 1) * 0.5 * grad)


def test_staleness_is_versions_since_the_pull_and_is_tracked():
    server, _, _ = _server()
    grad = torch.zeros(server.layout.numel)
    _push(server, 0, grad, base_version=0)
    _push(server, 0, grad, base_version=1)
    header, _ = _push(server, 1, grad, base_version=0)
    assert header.staleness == 2
    summary = server.tracker.summary()
    assert summary["updates_per_worker"] == {0: 2, 1: 1}
    assert summary["staleness_max"] == 2


def test_on_update_sees_each_new_version_before_the_next_update_reads_the_template():
    server, _, template = _server(lr=1.0)
    versions = []

    def halve_lr(version):
        versions.append(version)
        template.param_groups[0]["lr"] /= 2

    server.on_update = halve_lr
    grad = torch.ones(server.layout.numel)
    _, first = _push(server, 0, grad, base_version=0)
    _, second = _push(server, 0, grad, base_version=1)
    assert versions == [1, 2]
    # the first update used lr 1, the second the halved lr 0.5 (share 0.5 x world size 2 = weight 1)
    assert torch.allclose(first - second, 0.5 * grad)


def test_hyper_parameters_follow_the_template_and_inverse_scaling():
    server, _, template = _server(lr=1.0, lr_scaling="inverse")
    grad = torch.ones(server.layout.numel)
    _push(server, 0, grad, base_version=0, share=0.5)  # staleness 0: full lr
    template.param_groups[0]["lr"] = 0.5  # e.g. a scheduler stepped the user's optimizer
    before = server.params.clone()
    _push(server, 1, grad, base_version=-1, share=0.5)  # staleness 2: lr / 2
    assert torch.allclose(server.params, before - 0.25 * grad)


def test_compensation_lowers_the_servers_momentum_and_leaves_the_template_alone():
    plain, _, _ = _server(lr=0.1, momentum=0.9)
    server, _, template = _server(lr=0.1, momentum=0.9, compensator=AsynchronyCompensator("auto", workers=2))
    grad = torch.ones(server.layout.numel)
    for version in range(3):
        _push(plain, 0, grad, version)
        _push(server, 0, grad, version)
    # staleness 0 three times: N_eff drifts from 2 towards 1, so momentum sits just above 0.8
    momentum = server.optimizer.param_groups[0]["momentum"]
    assert 0.8 < momentum < 0.81
    assert server.compensator.momentum_effective == momentum
    assert template.param_groups[0]["momentum"] == 0.9 and template.param_groups[0]["lr"] == 0.1
    # less momentum: the same gradients moved the parameters less far than the uncompensated server's
    start = _server()[0].params
    assert (start - server.params).abs().sum() < (start - plain.params).abs().sum()
    server.compensator = None  # replaced between updates: the user's values again
    _push(server, 0, grad, 3)
    assert server.optimizer.param_groups[0]["momentum"] == 0.9


def test_delay_compensation_uses_the_parameters_sent_to_the_pushing_worker():
    server, _, _ = _server(lr=1.0, compensator=AsynchronyCompensator("dc", workers=2, dc_lambda=1.0))
    grad = torch.ones(server.layout.numel)
    _, sent = _push(server, 1, torch.zeros_like(grad), 0, flags=FLAG_PULL_ONLY)  # worker 1 pulls version 0
    _push(server, 0, grad, 0)  # worker 0's update moves the parameters
    before = server.params.clone()
    _push(server, 1, grad, base_version=0)  # stale by one
    lr = server.optimizer.param_groups[0]["lr"]
    # g + lambda0 * g * g / sqrt(E[g * g]) * (w_now - w_sent) with g = 1, lambda0 = 1
    assert torch.allclose(before - server.params, lr * (1 + before - sent), atol=1e-6)
    assert not torch.allclose(before - server.params, lr * grad)


def test_load_restarts_the_staleness_measurement():
    server, _, _ = _server(compensator=AsynchronyCompensator("auto", workers=4))
    for version in range(20):
        _push(server, 0, torch.zeros(server.layout.numel), version)
    assert server.compensator.n_eff < 4
    server.load(server.params, None, server.version)
    assert server.compensator.n_eff == 4


def test_budget_spent_drops_updates_and_pull_only_reads():
    server, _, _ = _server()
    server.max_updates = 1
    grad = torch.ones(server.layout.numel)
    _push(server, 0, grad, 0)
    after_budget = server.params.clone()
    header, params = _push(server, 1, grad, 0)
    assert header.status == STATUS_STOPPED and header.version == 1
    assert torch.equal(params, after_budget)
    header, params = _push(server, 1, grad, 0, flags=FLAG_PULL_ONLY)
    assert header.status == STATUS_OK and torch.equal(params, after_budget)


def test_lost_rank_aborts_waiting_and_later_requests():
    server, _, _ = _server(max_staleness=0)
    grad = torch.zeros(server.layout.numel)
    _push(server, 0, grad, 0)
    results = []
    blocked = threading.Thread(target=lambda: results.append(_push(server, 1, grad, 1)[0]))
    blocked.start()  # worker 1 is now ahead of worker 0 and waits for it
    server.fail(PeerLostError(0, "worker", "connection closed"))
    blocked.join(30)
    assert not blocked.is_alive()
    assert results[0].status == STATUS_ABORTED and results[0].lost_rank == 0
    header, _ = _push(server, 1, grad, 1)
    assert header.status == STATUS_ABORTED


def test_wait_lost_returns_the_lost_rank_once_recorded():
    server, _, _ = _server()
    assert server.wait_lost(0.01) is None
    threading.Timer(0.05, server.fail, args=(PeerLostError(1, "worker", "connection closed"),)).start()
    lost = server.wait_lost(30)
    assert lost is not None and lost.rank == 1


def test_stale_synchronous_gate_holds_the_fast_worker_until_the_slow_one_pushes():
    server, _, _ = _server(max_staleness=0)
    grad = torch.zeros(server.layout.numel)
    _push(server, 0, grad, 0)
    done = threading.Event()

    def fast_worker():
        _push(server, 1, grad, 1)
        done.set()

    thread = threading.Thread(target=fast_worker)
    thread.start()
    assert not done.wait(0.2)  # held back: one update ahead of worker 0
    _push(server, 0, grad, 1, flags=FLAG_LAST)  # worker 0 catches up (and ends its epoch)
    thread.join(30)
    assert done.is_set()
    assert server.version == 3
    assert server.tracker.summary()["lead_max"] == 0  # nobody was released ahead of the bound


def test_state_round_trip():
    server, _, _ = _server(momentum=0.9)
    _push(server, 0, torch.ones(server.layout.numel), 0)
    state = server.state_dict()
    other, _, _ = _server(momentum=0.9)
    other.load(state["params"], state["optimizer"], state["version"])
    assert other.version == 1 and torch.equal(other.params, server.params)
    restored = other.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(restored, server.optimizer.state_dict()["state"][0]["momentum_buffer"])
    assert restored.abs().sum() > 0, "the momentum of the one update made"


def test_a_tolerated_lost_worker_is_dropped_without_aborting_the_others():
    server, _, _ = _server(world_size=3, max_staleness=0)
    noticed = []
    server.on_lost = noticed.append
    server.tolerate_lost_workers = True
    _push(server, 2, torch.ones(8), base_version=0)  # worker 2 leads the clock of the slowest active worker
    server.fail(PeerLostError(2, "worker", "Connection closed by peer"))
    server.fail(PeerLostError(2, "worker", "Connection closed by peer"))  # its thread may notice twice
    assert [error.rank for error in noticed] == [2] and server.lost is None and server.lost_ranks == {2}
    header, _ = _push(server, 1, torch.ones(8), base_version=1)  # not held back by, nor aborted for, worker 2
    assert header.status == STATUS_OK
    server.fail(PeerLostError(0, "parameter server", "it failed"))  # not a worker: the job ends
    assert _push(server, 1, torch.ones(8), base_version=2)[0].status == STATUS_ABORTED


def test_applied_chunks_and_each_workers_last_epoch_are_recorded():
    server, _, _ = _server()
    reply = new_message(server.layout.numel)
    server.apply(1, PushHeader(0, 0, 0.5, epoch=3, chunk=7), torch.ones(8), reply)
    server.apply(1, PushHeader(FLAG_LAST, 1, 0.5, epoch=3, chunk=2), torch.ones(8), reply)
    server.apply(0, PushHeader(0, 2, 0.5, epoch=3, chunk=-1), torch.ones(8), reply)  # not from a ClaimSampler
    assert server.applied_chunks == {3: {2, 7}}
    assert server.finished_epoch == {1: 3}


def test_the_server_keeps_its_implementation_through_template_copies_and_loads():
    server, _, template = _server(lr=0.1, momentum=0.9)
    assert server.implementation == "fused" and template.param_groups[0]["fused"] is None
    _push(server, 1, torch.ones(server.layout.numel), 0)
    assert server.optimizer.param_groups[0]["fused"] is True  # not overwritten by the template's hyper-parameters
    server.load(server.params, template.state_dict(), version=5)  # a state saved from the template (fused None)
    assert server.optimizer.param_groups[0]["fused"] is True


def test_statistics_count_the_updates_and_the_time_spent_on_them():
    server, _, _ = _server(momentum=0.9)
    assert server.statistics()["updates"] == 0 and server.statistics()["busy_fraction"] == 0.0
    grad = torch.ones(server.layout.numel)
    for version in range(3):
        _push(server, 1, grad, version)
    _push(server, 1, grad, 3, flags=FLAG_PULL_ONLY)  # a pull is not an update
    stats = server.statistics()
    assert stats["updates"] == 3 and stats["busy_s"] > 0 and 0 < stats["busy_fraction"] <= 1
    assert stats["us_per_mb"] == pytest.approx(stats["us_per_update"] / (server.layout.numel * 4 / 1e6))
