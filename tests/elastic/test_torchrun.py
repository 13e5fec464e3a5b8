"""ASP under torchrun's elastic agent: the attempt read from torchrun's environment, the line each attempt prints,
and the recipe end to end (2 agents, a third joins, then dies: the job restarts with 3, then with 2 ranks, each
attempt resuming from the last checkpoint)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_hetero.elastic.torchrun import TorchrunAttempt, TorchrunRestarts, attempt_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from torchrun_job import TorchrunJob, join_and_leave

ENV = {
    "TORCHELASTIC_RUN_ID": "job",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "4",
    "TORCHELASTIC_USE_AGENT_STORE": "False",
}


def test_the_attempt_gives_the_trainer_its_devices_and_nodes():
    attempt = TorchrunAttempt.from_env(ENV)
    assert attempt.trainer_kwargs == {"devices": 2, "num_nodes": 2}
    assert (attempt.node_rank, attempt.world_size, attempt.shares_agent_store) == (1, 4, False)
    assert TorchrunAttempt.from_env({**ENV, "TORCHELASTIC_USE_AGENT_STORE": "True"}).shares_agent_store


def test_outside_torchrun_or_with_uneven_nodes_the_error_names_the_variable():
    with pytest.raises(ValueError, match="GROUP_WORLD_SIZE is not set: start the script with torchrun"):
        TorchrunAttempt.from_env({key: value for key, value in ENV.items() if key != "GROUP_WORLD_SIZE"})
    with pytest.raises(ValueError, match="WORLD_SIZE=5 is not LOCAL_WORLD_SIZE=2 x GROUP_WORLD_SIZE=2"):
        TorchrunAttempt.from_env({**ENV, "WORLD_SIZE": "5"})


def test_the_reason_compares_the_membership_with_the_checkpoints():
    attempt = TorchrunAttempt("job", 1, 3, 0, 2, 1, 2)
    assert attempt_reason(attempt, None) == "restart 1 after a failure, no checkpoint yet"
    assert attempt_reason(attempt, {"world_size": 1, "restart_count": 1}) == "a node joined (world size 1 -> 2)"
    assert attempt_reason(attempt, {"world_size": 3, "restart_count": 0}).startswith("a node left or failed")
    assert attempt_reason(attempt, {"world_size": 2, "restart_count": 0}) == "a worker failed (restart 1 of 3)"
    assert attempt_reason(attempt, {"world_size": 2, "restart_count": 1}) == "the same membership started again"
    assert attempt_reason(TorchrunAttempt("job", 0, 3, 0, 2, 1, 2), None) == "first start"


def test_the_checkpoint_carries_the_membership_into_the_next_attempts_line():
    written = TorchrunRestarts(TorchrunAttempt("job", 0, 3, 0, 2, 1, 2)).state_dict()
    assert written == {"run_id": "job", "restart_count": 0, "num_nodes": 2, "world_size": 2}
    restarts = TorchrunRestarts(TorchrunAttempt("job", 0, 3, 2, 3, 1, 3))
    restarts.load_state_dict(written)
    line = restarts.describe(epoch=4, global_step=64)
    assert "world size 3, resumed at epoch 4, global step 64 from a checkpoint of world size 2" in line
    assert restarts.record["checkpoint_world_size"] == 2 and restarts.record["reason"].startswith("a node joined")


SIGTERM_SCRIPT = """
import os, signal, sys, time
from lightning_hetero.elastic.torchrun import TorchrunAttempt, TorchrunRestarts
restarts = TorchrunRestarts(TorchrunAttempt("job", 0, 3, 0, 1, 1, 1), exit_on_sigterm=sys.argv[1] == "on")
restarts.on_train_start(type("T", (), {"current_epoch": 0, "global_step": 0})(), None)
print("ready", flush=True)
time.sleep(30)
"""


def test_sigterm_from_the_agent_ends_the_worker_at_once():
    """The handler's exit status (143), not the signal's default action (-15), ends the process."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, "on"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        proc.kill()
        proc.wait()


def test_a_node_that_joins_and_one_that_dies_restart_the_asp_job_from_its_checkpoints(tmp_path):
    """The recipe of docs/elastic.md end to end: nodes a and b train; once they have checkpointed (and hold), c
    starts and the agents restart every worker with world size 3, resumed from the checkpoint; once that attempt
    has checkpointed, c's agent and worker are killed, the survivors fail (on_worker_lost="fail") and their agents
    re-rendezvous without it and resume with world size 2. Every epoch of the final state trained every sample
    exactly once, and the global step continued across the attempts."""
    epochs, batches = 4, 16  # 512 samples in batches of 32: one server update per batch
    started = time.monotonic()
    args = ("--epochs", str(epochs), "--step-sleep-s", "0.05", "--hold", str(tmp_path / "hold"))
    with TorchrunJob(tmp_path, worker_args=args) as job:
        statuses = join_and_leave(job, hold=tmp_path / "hold", timeout_s=150)
        attempts, final = job.attempts(), job.final()
        logs = job.tails()
        printed = "".join(path.read_text() for path in sorted(tmp_path.glob("*.log")))
    assert statuses == {"a": 0, "b": 0, "c": None}, logs
    assert [a["world_size"] for a in attempts] == [2, 3, 2], logs
    first, joined, left = attempts
    assert first["reason"] == "first start" and first["global_step"] == 0
    assert joined["reason"] == "a node joined (world size 2 -> 3)" and joined["checkpoint_world_size"] == 2
    assert left["reason"] == "a node left or failed (world size 3 -> 2)" and left["checkpoint_world_size"] == 3
    assert 0 < joined["epoch"] < left["epoch"] < epochs
    assert joined["global_step"] == joined["epoch"] * batches and left["global_step"] == left["epoch"] * batches
    assert final["world_size"] == 2 and final["current_epoch"] == epochs and final["global_step"] == epochs * batches
    assert sorted(final["counts"]) == [str(epoch) for epoch in range(epochs)]
    assert all(count == 1 for counts in final["counts"].values() for count in counts)
    assert printed.count("torchrun job 'asp-job': ") == 3  # one line per attempt, on rank 0
    assert f"world size 3, resumed at epoch {joined['epoch']}, global step {joined['global_step']}" in printed
    assert time.monotonic() - started < 150
