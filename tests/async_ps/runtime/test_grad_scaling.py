"""grad_scaling: the ranks' fp16 scalers made one at the smallest scale and growth count."""

import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from lightning_hetero.async_ps.runtime import grad_scaling
from lightning_hetero.async_ps.runtime.grad_scaling import agree_scalers, grad_scaler


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


def test_local_sgd_round_end_carries_the_scalers_in_its_sum_and_every_rank_takes_the_smallest():
    """Three ranks' round-end messages summed, rank 2 lost from the group (its slots stay 0): each rank reads back
    the message as the others sent it and the smallest scale and growth count of the ranks present."""
    scalers = [torch.amp.GradScaler("cpu", init_scale=s, growth_interval=100) for s in (1024.0, 512.0, 64.0)]
    scalers[0].load_state_dict({**scalers[0].state_dict(), "_growth_tracker": 2})
    scalers[1].load_state_dict({**scalers[1].state_dict(), "_growth_tracker": 7})
    plugins = [MixedPrecision("16-mixed", "cpu", scaler=s) for s in scalers]
    messages = [torch.full((3,), float(rank + 1)) for rank in range(3)]
    folded = [grad_scaling.fold_scaler(plugins[r], messages[r], r, world_size=3) for r in range(3)]
    assert {n for _, n in folded} == {6} and all(m.shape == (9,) for m, _ in folded)
    summed = folded[0][0] + folded[1][0]  # rank 2 is not in the group
    for rank in range(2):
        message = grad_scaling.unfold_scaler(plugins[rank], summed.clone(), 6)
        assert torch.equal(message, torch.full((3,), 3.0))
        assert scalers[rank].get_scale() == 512.0 and scalers[rank].state_dict()["_growth_tracker"] == 2
    assert grad_scaling.unfold_scaler(MixedPrecision("bf16-mixed", "cpu"), summed, 0) is summed  # bf16: nothing
