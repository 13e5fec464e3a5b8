"""Everyday Lightning usages under each feature, two CPU ranks on gloo with rank 1 slowed 3 x
(``tests/scripts/compat_cells.py`` runs one feature's cells one after another in the same two processes), with
Lightning's defaults on as users run it: progress bar, model summary, default logger and checkpointing.

Every cell passes, with the ranks agreeing on the step count and the parameters at the end, or is refused before
the first training batch with a message naming the setting; :data:`REFUSED` is the whole list of refusals (each is
in the docs' limits). The cells users meet first (an MLP, a small CNN and a transformer with SGD, Adam and AdamW,
a OneCycle schedule, validation inside an epoch, resuming) run in every test run; the whole matrix and the
accuracy against DDP (the median of three seeds) run under the ``compat_full`` marker, which ``.ci/run`` runs.
"""

from __future__ import annotations

import statistics

import pytest

from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess
FEATURES = ("ddp_hetero", "asp", "hybrid", "local", "bsp")
CELLS = (
    "plain", "max_steps", "max_time", "onecycle", "batchnorm", "sync_batchnorm", "limit_train_batches",
    "val_check_interval", "val_check_batches", "accumulate", "manual", "boring", "transformer", "cnn",
    "resume", "early_stopping", "steplr", "plateau", "clip", "bf16", "torchmetrics", "evaluate", "csv_logger",
    "fast_dev_run", "workers", "dict_batch", "frozen_unused", "swa", "compile",
)  # fmt: skip
ASYNC_PS = ("asp", "hybrid", "local", "bsp")
#: (feature, cell) -> words the refusal must contain (the setting it names)
REFUSED = {
    ("ddp_hetero", "sync_batchnorm"): "SyncBatchNorm",  # torch's own: SyncBatchNorm needs GPU modules
    **{(feature, "sync_batchnorm"): "sync_batchnorm=True" for feature in ASYNC_PS},
    **{(feature, "manual"): "automatic_optimization" for feature in ("asp", "hybrid", "local")},
}
MAX_STEPS = 22  # compat_cells.py: an epoch is 24 updates in ASP, so 22 falls in an epoch's last updates


#: the cells every test run runs, each with SGD unless it names its optimizer ("cell:optimizer")
FIRST_CELLS = (
    "plain", "plain:adam", "cnn:adam", "cnn:adamw", "transformer:adam", "onecycle", "val_check_interval", "resume",
)  # fmt: skip


@pytest.mark.parametrize("feature", FEATURES)
def test_the_first_cells_users_meet_pass_with_lightnings_defaults(run_script, tmp_path, feature):
    run_script("compat_cells.py", str(tmp_path), feature, *FIRST_CELLS, timeout_s=240)
    ranks = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    for cell in FIRST_CELLS:
        first, second = (rank[cell] for rank in ranks)
        assert first["status"] == second["status"] == "pass", (cell, first, second)
        assert first["global_step"] == second["global_step"], (cell, first, second)
        assert first["checksum"] == pytest.approx(second["checksum"], rel=1e-6), (cell, first, second)
    outcomes = ranks[0]
    for cell in ("plain", "plain:adam", "cnn:adam", "cnn:adamw"):  # Adam and AdamW learn in every mode
        assert outcomes[cell]["val_acc"] > 0.85, (cell, outcomes[cell])
    assert outcomes["transformer:adam"]["train_loss"] < 2.3, outcomes["transformer:adam"]  # ln 16 = 2.77 at chance
    # the per-step schedule follows the job's progress: it ends annealed where DDP's ends (4.4e-4: both under 1e-3;
    # rank 0's optimizer, which ASP's server follows)
    assert outcomes["onecycle"]["lr"] < 1e-3, outcomes["onecycle"]
    assert outcomes["val_check_interval"]["validations"] == 4
    resume = outcomes["resume"]
    assert resume["fit_starts"] == [0, resume["first_fit_steps"]] and resume["epochs"] == 2


@pytest.mark.compat_full
@pytest.mark.parametrize("feature", FEATURES)
def test_every_cell_passes_or_is_refused_before_the_first_batch(run_script, tmp_path, feature):
    # aot_eager: dynamo's tracing, guards and recompiles and AOTAutograd without inductor's C++ build (seconds a rank)
    run_script("compat_cells.py", str(tmp_path), feature, *CELLS, "--compile-backend", "aot_eager", timeout_s=240)
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
    # max_steps trains what DDP's steps train: ASP and local SGD count one rank's batch a step (2 x MAX_STEPS); the
    # server refuses updates past it; BSP (and the hybrid's first epoch) steps together
    if feature in ("asp", "local"):
        assert outcomes["max_steps"]["global_step"] == 2 * MAX_STEPS
    else:
        assert outcomes["max_steps"]["global_step"] == MAX_STEPS
    assert outcomes["max_time"]["epochs"] >= 1
    # twice an epoch (val_check_interval=0.5), three times (every 8 of DDP's 24 batches a rank), on every rank at
    # the same step with the same parameters (ASP: the same server version; local SGD: a round's end)
    for cell, validations in (("val_check_interval", 4), ("val_check_batches", 6)):
        assert outcomes[cell]["validations"] == ranks[1][cell]["validations"] == validations, cell
        assert outcomes[cell]["validated"] == ranks[1][cell]["validated"], cell
    if feature == "ddp_hetero":  # the split followed the slow rank, and never under 2 samples with BatchNorm
        assert outcomes["plain"]["split"][1] < outcomes["plain"]["split"][0]
        assert outcomes["manual"]["split"][1] < outcomes["manual"]["split"][0]
        assert min(outcomes["batchnorm"]["split"]) >= 2
    if feature in ("asp", "local", "hybrid"):  # claims follow speed: the fast rank trains more batches
        assert outcomes["plain"]["batches"] > ranks[1]["plain"]["batches"]
    for rank in ranks:
        check_more_cells(feature, rank)


