"""SyncSwitchCallback with AsyncPSStrategy on 2 CPU processes (``tests/scripts/switch_train.py``)."""

import pytest

from tests import helpers
from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess

PLANNED = ["bsp", "asp", "asp", "bsp", "asp", "asp"]


def expected_lr(epoch):
    # StepLR x0.7 every 8 steps = twice per epoch of 16 BSP steps, whatever the mode; ASP epochs at half the rate.
    return 0.05 * 0.7 ** (2 * epoch) * (0.5 if PLANNED[epoch] == "asp" else 1.0)


def load(out_dir, scenario):
    return [read_json(out_dir / f"{scenario}_rank{rank}.json") for rank in range(2)]


@pytest.fixture(scope="module")
def schedule_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("switch_schedule")
    helpers.run_script("switch_train.py", str(out_dir), "schedule", timeout_s=120)
    return out_dir


def test_fixed_schedule_yields_the_planned_modes_and_lr_schedule(schedule_run):
    for result in load(schedule_run, "schedule"):
        epochs = result["epochs"]
        assert [epochs[str(e)]["mode"] for e in range(6)] == PLANNED
        assert [epochs[str(e)]["mode_at_start"] for e in range(6)] == PLANNED
        assert result["history"] == PLANNED
        assert [(s["epoch"], s["from"], s["to"]) for s in result["switches"]] == [
            (1, "bsp", "asp"),
            (3, "asp", "bsp"),
            (4, "bsp", "asp"),
        ]
        assert all(0 < s["cost_s"] < 30 for s in result["switches"]), "measured, and not a hang"
        assert [epochs[str(e)]["lr"] for e in range(6)] == pytest.approx([expected_lr(e) for e in range(6)])


def test_parameters_agree_across_workers_after_switching_into_bsp(schedule_run):
    rank0, rank1 = load(schedule_run, "schedule")
    for epoch in ("0", "3"):  # the BSP epochs: at their start every worker holds the same parameters
        assert rank0["epochs"][epoch]["param_digest"] == rank1["epochs"][epoch]["param_digest"]
    assert rank0["final_param_digest"] == rank1["final_param_digest"]


@pytest.mark.parametrize("checkpoint_epoch", [2, 4])
def test_resume_mid_schedule_continues_in_the_right_mode(schedule_run, run_script, tmp_path, checkpoint_epoch):
    # epoch=2.ckpt was saved after switching to BSP for epoch 3; epoch=4.ckpt in the middle of the last ASP phase.
    checkpoint = schedule_run / "ckpt" / f"epoch={checkpoint_epoch}.ckpt"
    run_script("switch_train.py", str(tmp_path), "resume", str(checkpoint), timeout_s=120)
    for result in load(tmp_path, "resume"):
        resumed = range(checkpoint_epoch + 1, 6)
        assert sorted(int(e) for e in result["epochs"]) == list(resumed)
        assert [result["epochs"][str(e)]["mode"] for e in resumed] == PLANNED[checkpoint_epoch + 1 :]
        assert [result["epochs"][str(e)]["lr"] for e in resumed] == pytest.approx([expected_lr(e) for e in resumed])
        assert result["history"] == PLANNED


@pytest.mark.timing
def test_greedy_switches_to_asp_on_an_injected_straggler_and_back(run_script, tmp_path):
    run_script("switch_train.py", str(tmp_path), "greedy", timeout_s=120)
    for result in load(tmp_path, "greedy"):
        # Rank 1 is slow in epochs 2-3: detected during epoch 2, recovered during epoch 4.
        assert [result["epochs"][str(e)]["mode"] for e in range(6)] == ["bsp", "bsp", "bsp", "asp", "asp", "bsp"]
        assert [(s["epoch"], s["to"]) for s in result["switches"]] == [(3, "asp"), (5, "bsp")]
