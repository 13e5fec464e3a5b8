"""End-to-end CPU runs of AsyncPSStrategy: the parameter server in rank 0 and two worker processes.

Each run is ``tests/scripts/ps_train.py`` in a fresh interpreter; its ranks write JSON reports.
"""

import time

import pytest
import torch

from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess

SAMPLES = 1024


def _reports(out, world_size=2):
    return [read_json(out / f"rank{rank}.json") for rank in range(world_size)]


def _mean(values):
    return sum(values) / len(values)


@pytest.mark.timing
@pytest.mark.parametrize("overlap", [False, True], ids=["textbook", "overlap_round_trip"])
def test_asynchronous_training_converges_covers_each_epoch_once_and_follows_speed(run_script, tmp_path, overlap):
    run_script(
        "ps_train.py", str(tmp_path), "--epochs", "3", "--slow-rank", "1", "--sleep-per-sample-s", "0.0005",
        "--overlap-round-trip" if overlap else "--by-name",
        timeout_s=120,
    )  # fmt: skip
    fast, slow = _reports(tmp_path)
    summary = fast["server_summary"]
    assert summary["server"]["updates"] == summary["updates"] and summary["server"]["implementation"] == "fused"
    assert 0 < summary["server"]["busy_fraction"] <= 1
    # every epoch visits each sample exactly once across the two workers
    for epoch in ("0", "1", "2"):
        assert sorted(fast["seen"][epoch] + slow["seen"][epoch]) == list(range(SAMPLES))
    # the slowed worker makes fewer updates; global_step is the server's version on every rank
    assert summary["updates_per_worker"]["0"] > 2 * summary["updates_per_worker"]["1"]
    assert summary["updates"] == sum(summary["updates_per_worker"].values()) == 3 * SAMPLES // 32
    assert fast["global_step"] == slow["global_step"] == fast["version"] == summary["updates"]
    # the last epoch's staleness, gathered over both workers' updates: the same on both ranks, within the server's max
    logged = fast["staleness_logged"]
    assert logged == slow["staleness_logged"] and set(logged) == {"ps/staleness", "ps/staleness_max"}
    assert 0 < logged["ps/staleness"] <= logged["ps/staleness_max"] <= summary["staleness_max"]
    # both end on the server's final parameters, and the model learned
    assert fast["checksum"] == slow["checksum"]
    assert _mean(fast["losses"][-5:]) < 0.3 * _mean(fast["losses"][:5])
    assert fast["val_acc"] > 0.9


def test_max_staleness_bounds_the_lead_and_max_steps_counts_ddps_steps(run_script, tmp_path):
    run_script(
        "ps_train.py", str(tmp_path), "--epochs", "5", "--max-steps", "20", "--max-staleness", "1",
        "--slow-rank", "1", "--sleep-per-sample-s", "0.0003",
        timeout_s=120,
    )  # fmt: skip
    fast, slow = _reports(tmp_path)
    summary = fast["server_summary"]
    assert summary["updates"] == fast["global_step"] == slow["global_step"] == 40  # a DDP step: a batch on each rank
    # no worker went on to a step more than one update ahead of the slowest active one (unbounded, the fast worker
    # would lead by many: see the first test). Neither per-worker totals nor staleness are bounded by timing-free
    # arguments: a worker between epochs holds nobody back, so one that starts an epoch behind lets the other make
    # up to s + 1 + its lag updates meanwhile (staleness 2 at steady state here, more after an epoch boundary).
    assert summary["lead_max"] <= 1