def check_more_cells(feature: str, outcomes: dict) -> None:
    """What each of the rest of the usages must show on a rank (both ranks also agree on step and parameters)."""
    checks = {cell: outcome.get("checks", {}) for cell, outcome in outcomes.items()}
    # resume: the second fit starts where the first, saved as "last", ended, and trains its second epoch
    resume = outcomes["resume"]
    assert resume["fit_starts"] == [0, resume["first_fit_steps"]] and resume["first_fit_steps"] > 0
    assert resume["global_step"] > resume["first_fit_steps"] and resume["epochs"] == 2
    # EarlyStopping (val_loss falls by less than min_delta after the first epoch): stops at the second of 4 epochs
    assert checks["early_stopping"]["stopped_epoch"] == 1 and outcomes["early_stopping"]["epochs"] == 2
    assert checks["steplr"]["lr"] == pytest.approx(0.1 * 0.5**2)  # halved at each of the 2 epochs' ends
    assert checks["plateau"]["lr"] == pytest.approx(0.05)  # val_loss did not improve by 1: cut once
    # clipping reached the step: the model's clipping hook ran at every step, and left the norm at the limit
    assert checks["clip"]["clip_calls"] >= outcomes["clip"]["batches"] > 0
    assert checks["clip"]["clipped_norm"] == pytest.approx(0.05, rel=1e-3)
    assert checks["bf16"]["dtype"] == "torch.bfloat16"
    manual = outcomes["manual"]
    if manual["status"] == "pass":  # manual optimization: one optimizer step a batch, and it learns
        assert manual["global_step"] == manual["batches"] and manual["val_acc"] > 0.9, manual
    for cell in ("plain", "torchmetrics", "dict_batch", "workers", "frozen_unused", "resume", "bf16", "swa", "compile"):
        if cell in outcomes:
            assert outcomes[cell]["val_acc"] > 0.9, cell
    assert checks["torchmetrics"]["metric_acc"] == pytest.approx(outcomes["torchmetrics"]["val_acc"], abs=1e-6)
    evaluate = checks["evaluate"]  # validate, test and predict after fit; every validation sample predicted
    assert evaluate["val_acc"] > 0.9 and evaluate["test_acc"] > 0.9
    assert evaluate["predicted"] == evaluate["val_samples"] // 2
    if "csv" in checks["csv_logger"]:  # rank 0 writes the log: a row per validation with val_acc
        header, *rows = checks["csv_logger"]["csv"]
        assert "val_acc" in header.split(",") and len(rows) >= 2
    fast = outcomes["fast_dev_run"]
    assert fast["batches"] == 1 and fast["validations"] == 1
    if "workers" in checks:
        assert checks["workers"]["workers"] == 1
        # beside AsyncPSStrategy's threads the workers start from a fork server; under DDP as the user chose
        strategy_threads = feature in ASYNC_PS
        assert checks["workers"]["start_method"] == ("forkserver" if strategy_threads else None), checks["workers"]
    if "frozen_unused" in checks:  # the frozen layer and the unused parameter did not move
        frozen = checks["frozen_unused"]
        assert frozen["frozen"] == frozen["frozen_before"] and frozen["unused"] == frozen["unused_before"]
    # torch.compile'd network: trained as above, in a bounded number of graphs (HeteroBatch's sizes change: the
    # batch dimension is marked dynamic)
    assert 0 < checks["compile"]["graphs"] <= 4, checks["compile"]
    swa = checks["swa"]
    assert swa["n_averaged"] >= 2  # the fit ends with SWA's average (ASP: no server update after the ranks met)
    assert swa["averaged"] == pytest.approx(outcomes["swa"]["checksum"], rel=1e-6)


#: the models judged against DDP with an adaptive optimizer, each over three seeds: the modes' timing picks a
#: different run each time, so the median judges the mode, not one run.
ADAPTIVE_CELLS = ("plain", "cnn", "transformer")
SEEDS = (0, 1, 2)


@pytest.mark.compat_full
@pytest.mark.parametrize(
    "optimizer", ["adam"]
)  # AdamW: the first cells, and benchmarks/results/compat_adaptive_asp.json
def test_adaptive_optimizers_train_as_under_ddp_in_every_mode(run_script, tmp_path, optimizer):
    cells = [f"{cell}@{seed}" for cell in ADAPTIVE_CELLS for seed in SEEDS]
    results = {}
    for feature in ("ddp", *FEATURES):
        run_script("compat_cells.py", str(tmp_path / feature), feature, *cells, "--optimizer", optimizer, timeout_s=240)
        results[feature] = read_json(tmp_path / feature / "rank0.json")

    def median(feature: str, cell: str, key: str) -> float:
        return statistics.median(results[feature][f"{cell}@{seed}"][key] for seed in SEEDS)

    def seeds(cell: str, key: str) -> dict:  # what a failure shows: each feature's value at every seed
        return {feature: [round(results[feature][f"{cell}@{seed}"][key], 4) for seed in SEEDS] for feature in results}

    for feature in FEATURES:  # within 5 points of DDP's accuracy, and the transformer's loss near DDP's
        for cell in ("plain", "cnn"):
            assert median(feature, cell, "val_acc") > median("ddp", cell, "val_acc") - 0.05, (
                feature,
                cell,
                seeds(cell, "val_acc"),
            )
        ddp_loss = median("ddp", "transformer", "train_loss")
        loss = median(feature, "transformer", "train_loss")
        assert loss < max(2 * ddp_loss, ddp_loss + 0.2), (feature, seeds("transformer", "train_loss"))
