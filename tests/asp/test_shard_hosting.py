"""End-to-end CPU runs of PSAdvanced(server_shards=2): shard 0 in rank 0, shard 1 in rank 1, three workers.

Each run is ``tests/scripts/ps_train.py`` in a fresh interpreter (or one process per node for the killed host); its
ranks write JSON reports.
"""

import math

import pytest
import torch

from lightning_hetero.asp.layout import flatten_model
from lightning_hetero.asp.shard_hosting import ShardHosting
from lightning_hetero.asp.sharding import Shard
from lightning_hetero.async_ps.runtime.bootstrap import shard_server
from tests.helpers import read_json

pytestmark = pytest.mark.multiprocess

SAMPLES = 1024
FAULT_TIMEOUT_S = 20.0


def _reports(out, world_size=3):
    return [read_json(out / f"rank{rank}.json") for rank in range(world_size)]


def _train(run_script, out, *args, devices=3, shards=2, timeout_s=180):
    return run_script(
        "ps_train.py", str(out), "--devices", str(devices), "--server-shards", str(shards), *args, timeout_s=timeout_s
    )


def _mean(values):
    return sum(values) / len(values)


@pytest.mark.parametrize("overlap", [False, True], ids=["textbook", "overlap_round_trip"])
def test_two_shards_train_every_sample_once_and_apply_every_update_on_both(run_script, tmp_path, overlap):
    _train(run_script, tmp_path, "--epochs", "2", "--momentum", "0.9", *(["--overlap-round-trip"] * overlap))
    reports = _reports(tmp_path)
    summary = reports[0]["server_summary"]
    updates = 2 * SAMPLES // 32
    for epoch in ("0", "1"):
        assert sorted(sample for r in reports for sample in r["seen"][epoch]) == list(range(SAMPLES))
    # every push reached both shards: equal versions, each applied every update, and the ranks agree on the model
    assert [shard["updates"] for shard in summary["shards"]] == [updates, updates]
    assert summary["shards"][0]["updates_per_worker"] == summary["shards"][1]["updates_per_worker"]
    assert all(r["global_step"] == r["version"] == updates for r in reports)
    assert reports[0]["checksum"] == reports[1]["checksum"] == reports[2]["checksum"]
    assert all(0 < shard["busy_fraction"] <= 1 for shard in summary["shards"])
    assert _mean(reports[0]["losses"][-5:]) < 0.3 * _mean(reports[0]["losses"][:5])
    assert reports[0]["val_acc"] > 0.9


def test_max_staleness_holds_at_every_shard(run_script, tmp_path):
    _train(
        run_script, tmp_path, "--epochs", "3", "--max-staleness", "1", "--slow-rank", "2",
        "--sleep-per-sample-s", "0.0003",
    )  # fmt: skip
    shards = _reports(tmp_path)[0]["server_summary"]["shards"]
    assert len(shards) == 2
    assert all(shard["lead_max"] <= 1 for shard in shards)


def test_a_sharded_checkpoint_resumes_unsharded_and_back(run_script, tmp_path):
    sharded, unsharded = tmp_path / "sharded_ckpt", tmp_path / "unsharded_ckpt"
    momentum = ("--momentum", "0.9")
    _train(run_script, tmp_path / "a", "--epochs", "1", "--ckpt-dir", str(sharded), *momentum)
    _train(run_script, tmp_path / "b", "--epochs", "2", "--resume", str(sharded / "last.ckpt"), "--ckpt-dir",
           str(unsharded), *momentum, shards=1)  # fmt: skip
    _train(run_script, tmp_path / "c", "--epochs", "3", "--resume", str(unsharded / "last.ckpt"), *momentum)
    first = torch.load(sharded / "last.ckpt", weights_only=False)
    second = torch.load(unsharded / "last.ckpt", weights_only=False)
    a, b, c = (_reports(tmp_path / name) for name in "abc")
    per_epoch = SAMPLES // 32
    # the sharded checkpoint is the unsharded format: every parameter and its momentum buffer, shard 0's version
    assert first["async_ps"] == {"version": per_epoch, "mode": "asp"}
    assert sorted(first["optimizer_states"][0]["state"]) == [0, 1, 2, 3]
    assert all("momentum_buffer" in s for s in first["optimizer_states"][0]["state"].values())
    assert first["optimizer_states"][0]["param_groups"][0]["params"] == [0, 1, 2, 3]
    # each resume starts from the saved server state and counts on
    assert all(r["start"]["checksum"] == a[0]["checksum"] and r["start"]["global_step"] == per_epoch for r in b)
    assert all(r["start"]["checksum"] == b[0]["checksum"] and r["start"]["global_step"] == 2 * per_epoch for r in c)
    assert second["async_ps"]["version"] == 2 * per_epoch
    assert all(r["global_step"] == 3 * per_epoch for r in c)
    assert c[0]["server_summary"]["shards"][1]["updates"] == per_epoch  # shard 1 loaded the version and went on
    assert c[0]["val_acc"] > 0.9


