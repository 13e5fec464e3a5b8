import pytest
import torch

from lightning_hetero.batch_weighting import averaged_weight
from lightning_hetero.hetero_batch.accumulation import step_weight, window
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan


def _gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, weight: float) -> torch.Tensor:
    model.zero_grad()
    (weight * torch.nn.functional.cross_entropy(model(x), y)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


@pytest.mark.parametrize("accumulate", [1, 2, 4])
def test_accumulated_steps_are_the_big_batch_gradient_over_all_micro_batches(accumulate):
    """Lightning divides each micro-batch's loss by ``accumulate`` and DDP averages the ranks: with the weights of
    ``step_weight`` each optimizer step's gradient is the gradient of all its micro-batches' samples together, also
    when the split changes inside a window and for the epoch's last, short window and global batch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(45, 5), torch.randint(0, 3, (45,))  # 5 global batches of 8, then a short one of 5
    plan = SplitPlan([5, 3])
    plan.change_at(3, [6, 2])
    samplers = [HeteroBatchSampler(x, plan, rank=rank, shuffle=True, seed=1) for rank in (0, 1)]
    batches = [list(sampler) for sampler in samplers]
    steps = len(samplers[0])
    assert steps == 6 and sum(samplers[0].sizes_at(0, steps - 1)) == 5
    checked = 0
    for first in range(0, steps, accumulate):
        steps_in_window = window(first, accumulate, steps)
        accumulated = torch.zeros(sum(p.numel() for p in model.parameters()))
        for step in steps_in_window:
            sizes = samplers[0].sizes_at(0, step)
            for rank in (0, 1):
                weight = step_weight(sizes, rank, step, accumulate, steps, lambda s: sum(samplers[0].sizes_at(0, s)))
                index = batches[rank][step]
                accumulated += _gradient(model, x[index], y[index], weight / accumulate) / 2  # DDP: the mean
        everything = [i for step in steps_in_window for rank in (0, 1) for i in batches[rank][step]]
        torch.testing.assert_close(accumulated, _gradient(model, x[everything], y[everything], 1.0))
        checked += 1
    assert checked == -(-steps // accumulate)


def test_without_the_window_total_the_short_last_window_would_be_wrong():
    """The per-step weight alone (``averaged_weight``) is what the window's weight gives for full windows only."""
    sizes, steps = (3, 2), 6
    full = step_weight(sizes, 0, 1, 2, steps, lambda s: 8)
    assert full == pytest.approx(averaged_weight(sizes, 0) * 5 / 8)  # a step of 5 in a window of 8-sample steps
    last = step_weight(sizes, 0, 5, 2, steps, lambda s: 8 if s < 5 else 5)
    assert last == pytest.approx(2 * 2 * 3 / 13) and last != pytest.approx(averaged_weight(sizes, 0))
