import pytest
import torch

from lightning_hetero.elastic.ledger import EpochLedger, assign, round_quotas


def test_a_committed_round_counts_its_chunks_and_duplicates():
    ledger = EpochLedger(5)
    assert ledger.commit(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])) == 0
    assert ledger.commit(torch.tensor([0.0, 2.0, 1.0, 0.0, 0.0])) == 1  # chunk 1 again, twice in the round
    assert ledger.counts.tolist() == [1, 3, 1, 0, 0]
    assert ledger.duplicates == 1 and ledger.lost == 2 and not ledger.complete


def test_free_chunks_are_neither_trained_nor_held_and_an_absent_holder_frees_its_chunks():
    ledger = EpochLedger(6)
    ledger.commit(torch.tensor([1.0, 0, 0, 0, 0, 0]))
    held_by_present = torch.tensor([0.0, 1, 0, 0, 1, 0])
    assert ledger.free(held_by_present) == [2, 3, 5]
    assert ledger.free(torch.zeros(6)) == [1, 2, 3, 4, 5]  # the holder of 1 and 4 left: they are free again


def test_next_epoch_resets_the_counts_and_state_round_trips():
    ledger = EpochLedger(2)
    ledger.commit(torch.ones(2))
    assert ledger.complete
    ledger.next_epoch()
    assert ledger.epoch == 1 and ledger.lost == 2
    other = EpochLedger(2)
    other.load_state_dict(ledger.state_dict())
    assert other.epoch == 1 and other.counts.tolist() == [0, 0]


def test_a_different_epoch_length_is_refused_naming_both():
    with pytest.raises(ValueError, match="has 3 batches, this worker's has 2"):
        EpochLedger(2).load_state_dict(EpochLedger(3).state_dict())
    with pytest.raises(ValueError, match="num_chunks=0"):
        EpochLedger(0)


def test_quotas_follow_speed_and_a_newcomer_counts_as_the_slowest_in_a_round_half_as_long():
    assert round_quotas([1.0, 1.0, 2.0, 4.0], 8) == [4, 4, 8, 16]
    assert round_quotas([1.0, 3.0, 0.0], 10) == [3, 9, 3]  # 15 steps, not 30
    assert round_quotas([0.0, 0.0], 3) == [2, 2]  # nobody measured yet (the job's start): equal, ceil(3 / 2) each


def test_assign_tops_each_participant_up_to_quota_plus_one_from_disjoint_free_chunks():
    shares = assign(list(range(20)), quotas=[3, 6], held=[1, 7])
    assert [len(s) for s in shares] == [3, 0]
    shares = assign(list(range(4)), quotas=[3, 3, 3], held=[0, 0, 0])
    assert sorted(c for s in shares for c in s) == [0, 1, 2, 3]
    assert [len(s) for s in shares] == [2, 1, 1]
