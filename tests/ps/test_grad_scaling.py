"""grad_scaling: the ranks' fp16 scalers made one at the smallest scale and growth count."""

import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from lightning_hetero.ps import grad_scaling
from lightning_hetero.ps.grad_scaling import agree_scalers, grad_scaler


def test_only_fp16_has_a_scaler_to_agree_and_without_one_no_collective_runs():
    assert grad_scaler(MixedPrecision("bf16-mixed", "cpu")) is None
    assert grad_scaler(MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", enabled=False))) is None
    calls = []
    agree_scalers(MixedPrecision("bf16-mixed", "cpu"), collective=calls.append)
    assert calls == []


def test_the_scaler_takes_the_smallest_scale_and_growth_count_of_the_ranks(monkeypatch):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    other_rank = torch.tensor([256.0, 7.0])

    def all_reduce_min(tensor, op, group):
        assert op == torch.distributed.ReduceOp.MIN
        torch.minimum(tensor, other_rank, out=tensor)

    monkeypatch.setattr(grad_scaling.dist, "all_reduce", all_reduce_min)
    agree_scalers(plugin, collective=lambda run: run())
    assert scaler.get_scale() == 256.0 and scaler.state_dict()["_growth_tracker"] == 0  # this rank's count was 0
    assert scaler.state_dict()["growth_interval"] == 100  # the rest of its settings kept
