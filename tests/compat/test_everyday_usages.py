"""Everyday Lightning usages under each feature, two CPU ranks on gloo with rank 1 slowed 3 x
(``tests/scripts/compat_cells.py`` runs one feature's cells one after another in the same two processes).

Every cell passes, with the ranks agreeing on the step count and the parameters at the end, or is refused before
the first training batch with a message naming the setting; :data:`REFUSED` is the whole list of refusals (each is
in the docs' limits).
"""

from __future__ import annotations

import pytest

from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess
FEATURES = ("ddp_hetero", "asp", "hybrid", "local", "bsp")
CELLS = (
    "plain", "max_steps", "max_time", "onecycle", "batchnorm", "sync_batchnorm", "limit_train_batches",
    "val_check_interval", "accumulate", "manual", "boring", "transformer",
)  # fmt: skip
ASYNC_PS = ("asp", "hybrid", "local", "bsp")
#: (feature, cell) -> words the refusal must contain (the setting it names)
REFUSED = {
    ("ddp_hetero", "sync_batchnorm"): "SyncBatchNorm",  # torch's own: SyncBatchNorm needs GPU modules
    ("ddp_hetero", "manual"): "automatic_optimization",
    **{(feature, "sync_batchnorm"): "sync_batchnorm=True" for feature in ASYNC_PS},
    **{(feature, "val_check_interval"): "val_check_interval=0.5" for feature in ("asp", "hybrid", "local")},
    **{(feature, "manual"): "automatic_optimization" for feature in ("asp", "hybrid", "local")},
}
MAX_STEPS = 22  # compat_cells.py: an epoch is 24 updates in ASP, so 22 falls in an epoch's last updates


@pytest.mark.parametrize("feature", FEATURES)
def test_every_cell_passes_or_is_refused_before_the_first_batch(run_script, tmp_path, feature):
    run_script("compat_cells.py", str(tmp_path), feature, timeout_s=240)
    ranks = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    assert list(ranks[0]) == list(CELLS)
    for cell in CELLS:
        first, second = (rank[cell] for rank in ranks)
        if (feature, cell) in REFUSED:
            for outcome in (first, second):
                assert outcome["status"] == "refused" and outcome["batches"] == 0, (cell, outcome)
                assert REFUSED[(feature, cell)] in outcome["message"], (cell, outcome["message"])
            continue
        assert first["status"] == second["status"] == "pass", (cell, first, second)
        # every rank ends at the same step with the same (combined) parameters
        assert first["global_step"] == second["global_step"], (cell, first, second)
        assert first["checksum"] == pytest.approx(second["checksum"], rel=1e-6), (cell, first, second)
    outcomes = ranks[0]
    assert outcomes["plain"]["val_acc"] > 0.9
    if feature in ("asp", "bsp", "ddp_hetero"):  # the server refuses updates past max_steps; BSP steps together
        assert outcomes["max_steps"]["global_step"] == MAX_STEPS
    else:  # local SGD and the hybrid's ASP epochs: the epoch that reaches max_steps ends, then the run
        assert outcomes["max_steps"]["global_step"] >= MAX_STEPS
    assert outcomes["max_time"]["epochs"] >= 1
    if (feature, "val_check_interval") not in REFUSED:  # twice an epoch, in step on both ranks
        assert outcomes["val_check_interval"]["validations"] == ranks[1]["val_check_interval"]["validations"] == 4
    if feature == "ddp_hetero":  # the split followed the slow rank, and never under 2 samples with BatchNorm
        assert outcomes["plain"]["split"][1] < outcomes["plain"]["split"][0]
        assert min(outcomes["batchnorm"]["split"]) >= 2
    if feature in ("asp", "local", "hybrid"):  # claims follow speed: the fast rank trains more batches
        assert outcomes["plain"]["batches"] > ranks[1]["plain"]["batches"]
