"""A checkpoint written by the release before the tuner was restructured (fixtures/, commit ce12dbb) still resumes."""

from pathlib import Path

import pytest
import torch

from tests.helpers import read_json

FIXTURE = Path(__file__).parent / "fixtures" / "hetero_batch_ce12dbb.ckpt"


@pytest.mark.multiprocess
def test_checkpoint_from_the_previous_release_resumes_with_its_tuner_state(run_script, tmp_path):
    held = torch.load(FIXTURE, map_location="cpu", weights_only=False)
    state = held["callbacks"]["HeteroBatchCallback"]
    run_script("hetero_resume.py", str(FIXTURE), str(tmp_path))
    ranks = [read_json(tmp_path / f"resume_rank{rank}.json") for rank in range(2)]
    for rank, seen in enumerate(ranks):
        restored = seen["restored"]
        assert restored["split"] == state["split"] == [51, 13]
        assert restored["costs"] == state["costs"]
        assert restored["throughputs"] == state["throughputs"]
        assert {key: restored["policy"][key] for key in state["policy"]} == state["policy"]
        assert restored["policy"]["outcomes"] == []  # outcomes came after that release: none restored
        assert restored["own_fit"] == state["costs"][rank], "each rank's cost model continues from its own fit"
        assert restored["history"] == len(state["history"])
        assert restored["global_step"] == held["global_step"] == 16
        # training continues: one more epoch of 512 samples in global batches of 64
        assert seen["global_step"] == 16 + 8
        assert sum(seen["final_split"]) == 64
    assert ranks[0]["final_split"] == ranks[1]["final_split"]
