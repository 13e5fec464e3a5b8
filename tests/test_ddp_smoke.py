"""The foundation's end-to-end check: a 2-rank CPU DDP run trains and its loss falls."""

import pytest

from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess


def test_two_rank_ddp_loss_falls(run_script, tmp_path):
    run_script("ddp_train.py", str(tmp_path), "2")
    results = [read_json(tmp_path / f"rank{rank}.json") for rank in range(2)]
    for result in results:
        assert result["world_size"] == 2
        losses = result["losses"]
        assert len(losses) == result["global_step"] == 3 * 1024 // (2 * 32)
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        assert last < 0.5 * first, (first, last)
