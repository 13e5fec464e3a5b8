from lightning_hetero.async_ps.runtime.sampler import epoch_order as ps_epoch_order
from lightning_hetero.epoch_order import epoch_order
from lightning_hetero.hetero_batch import HeteroBatchSampler, SplitPlan


def test_epoch_order_changes_with_epoch_and_is_shared():
    assert epoch_order(50, 1, True, 3) == epoch_order(50, 1, True, 3)
    assert epoch_order(50, 1, True, 3) != epoch_order(50, 2, True, 3)
    assert sorted(epoch_order(50, 2, True, 3)) == list(range(50))


def test_the_hetero_batch_sampler_cuts_the_same_order_the_ps_sampler_claims_from():
    sampler = HeteroBatchSampler(list(range(24)), SplitPlan([4, 4]), rank=0, shuffle=True, seed=7)
    sampler.set_epoch(2)
    first_slices = [batch for batch in sampler]
    order = epoch_order(24, epoch=2, shuffle=True, seed=7)
    assert first_slices == [order[start : start + 4] for start in range(0, 24, 8)]
    assert ps_epoch_order is epoch_order, "the old import path still works"
