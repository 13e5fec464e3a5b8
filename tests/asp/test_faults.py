"""Fault records and epoch-end meetings over a store (threads on a HashStore), then killed ranks in real jobs."""

import threading
import time

import pytest
import torch
import torch.distributed as dist

from lightning_hetero.asp.faults import FaultBoard, attend_meeting, coordinate_meeting
from lightning_hetero.asp.protocol import PeerLostError
from tests.helpers import read_json


def _attend_in_threads(board, meeting, ranks, timeout_s):
    results = {}

    def attend(rank):
        try:
            results[rank] = attend_meeting(board, meeting, rank, timeout_s)
        except PeerLostError as err:
            results[rank] = err

    threads = [threading.Thread(target=attend, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    return threads, results


def test_the_first_recorded_fault_wins():
    board = FaultBoard(dist.HashStore())
    board.record(PeerLostError(2, "worker", "Connection closed by peer"))
    assert board.record(PeerLostError(0, "parameter server", "it shut down")).rank == 2
    assert str(board.read()) == "AsyncPSStrategy lost the worker on rank 2: Connection closed by peer"


@pytest.mark.timing
def test_a_meeting_drops_a_rank_lost_while_waiting_and_announces_the_rest():
    board = FaultBoard(dist.HashStore())
    lost = set()
    threads, results = _attend_in_threads(board, 0, [1], timeout_s=10)
    threading.Timer(0.2, lambda: lost.add(2)).start()  # rank 2 never arrives; it is declared lost meanwhile
    members = coordinate_meeting(board, 0, lambda: [r for r in (0, 1, 2) if r not in lost], timeout_s=10)
    for thread in threads:
        thread.join()
    assert members == results[1] == [0, 1]


@pytest.mark.timing
def test_a_rank_that_does_not_arrive_is_named_to_everybody():
    board = FaultBoard(dist.HashStore())
    threads, results = _attend_in_threads(board, 0, [1], timeout_s=0.3)
    with pytest.raises(PeerLostError, match=r"rank 2: it did not reach the epoch.s end within fault_timeout_s=0\.3"):
        coordinate_meeting(board, 0, lambda: [0, 1, 2], timeout_s=0.3)
    for thread in threads:
        thread.join()
    assert results[1].rank == 2


@pytest.mark.timing
def test_rank_0_abandoning_a_meeting_releases_the_others_with_the_first_fault():
    board = FaultBoard(dist.HashStore())
    threads, results = _attend_in_threads(board, 0, [1, 2], timeout_s=10)
    time.sleep(0.1)

    def check():
        raise board.record(PeerLostError(3, "worker", "Connection closed by peer"))

    with pytest.raises(PeerLostError, match="rank 3"):
        coordinate_meeting(board, 0, lambda: [0, 1, 2, 3], timeout_s=10, check=check)
    for thread in threads:
        thread.join()
    assert results[1].rank == results[2].rank == 3


@pytest.mark.timing
def test_a_rank_0_that_never_comes_is_blamed():
    board = FaultBoard(dist.HashStore())
    start = time.monotonic()
    with pytest.raises(PeerLostError, match="parameter server on rank 0: it did not reach"):
        attend_meeting(board, 0, rank=1, timeout_s=0.1)
    assert time.monotonic() - start < 10


# ---------------------------------------------------------------- killed ranks in real jobs (one process per rank)

FAULT_TIMEOUT_S = 15
SAMPLES = 1024


def _survivors(results, killed):
    return {rank: result for rank, result in enumerate(results) if rank != killed}


def _three_nodes(run_ranks, tmp_path, *args, timeout_s=240):
    """``ps_train.py`` as a job of three single-process nodes, with ``fault_timeout_s=FAULT_TIMEOUT_S``."""
    return run_ranks(
        "ps_train.py", 3, str(tmp_path), "--num-nodes", "3", "--devices", "1", *args,
        "--fault-timeout-s", str(FAULT_TIMEOUT_S),
        timeout_s=timeout_s,
    )  # fmt: skip


def _kill_and_check_every_survivor_fails_naming_it(run_ranks, tmp_path, killed, message, *args):
    """Kill rank ``killed`` in its 5th batch of a long job; every other rank must fail cleanly with ``message``."""
    results = _three_nodes(
        run_ranks, tmp_path, "--epochs", "50", "--kill-rank", str(killed), "--kill-after", "5", *args
    )
    killed_at = read_json(tmp_path / f"rank{killed}.lost.json")["killed_at"]
    for result in _survivors(results, killed).values():
        _assert_clean_failure(result, message, killed_at)


def _assert_clean_failure(result, message, killed_at):
    assert result.returncode == 1, result.stderr[-3000:]  # a Python error, not a signal (no SIGABRT at exit)
    assert message in result.stderr, result.stderr[-3000:]
    assert "lost the parameter server" not in result.stderr or "rank 0" in message
    assert "terminate called" not in result.stderr
    assert result.ended_at - killed_at < FAULT_TIMEOUT_S + 30


@pytest.mark.timing
@pytest.mark.multiprocess
def test_worker_killed_while_another_is_inside_a_long_step_every_survivor_names_it(run_ranks, tmp_path):
    # rank 2 is a straggler (~1.6 s per step): when rank 1 dies, rank 0 fails at once while rank 2 is still inside
    # its step; rank 2 must learn that rank 1 was lost, not that rank 0 shut down because of it
    _kill_and_check_every_survivor_fails_naming_it(
        run_ranks, tmp_path, 1, "AsyncPSStrategy lost the worker on rank 1",
        "--slow-rank", "2", "--sleep-per-sample-s", "0.05",
    )  # fmt: skip


@pytest.mark.timing
@pytest.mark.multiprocess
def test_server_killed_every_worker_names_rank_0(run_ranks, tmp_path):
    _kill_and_check_every_survivor_fails_naming_it(
        run_ranks, tmp_path, 0, "AsyncPSStrategy lost the parameter server on rank 0",
        "--slow-rank", "2", "--sleep-per-sample-s", "0.02",
    )  # fmt: skip


@pytest.mark.timing
@pytest.mark.multiprocess
def test_start_up_waits_startup_timeout_s_not_fault_timeout_s_and_names_it(run_ranks, tmp_path):
    # only rank 0 of 2 starts: with fault_timeout_s=1 start-up still waits startup_timeout_s, then names it
    [result] = run_ranks(
        "ps_train.py", 2, str(tmp_path), "--num-nodes", "2", "--devices", "1", "--fault-timeout-s", "1",
        "--startup-timeout-s", "8",
        start=1, timeout_s=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "did not all join within startup_timeout_s=8" in result.stderr
    assert result.elapsed_s > 8


@pytest.mark.timing
@pytest.mark.multiprocess
def test_server_killed_ends_an_elastic_job_too_naming_rank_0(run_ranks, tmp_path):
    _kill_and_check_every_survivor_fails_naming_it(
        run_ranks, tmp_path, 0, "AsyncPSStrategy lost the parameter server on rank 0", "--on-worker-lost", "continue"
    )


@pytest.mark.multiprocess
def test_elastic_asp_trains_on_without_a_lost_worker_and_each_epoch_covers_every_sample_once(run_ranks, tmp_path):
    ckpt = tmp_path / "ckpt"
    results = _three_nodes(
        run_ranks, tmp_path, "--epochs", "3", "--kill-rank", "2", "--kill-after", "4", "--on-worker-lost", "continue",
        "--ckpt-dir", str(ckpt),
        timeout_s=300,
    )  # fmt: skip
    for result in _survivors(results, killed=2).values():
        assert result.returncode == 0, result.stderr[-3000:]
    assert "AsyncPSStrategy lost the worker on rank 2 (" in results[0].stderr
    assert "continuing with 2 workers (on_worker_lost='continue')" in results[0].stderr
    survivors = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    # what rank 2 pushed before it died: its first 3 batches of 32 (the 4th, in its hands, is not in it); in which
    # epoch it died depends on how many chunks it claimed before the others, so the test does not assume it
    pushed = read_json(tmp_path / "rank2.lost.json")["pushed"]
    assert sum(len(seen) for seen in pushed.values()) == 3 * 32
    for epoch in ("0", "1", "2"):
        seen = survivors[0]["seen"][epoch] + survivors[1]["seen"][epoch] + pushed.get(epoch, [])
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch} did not cover every sample exactly once"
    # one update per batch of 32: global_step is the server's version on every survivor and in the checkpoint
    updates = 3 * SAMPLES // 32
    assert [report["global_step"] for report in survivors] == [updates, updates]
    assert survivors[0]["server_summary"]["updates"] == updates
    assert torch.load(ckpt / "last.ckpt", weights_only=False)["async_ps"] == {"version": updates, "mode": "asp"}
    assert survivors[0]["checksum"] == survivors[1]["checksum"]
    assert all(report["val_acc"] > 0.9 for report in survivors)
    # the last validation ran over the whole validation set, split between the two survivors
    val_seen = survivors[0]["val_seen"] + survivors[1]["val_seen"]
    assert sorted(val_seen) == list(range(SAMPLES // 4))


@pytest.mark.multiprocess
def test_switching_to_bsp_after_a_lost_worker_fails_with_a_clear_error(run_ranks, tmp_path):
    results = _three_nodes(
        run_ranks, tmp_path, "--epochs", "3", "--kill-rank", "2", "--kill-after", "4", "--on-worker-lost", "continue",
        "--switch-at-epoch", "1", "--switch-to", "bsp",
        timeout_s=300,
    )  # fmt: skip
    for result in _survivors(results, killed=2).values():
        assert result.returncode == 1, result.stderr[-3000:]
        assert "AsyncPSStrategy cannot switch to BSP after losing rank(s) [2]" in result.stderr
        assert "resume from the last checkpoint" in result.stderr


@pytest.mark.multiprocess
def test_a_rank_lost_in_bsp_ends_the_job_and_a_restart_resumes_split_mode_and_version(run_script, tmp_path):
    """The recovery path for BSP (and for a lost rank 0): restart every rank and resume from the last checkpoint."""
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    # ASP for epoch 0, then BSP with a 48/16 split of each global batch of 64 (16 steps per epoch); rank 1 dies in
    # its 5th batch of epoch 2, after the checkpoint of epoch 1
    proc = run_script(
        "ps_train.py", str(first), "--epochs", "4", "--hetero", "48,16", "--switch-at-epoch", "0",
        "--switch-to", "bsp", "--ckpt-dir", str(ckpt), "--kill-rank", "1", "--kill-after", str(16 + 16 + 5),
        "--fault-timeout-s", str(FAULT_TIMEOUT_S),
        timeout_s=240, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "AsyncPSStrategy lost the worker on rank 1" in proc.stderr
    saved = torch.load(ckpt / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 1 and saved["async_ps"]["mode"] == "bsp"
    version = saved["async_ps"]["version"]
    # restarted with another initial split and mode: the checkpoint's win
    run_script(
        "ps_train.py", str(second), "--epochs", "4", "--hetero", "32,32", "--resume", str(ckpt / "last.ckpt"),
        timeout_s=240,
    )  # fmt: skip
    after = [read_json(second / f"rank{rank}.json") for rank in (0, 1)]
    for report in after:
        assert report["mode"] == "bsp"
        assert report["start"]["global_step"] == version
        assert report["global_step"] == version + 2 * SAMPLES // 64
        assert list(report["seen"]) == ["2", "3"]
    assert [len(report["seen"]["2"]) for report in after] == [768, 256]


@pytest.mark.multiprocess
def test_elastic_asp_under_lightnings_launcher_outlives_its_process_observer(run_script, tmp_path):
    # Lightning's launcher kills every process a few seconds after any child exits; the strategy takes the lost
    # child out of its watch, so the job goes on and ends normally
    proc = run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--epochs", "2", "--kill-rank", "2", "--kill-after", "4",
        "--on-worker-lost", "continue", "--fault-timeout-s", str(FAULT_TIMEOUT_S),
        timeout_s=240,
    )  # fmt: skip
    assert "continuing with 2 workers" in proc.stderr
    survivors = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    pushed = read_json(tmp_path / "rank2.lost.json")["pushed"]
    for epoch in ("0", "1"):
        seen = survivors[0]["seen"][epoch] + survivors[1]["seen"][epoch] + pushed.get(epoch, [])
        assert sorted(seen) == list(range(SAMPLES))


@pytest.mark.timing
@pytest.mark.multiprocess
def test_under_lightnings_launcher_a_rank_inside_a_long_step_names_the_worker_lost_first(run_script, tmp_path):
    proc = run_script(
        "ps_train.py", str(tmp_path), "--devices", "3", "--epochs", "50", "--kill-rank", "1", "--kill-after", "5",
        "--slow-rank", "2", "--sleep-per-sample-s", "0.05", "--fault-timeout-s", str(FAULT_TIMEOUT_S),
        timeout_s=240, expect_ok=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "[rank2]: lightning_hetero.asp.protocol.PeerLostError: AsyncPSStrategy lost the worker on rank 1" in (
        proc.stderr
    )
    assert "lost the parameter server" not in proc.stderr
    assert "terminate called" not in proc.stderr
