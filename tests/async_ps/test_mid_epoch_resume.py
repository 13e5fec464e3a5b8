"""A checkpoint at a validation point inside an epoch resumes where the epoch's claim pool stood: across the stopped
fit and the resumed one every sample of that epoch is trained once (ASP, local SGD), and the step counts go on as
in an uninterrupted run. Two CPU ranks, Lightning's defaults on (progress bar, model summary, logger)."""

import pytest

from tests.helpers import read_json

SAMPLES = 256
BATCHES = SAMPLES // 16  # the loader's batch size: 16


@pytest.mark.multiprocess
@pytest.mark.parametrize(("mode", "optimizer"), [("asp", "sgd"), ("local", "sgd"), ("asp", "adam")])
def test_a_checkpoint_at_a_validation_point_inside_an_epoch_resumes_its_claim_pool(
    run_script, tmp_path, mode, optimizer
):
    stopped_dir, resumed_dir = tmp_path / "stopped", tmp_path / "resumed"
    args = ("--mode", mode, "--optimizer", optimizer, "--samples", str(SAMPLES), "--epochs", "2")
    run_script("mid_epoch_resume.py", str(stopped_dir), *args, timeout_s=240)
    stopped = [read_json(stopped_dir / f"rank{rank}.json") for rank in (0, 1)]
    saved = stopped[0]["saved"]
    assert saved is not None and saved["epoch"] == 0 and saved["global_step"] > 0
    ckpt = stopped_dir / "ckpt" / f"epoch=0-step={saved['global_step']}.ckpt"
    run_script("mid_epoch_resume.py", str(resumed_dir), *args, "--resume", str(ckpt), timeout_s=240)
    resumed = [read_json(resumed_dir / f"rank{rank}.json") for rank in (0, 1)]

    before = [i for report in stopped for i in report["saved"]["seen"].get("0", [])]
    after = [i for report in resumed for i in report["seen"].get("0", [])]
    assert before and after  # the checkpoint lies inside the epoch
    assert sorted(before + after) == list(range(SAMPLES))  # each sample of the interrupted epoch once
    assert sorted(i for report in resumed for i in report["seen"]["1"]) == list(range(SAMPLES))
    for report in resumed:
        # the resumed epoch ends at the step count of a whole epoch, and the next one adds a whole epoch's
        steps = report["epoch_end_steps"]
        assert steps["1"] == 2 * steps["0"] == report["global_step"]
        assert report["current_epoch"] == 2
    if mode == "asp":  # a step per batch of the pool
        assert resumed[0]["global_step"] == 2 * BATCHES