@pytest.mark.parametrize(("start", "switch_to"), [("asp", "bsp"), ("bsp", "asp")])
def test_switching_mode_with_shards(run_script, tmp_path, start, switch_to):
    _train(
        run_script, tmp_path, "--epochs", "3", "--mode", start, "--switch-at-epoch", "0", "--switch-to", switch_to,
        "--momentum", "0.9", "--step-lr", "4",
    )  # fmt: skip
    reports = _reports(tmp_path)
    # BSP: one update per step; each of the 3 ranks has ceil(1024 / 3) = 342 samples, 11 batches
    updates_per_epoch = {"asp": SAMPLES // 32, "bsp": math.ceil(math.ceil(SAMPLES / 3) / 32)}
    expected = updates_per_epoch[start] + 2 * updates_per_epoch[switch_to]
    for report in reports:
        assert report["mode"] == switch_to
        assert report["global_step"] == report["version"] == expected
        assert report["val_acc"] > 0.9
        assert report["checksum"] == reports[0]["checksum"]
    # the step schedule counted every update; in ASP each shard's host steps it by its shard's updates
    assert reports[0]["scheduler_steps"] == [expected]
    if switch_to == "asp":
        assert reports[1]["scheduler_steps"] == [expected]
        assert reports[1]["lr"] == reports[0]["lr"]


@pytest.mark.timing
def test_a_killed_shard_host_is_named_by_every_survivor_and_nothing_hangs(run_ranks, tmp_path):
    results = run_ranks(
        "ps_train.py", 3, str(tmp_path), "--num-nodes", "3", "--devices", "1", "--server-shards", "2",
        "--epochs", "50", "--kill-rank", "1", "--kill-after", "5", "--fault-timeout-s", str(FAULT_TIMEOUT_S),
        timeout_s=240,
    )  # fmt: skip
    killed_at = read_json(tmp_path / "rank1.lost.json")["killed_at"]
    for rank in (0, 2):
        result = results[rank]
        assert result.returncode == 1, result.stderr[-3000:]
        assert "AsyncPSStrategy lost the parameter server on rank 1" in result.stderr, result.stderr[-3000:]
        assert "terminate called" not in result.stderr
        assert result.ended_at - killed_at < FAULT_TIMEOUT_S + 30


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--devices", "2", "--server-shards", "3"), "server_shards=3) needs at least 3 ranks"),
        (("--devices", "2", "--server-shards", "2", "--on-worker-lost", "continue"), "does not support on_worker_lost"),
    ],
)
def test_bad_shard_settings_are_named(run_script, tmp_path, args, message):
    proc = run_script("ps_train.py", str(tmp_path), *args, timeout_s=90, expect_ok=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_a_frozen_parameter_in_the_optimizer_is_left_out_of_the_server_and_kept_in_its_states():
    """The optimizer holds a frozen layer: the server leaves it out, yet loads and hands out states laid out like the
    optimizer's (a switch from BSP, a resume, a switch back)."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # momentum buffers for the trainable layer only
    flat = flatten_model(model)  # the trainable parameters: the second layer's
    index_of = {id(p): i for i, p in enumerate(flat.params)}
    group_indices = [[index_of.get(id(p), -1) for p in group["params"]] for group in optimizer.param_groups]
    assert group_indices == [[-1, -1, 0, 1]]
    server = shard_server(flat, optimizer, Shard(0, 0, flat.flat.numel(), 0, 2), world_size=2)
    hosting = ShardHosting(rank=0, shards=None, group_indices=group_indices, fault_timeout_s=1.0)
    hosting.host(server, loop=None)
    hosting.load(flat.flat, optimizer.state_dict(), version=3)
    buffer = optimizer.state_dict()["state"][2]["momentum_buffer"]
    assert torch.equal(server.optimizer.state_dict()["state"][0]["momentum_buffer"], buffer)
    state = hosting.server_state()
    assert state["version"] == 3 and state["optimizer"]["param_groups"][0]["params"] == [0, 1, 2, 3]
    optimizer.load_state_dict(state["optimizer"])  # what every rank takes when ASP is left
    assert torch.equal(optimizer.state_dict()["state"][2]["momentum_buffer"], buffer)
