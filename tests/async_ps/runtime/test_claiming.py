import torch.distributed as dist
from torch.utils.data import DataLoader

from lightning_hetero.async_ps.runtime.claiming import StoreClaims, claiming_loader
from lightning_hetero.async_ps.runtime.sampler import ClaimSampler


def test_store_claims_hand_out_consecutive_chunks_per_epoch():
    claims = StoreClaims(dist.HashStore(), lost_cause=lambda err: err)
    assert [claims(0, 2), claims(0, 3), claims(1, 1), claims(0, 1)] == [0, 2, 0, 5]


def test_claiming_loader_replaces_the_sampler_and_keeps_the_batch_size():
    claims = StoreClaims(dist.HashStore(), lost_cause=lambda err: err)
    loader = DataLoader(list(range(10)), batch_size=4)
    result = claiming_loader(loader, claims, lambda: 0, lambda: True, rank=0, world_size=1, tail=None)
    assert result is not None
    rebuilt, sampler = result
    assert isinstance(sampler, ClaimSampler) and rebuilt.sampler is sampler and rebuilt.batch_size == 4
    assert sorted(i for batch in rebuilt for i in batch.tolist()) == list(range(10))


def test_claiming_loader_leaves_custom_samplers_and_unbatched_loaders_alone():
    claims = StoreClaims(dist.HashStore(), lost_cause=lambda err: err)
    for loader in (DataLoader(list(range(4)), sampler=[3, 2]), DataLoader(list(range(4)), batch_size=None)):
        assert claiming_loader(loader, claims, lambda: 0, lambda: True, rank=0, world_size=1, tail=None) is None