def test_checkpoint_resume_continues_from_the_servers_state(run_script, tmp_path):
    ckpt = tmp_path / "ckpt"
    first, second = tmp_path / "first", tmp_path / "second"
    run_script("ps_train.py", str(first), "--epochs", "2", "--ckpt-dir", str(ckpt), "--momentum", "0.9", timeout_s=120)
    saved = torch.load(ckpt / "last.ckpt", weights_only=False)
    run_script(
        "ps_train.py", str(second), "--epochs", "3", "--resume", str(ckpt / "last.ckpt"), "--momentum", "0.9",
        timeout_s=120,
    )  # fmt: skip
    before, after = _reports(first), _reports(second)
    version = before[0]["version"]
    assert saved["async_ps"] == {"version": version, "mode": "asp"}
    assert saved["global_step"] == version == 2 * SAMPLES // 32
    assert saved["optimizer_states"][0]["state"]  # the server's momentum buffers
    for report in after:
        assert report["start"]["global_step"] == version
        assert report["start"]["checksum"] == before[0]["checksum"]
        assert report["global_step"] == version + SAMPLES // 32
        assert list(report["seen"]) == ["2"]


@pytest.mark.timing
def test_step_schedulers_count_server_updates_in_asp(run_script, tmp_path):
    run_script(
        "ps_train.py", str(tmp_path), "--epochs", "2", "--step-lr", "4", "--slow-rank", "1",
        "--sleep-per-sample-s", "0.0003",
        timeout_s=120,
    )  # fmt: skip
    fast = _reports(tmp_path)[0]
    version = fast["version"]
    assert version == 2 * SAMPLES // 32
    # rank 0 trained fewer batches than the model received updates, yet its scheduler (the server's) counted updates
    assert fast["local_batches"] < version
    assert fast["scheduler_steps"] == [version]
    assert fast["lr"] == pytest.approx(0.1 * 0.9 ** (version // 4))


@pytest.mark.parametrize(("start", "switch_to"), [("asp", "bsp"), ("bsp", "asp")])
def test_switching_mode_between_epochs(run_script, tmp_path, start, switch_to):
    run_script(
        "ps_train.py", str(tmp_path), "--epochs", "3", "--mode", start, "--switch-at-epoch", "0",
        "--switch-to", switch_to, "--momentum", "0.9", "--step-lr", "4",
        timeout_s=120,
    )  # fmt: skip
    reports = _reports(tmp_path)
    updates_per_epoch = {"asp": SAMPLES // 32, "bsp": SAMPLES // (2 * 32)}  # BSP: one update per pair of batches
    expected_steps = updates_per_epoch[start] + 2 * updates_per_epoch[switch_to]
    for report in reports:
        assert report["mode"] == switch_to
        assert 0 < report["last_switch_s"] < 30  # measured, and a broadcast of a small model, not a hang
        assert report["global_step"] == report["version"] == expected_steps
        assert report["val_acc"] > 0.9
    assert reports[0]["checksum"] == reports[1]["checksum"]
    # the step-interval scheduler counted every update of the model: per step in BSP, per server update in ASP
    assert reports[0]["scheduler_steps"] == [expected_steps]
    if switch_to == "bsp":  # entering BSP gave every rank rank 0's schedule, so the replicas stay identical
        assert reports[1]["scheduler_steps"] == [expected_steps]
        assert reports[1]["lr"] == reports[0]["lr"]
    if switch_to == "bsp":  # synchronous epochs: equal batches per rank
        assert all(len(r["seen"][e]) == SAMPLES // 2 for r in reports for e in ("1", "2"))


def test_asp_compensates_momentum_and_entering_bsp_restores_the_users_hyperparameters(run_script, tmp_path):
    result = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "3", "--switch-at-epoch", "1", "--switch-to", "bsp",
        "--momentum", "0.9", "--slow-rank", "1", "--sleep-per-sample-s", "0.0003",
        timeout_s=120,
    )  # fmt: skip
    reports = _reports(tmp_path)
    logged = reports[0]["logged_hyper"]
    # ASP (epochs 0-1): two workers, mean staleness ~1, so the server's momentum is ~1 - 2 * (1 - 0.9) = 0.8, and the
    # learning rate gives each gradient half a BSP update's step, lr / (1 - momentum) = 0.1 / (2 * (1 - 0.9)), never
    # above the user's 0.1. Both are logged as epoch means, and the mean of the capped rule is at most the rule at
    # the mean momentum (the old rule, lr / N_eff, stayed at 0.1 while the momentum was above 0.8)
    for epoch in ("0", "1"):
        momentum, lr = logged[epoch]["ps/momentum_effective"], logged[epoch]["ps/lr_effective"]
        assert 0.7 < momentum < 0.85
        rule = min(0.1, 0.1 * (1 - momentum) / (2 * (1 - 0.9)))
        assert 0.9 * rule < lr <= rule * (1 + 1e-5)
    # BSP (epoch 2): every rank steps with exactly the user's values, and rank 0 logs them (as float32)
    assert logged["2"] == {"ps/momentum_effective": pytest.approx(0.9), "ps/lr_effective": pytest.approx(0.1)}
    for report in reports:
        assert report["hyper_seen"]["2"] == [[0.1, 0.9]]
        assert report["mode"] == "bsp"
    assert reports[0]["checksum"] == reports[1]["checksum"]
    output = result.stdout + result.stderr
    assert output.count("asynchrony_compensation='auto': in ASP with 2") == 1
    assert output.count("Each worker waits for the server's reply (overlap_round_trip=False") == 1  # the script's
    # once, after the first ASP epoch: the sizing rule with the measured numbers (a small model: one shard)
    assert output.count("server sizing from the first ASP epoch") == 1
    assert "keeps server_shards=1 and server_placement='worker'" in output


def test_batchnorm_statistics_are_averaged_where_workers_meet_and_unhandled_optimizers_are_named(run_script, tmp_path):
    """An ASP run with BatchNorm, trained with Adagrad, which asynchrony compensation cannot adapt (no momentum)."""
    result = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "2", "--batchnorm", "--optimizer", "adagrad", timeout_s=120
    )
    reports = _reports(tmp_path)
    assert reports[0]["buffers"], "the model has BatchNorm buffers"
    # the workers trained on different batches, so only averaging makes their running statistics agree
    assert reports[0]["buffers"] == pytest.approx(reports[1]["buffers"], rel=1e-6)
    assert all(report["val_acc"] > 0.9 for report in reports)
    # Adagrad, an adaptive optimizer: the compensation scales its learning rate by 1 / sqrt(2 workers) only, and says
    # so once
    output = result.stdout + result.stderr
    assert output.count("asynchrony_compensation='auto': in ASP the server uses Adagrad's own momentum None") == 1
    assert "lr 0.07071 (yours 0.1, over the square root of the training workers" in output
    logged = reports[0]["logged_hyper"]["0"]
    assert "ps/momentum_effective" not in logged and logged["ps/lr_effective"] == pytest.approx(0.1 / 2**0.5)


def test_early_stopping_ends_every_worker_at_the_same_epoch(run_script, tmp_path):
    run_script("ps_train.py", str(tmp_path), "--epochs", "30", "--early-stop-acc", "0.9", timeout_s=120)
    reports = _reports(tmp_path)
    stopped = {report["current_epoch"] for report in reports}
    assert len(stopped) == 1, "all workers stop together"
    assert stopped.pop() < 30, "EarlyStopping ended the run before max_epochs"
    assert all(report["val_acc"] >= 0.9 for report in reports)


def test_worker_killed_mid_run_ends_the_job_naming_it(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "50", "--kill-rank", "1", "--kill-after", "5",
        "--fault-timeout-s", "20",
        timeout_s=90, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "AsyncPSStrategy lost the worker on rank 1" in proc.stderr


@pytest.mark.timing
def test_worker_dying_while_the_server_waits_at_the_epoch_end_is_named(run_script, tmp_path):
    # rank 1 is slow, so rank 0 claims the rest of the epoch and waits in the epoch-end barrier when rank 1 dies;
    # the barrier breaks with gloo's "connection closed" (no rank named) and the server's thread names the worker
    proc = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "5", "--slow-rank", "1", "--sleep-per-sample-s", "0.01",
        "--kill-rank", "1", "--kill-after", "3", "--fault-timeout-s", "20",
        timeout_s=90, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "AsyncPSStrategy lost the worker on rank 1" in proc.stderr


@pytest.mark.timing
def test_hung_worker_ends_the_job_within_the_fault_timeout_naming_it(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "50", "--kill-rank", "1", "--kill-after", "3", "--hang",
        "--fault-timeout-s", "5",
        timeout_s=90, expect_ok=False,
    )  # fmt: skip
    ended_at = time.time()
    assert proc.returncode != 0
    # the job ends once fault_timeout_s=5 has passed at the epoch's end, not when the worker's hour-long hang ends;
    # the margin (the rest of the epoch, teardown, a loaded machine) is wide, and far below the hang
    hung_for_s = ended_at - read_json(tmp_path / "rank1.lost.json")["killed_at"]
    assert 5 <= hung_for_s < 5 + 45, hung_for_s
    assert "AsyncPSStrategy lost the worker on rank 1: it did not reach the epoch's end within fault_timeout_s=5" in (
        proc.stderr
    )


def test_parameter_server_killed_mid_run_stops_the_workers_naming_it(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--epochs", "50", "--kill-rank", "0", "--kill-after", "5",
        "--fault-timeout-s", "20",
        timeout_s=90, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "AsyncPSStrategy lost the parameter server on rank 0" in proc.stderr


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--manual", "manual optimization (`self.automatic_optimization = False`) in BSP only"),
        ("--two-optimizers", "multiple optimizers"),
    ],
)
def test_unsupported_setups_raise_at_setup(run_script, tmp_path, flag, message):
    proc = run_script("ps_train.py", str(tmp_path), "--devices", "1", flag, timeout_s=60, expect_ok=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_heterogeneous_batches_in_bsp_give_the_batch_weighted_mean_with_or_without_compensation(run_script, tmp_path):
    """With HeteroBatchCallback, a 48/16 split of each global batch of 64 trains exactly like a 32/32 split: the
    strategy weights each rank's gradient by its share (a plain mean would over-weight the 16-sample rank). The
    32/32 run has asynchrony compensation off and the 48/16 run on (the default): BSP is the same either way (with
    momentum, which compensation would change)."""
    uneven, even = tmp_path / "uneven", tmp_path / "even"
    for out, sizes, compensation in ((uneven, "48,16", "auto"), (even, "32,32", "none")):
        run_script(
            "ps_train.py", str(out), "--mode", "bsp", "--hetero", sizes, "--epochs", "2", "--momentum", "0.9",
            "--compensation", compensation,
            timeout_s=120,
        )  # fmt: skip
    uneven_reports, even_reports = _reports(uneven), _reports(even)
    assert [len(r["seen"]["1"]) for r in uneven_reports] == [768, 256]
    assert uneven_reports[0]["checksum"] == uneven_reports[1]["checksum"]
    assert uneven_reports[0]["checksum"] == pytest.approx(even_reports[0]["checksum"], rel=1e-4, abs=1e-5)


def test_manual_optimization_in_bsp_with_heterogeneous_batches_gives_the_batch_weighted_mean(run_script, tmp_path):
    """Manual optimization (``zero_grad``, ``manual_backward``, ``step``) under BSP with HeteroBatchCallback: the
    user's ``step`` goes through the strategy, which weights each rank's gradient by its share, so a 48/16 split
    trains as a 32/32 one."""
    uneven, even = tmp_path / "uneven", tmp_path / "even"
    for out, sizes in ((uneven, "48,16"), (even, "32,32")):
        run_script(
            "ps_train.py", str(out), "--mode", "bsp", "--hetero", sizes, "--epochs", "2", "--momentum", "0.9",
            "--manual",
            timeout_s=120,
        )  # fmt: skip
    uneven_reports, even_reports = _reports(uneven), _reports(even)
    assert [len(r["seen"]["1"]) for r in uneven_reports] == [768, 256]
    assert uneven_reports[0]["global_step"] == even_reports[0]["global_step"] == 32
    assert uneven_reports[0]["checksum"] == uneven_reports[1]["checksum"]
    assert uneven_reports[0]["checksum"] == pytest.approx(even_reports[0]["checksum"], rel=1e-4, abs=1e-5)
