import pytest
import torch

from lightning_hetero.batch_weighting import averaged_weight, batch_share, equal_share, gradient_weight


def test_summed_weighted_local_means_are_the_big_batch_mean():
    torch.manual_seed(0)
    split = (3, 13, 7)
    samples = torch.randn(sum(split), 5, dtype=torch.float64)
    parts = samples.split(list(split))
    combined = sum(gradient_weight(batch_share(split, k)) * part.mean(0) for k, part in enumerate(parts))
    torch.testing.assert_close(combined, samples.mean(0), atol=1e-12, rtol=0)


def test_updates_applied_alone_average_to_the_big_batch_mean():
    # one update per rank, each alone: their mean over the ranks is the big-batch mean
    torch.manual_seed(1)
    split = (10, 30)
    samples = torch.randn(sum(split), 4, dtype=torch.float64)
    parts = samples.split(list(split))
    updates = [gradient_weight(batch_share(split, k), alone_among=2) * part.mean(0) for k, part in enumerate(parts)]
    torch.testing.assert_close(sum(updates) / 2, samples.mean(0), atol=1e-12, rtol=0)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_equal_shares_weigh_one_alone(world_size):
    assert gradient_weight(equal_share(world_size), alone_among=world_size) == pytest.approx(1.0)
    assert batch_share((5,) * world_size, 0) == pytest.approx(equal_share(world_size))


def test_averaged_weighted_local_means_are_the_big_batch_mean():
    # what DDP's built-in all-reduce does with each rank's weighted gradient: the mean over the ranks
    torch.manual_seed(2)
    split = (3, 13, 7)
    samples = torch.randn(sum(split), 5, dtype=torch.float64)
    parts = samples.split(list(split))
    averaged = sum(averaged_weight(split, k) * part.mean(0) for k, part in enumerate(parts)) / len(split)
    torch.testing.assert_close(averaged, samples.mean(0), atol=1e-12, rtol=0)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 7, 12])
@pytest.mark.parametrize("local", [1, 3, 21, 37])
def test_equal_shares_weigh_exactly_one_under_averaging(world_size, local):
    # exactly 1.0, so that the loss gradient of equal ranks is left bitwise unchanged
    assert all(averaged_weight((local,) * world_size, k) == 1.0 for k in range(world_size))
