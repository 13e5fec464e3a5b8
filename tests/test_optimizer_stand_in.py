import torch

from lightning_hetero.optimizer_stand_in import OptimizerStandIn


def test_the_stand_in_runs_the_closure_through_its_step_and_reads_the_rest_from_the_optimizer():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    calls = []
    remote = OptimizerStandIn(optimizer, lambda closure: calls.append(closure()) or "stepped")
    assert remote.step(lambda: "loss") == "stepped" and calls == ["loss"]
    assert remote.param_groups is optimizer.param_groups
