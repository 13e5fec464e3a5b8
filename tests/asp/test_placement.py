"""``PSAdvanced(server_placement=...)``: the pure rules, settings refused at construction, and end-to-end runs
with a dedicated server rank (3 ranks on gloo, ``tests/scripts/ps_train.py`` in fresh interpreters)."""

import time

import pytest

from lightning_hetero.asp.placement import check_server_placement, reserved_only, training_workers
from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.async_ps.engines import ENGINES
from lightning_hetero.measurement import ComputeTimer
from tests.helpers import read_json

SAMPLES = 1024
BATCH = 32


def test_the_default_is_the_server_in_rank_0s_worker():
    assert AsyncPSStrategy().server_placement == "worker"
    assert AsyncPSStrategy(server_placement="dedicated").server_placement == "dedicated"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"server_placement": "process"}, r"server_placement=\.\.\.\) must be one of"),
        ({"server_placement": "dedicated", "server_shards": 2}, r"server_placement='dedicated'\) does not support server_shards=2"),
        ({"server_placement": "dedicated", "on_worker_lost": "continue"}, r"server_placement='dedicated'\) does not support on_worker_lost='continue'"),
    ],
)  # fmt: skip
def test_bad_combinations_fail_at_construction_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AsyncPSStrategy(**kwargs)


def test_the_worker_placement_accepts_what_it_accepted_before():
    AsyncPSStrategy(server_placement="worker", server_shards=2)
    AsyncPSStrategy(server_placement="worker", on_worker_lost="continue")
    check_server_placement("worker", world_size=1)


def test_a_dedicated_server_rank_refuses_hetero_batches():
    strategy = AsyncPSStrategy(server_placement="dedicated")
    with pytest.raises(ValueError, match=r"server_placement='dedicated'\) does not support HeteroBatchCallback"):
        strategy.attach_hetero_batches(ComputeTimer(), lambda: 0.5)


@pytest.mark.parametrize("mode", ["asp", "bsp", "local"])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_only_the_dedicated_server_rank_in_asp_stops_claiming(mode, rank):
    through_server = ENGINES[mode].through_server
    assert reserved_only("dedicated", through_server, rank) == (mode == "asp" and rank == 0)
    assert not reserved_only("worker", through_server, rank)
    assert training_workers(3, "dedicated") == 2 and training_workers(3, "worker") == 3


def _reports(out, world_size=3):
    return [read_json(out / f"rank{rank}.json") for rank in range(world_size)]


def _mean(values):
    return sum(values) / len(values)


@pytest.mark.multiprocess
def test_a_dedicated_server_rank_trains_one_batch_per_epoch_and_the_others_cover_the_rest(run_script, tmp_path):
    run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--server-placement", "dedicated", "--epochs", "3",
        "--batchnorm", "--max-staleness", "2", "--ckpt-dir", str(tmp_path / "ckpt"),
        timeout_s=180,
    )  # fmt: skip
    reports = _reports(tmp_path)
    server = reports[0]
    for epoch in ("0", "1", "2"):
        # every sample exactly once per epoch; rank 0 trained only its reserved batch
        assert sorted(i for r in reports for i in r["seen"][epoch]) == list(range(SAMPLES))
        assert len(server["seen"][epoch]) == BATCH
        assert all(len(r["seen"][epoch]) > 4 * BATCH for r in reports[1:])
    summary = server["server_summary"]
    assert summary["updates_per_worker"]["0"] == 3  # one push per epoch from rank 0
    assert summary["updates"] == 3 * SAMPLES // BATCH
    assert all(r["global_step"] == summary["updates"] for r in reports)
    assert server["checksum"] == reports[1]["checksum"] == reports[2]["checksum"]
    # training made progress on the workers, and the averaged BatchNorm statistics agree on every rank
    losses = reports[1]["losses"]
    assert _mean(losses[-5:]) < 0.3 * _mean(losses[:5])
    assert all(r["val_acc"] > 0.9 for r in reports)
    assert server["buffers"] == pytest.approx(reports[1]["buffers"], rel=1e-6)
    assert server["buffers"] == pytest.approx(reports[2]["buffers"], rel=1e-6)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("epoch=*.ckpt")) == [
        f"epoch={e}-step={(e + 1) * SAMPLES // BATCH}.ckpt" for e in range(3)
    ]


@pytest.mark.multiprocess
def test_a_dedicated_server_rank_trains_its_share_in_bsp_and_stops_after_a_switch_to_asp(run_script, tmp_path):
    run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--server-placement", "dedicated", "--epochs", "3",
        "--mode", "bsp", "--switch-at-epoch", "0", "--switch-to", "asp",
        timeout_s=180,
    )  # fmt: skip
    reports = _reports(tmp_path)
    server = reports[0]
    assert server["mode"] == "asp"
    for epoch in ("0", "1", "2"):
        assert sorted(set(i for r in reports for i in r["seen"][epoch])) == list(range(SAMPLES))
    # BSP: equal round-robin shares (padded by wrapping); ASP after the switch: one batch on rank 0
    assert len(server["seen"]["0"]) == len(reports[1]["seen"]["0"]) == 11 * BATCH
    assert len(server["seen"]["1"]) == len(server["seen"]["2"]) == BATCH
    assert sum(len(r["seen"]["2"]) for r in reports) == SAMPLES
    assert all(r["val_acc"] > 0.9 for r in reports)


@pytest.mark.multiprocess
def test_a_dedicated_server_rank_needs_a_rank_to_train(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--devices", "1", "--server-placement", "dedicated",
        timeout_s=60, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "server_placement='dedicated') needs at least 2 ranks" in proc.stderr


@pytest.mark.multiprocess
def test_a_worker_killed_beside_a_dedicated_server_rank_ends_the_job_naming_it(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--server-placement", "dedicated", "--epochs", "50",
        "--kill-rank", "2", "--kill-after", "5", "--fault-timeout-s", "20",
        timeout_s=120, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "AsyncPSStrategy lost the worker on rank 2" in proc.stderr


@pytest.mark.multiprocess
@pytest.mark.timing
def test_a_hung_worker_beside_a_dedicated_server_rank_is_named_within_twice_the_fault_timeout(run_script, tmp_path):
    """Rank 0 waits for the workers' last batches before the epoch-end meeting, at most fault_timeout_s after the
    first worker got there; the meeting then names the hung worker, not rank 0."""
    proc = run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--server-placement", "dedicated", "--epochs", "50",
        "--kill-rank", "2", "--kill-after", "3", "--hang", "--fault-timeout-s", "5",
        timeout_s=120, expect_ok=False,
    )  # fmt: skip
    ended_at = time.time()
    assert proc.returncode != 0
    hung_for_s = ended_at - read_json(tmp_path / "rank2.lost.json")["killed_at"]
    assert 10 <= hung_for_s < 10 + 45, hung_for_s
    assert "AsyncPSStrategy lost the worker on rank 2: it did not reach the epoch's end within fault_timeout_s=5" in (
        proc.stderr
    )
    assert "lost the parameter server" not in proc.stderr
