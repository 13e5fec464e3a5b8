"""A checkpoint written before ``AsyncPSStrategy`` was rebuilt from engines (issue 24) still resumes, and one written
at a validation point inside an epoch resumes where the epoch's claim pool stood.

The fixtures ``asp``, ``bsp`` and ``local`` in ``tests/async_ps/fixtures`` were written by the code at commit ce12dbb (see
``make_checkpoints.py``): one epoch of 256 samples on 2 CPU ranks in each mode, without a claim pool position. Each
is resumed for one more epoch on 2 ranks, and loaded in process to check the strategy restores the state the file
holds. ``asp_mid_epoch`` was written at the first of an epoch's two validation points (commit 6c252ff).
"""

from pathlib import Path

import pytest
import torch

from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.async_ps.runtime.checkpointing import CHECKPOINT_KEY, POOL_KEY
from lightning_hetero.epoch_order import epoch_order
from tests.helpers import read_json

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLES = 256


def _fixture(name):
    return FIXTURES / f"{name}.ckpt", torch.load(FIXTURES / f"{name}.ckpt", weights_only=False)


def _parameter_sums(checkpoint):
    return [float(value.double().sum()) for name, value in checkpoint["state_dict"].items() if "running" not in name]


@pytest.mark.parametrize("mode", ["asp", "bsp", "local"])
def test_the_fixture_holds_what_the_strategy_saved(mode):
    _, saved = _fixture(mode)
    steps = {"asp": SAMPLES // 32, "bsp": SAMPLES // (2 * 32), "local": SAMPLES // 16}[mode]
    assert saved["epoch"] == 0 and saved["global_step"] == steps
    assert saved[CHECKPOINT_KEY]["mode"] == mode and saved[CHECKPOINT_KEY]["version"] == steps
    if mode == "local":
        assert saved[CHECKPOINT_KEY]["local_sgd"]["rounds"] == 4
        assert saved[CHECKPOINT_KEY]["local_sgd"]["outer_optimizer"]["state"]  # the outer Nesterov momentum
    else:
        assert saved["optimizer_states"][0]["state"]  # the (server's, in ASP) momentum buffers


@pytest.mark.parametrize("mode", ["asp", "bsp", "local"])
def test_loading_a_fixture_restores_the_strategys_state_and_saves_it_again(mode, tmp_path):
    path, saved = _fixture(mode)
    strategy = AsyncPSStrategy(mode="asp" if mode != "asp" else "bsp")  # the file's mode wins
    loaded = strategy.load_checkpoint(path)
    assert strategy.mode == mode and strategy.version == saved["global_step"]
    assert not strategy.in_lock_step if mode != "bsp" else strategy.in_lock_step
    checkpoint = {key: value for key, value in loaded.items() if key != CHECKPOINT_KEY}
    strategy.save_checkpoint(checkpoint, tmp_path / "again.ckpt")
    again = torch.load(tmp_path / "again.ckpt", weights_only=False)
    assert again[CHECKPOINT_KEY].keys() == saved[CHECKPOINT_KEY].keys()
    assert again[CHECKPOINT_KEY]["mode"] == mode and again[CHECKPOINT_KEY]["version"] == saved["global_step"]
    if mode == "local":  # the rounds and the outer optimizer's momentum, as in the file, before any round ran
        restored, expected = again[CHECKPOINT_KEY]["local_sgd"], saved[CHECKPOINT_KEY]["local_sgd"]
        assert restored["rounds"] == expected["rounds"] and restored["steps_total"] == expected["steps_total"]
        assert restored["rates"] == expected["rates"]
        buffers = [restored["outer_optimizer"]["state"][0], expected["outer_optimizer"]["state"][0]]
        assert torch.equal(buffers[0]["momentum_buffer"], buffers[1]["momentum_buffer"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["asp", "bsp"])
def test_an_asp_or_bsp_checkpoint_of_the_previous_release_resumes(run_script, tmp_path, mode):
    path, saved = _fixture(mode)
    run_script(
        "ps_train.py", str(tmp_path), "--epochs", "2", "--samples", str(SAMPLES), "--mode", mode,
        "--momentum", "0.9", "--resume", str(path),
        timeout_s=120,
    )  # fmt: skip
    reports = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    steps = saved["global_step"]
    momentum = [
        float(s["momentum_buffer"].double().sum()) for _, s in sorted(saved["optimizer_states"][0]["state"].items())
    ]
    for report in reports:
        # every rank starts on the file's model (the server's, in ASP), its momentum and its step count
        assert report["start"]["global_step"] == steps
        assert report["start"]["checksum"] == pytest.approx(_parameter_sums(saved), abs=1e-9)
        assert report["start"]["momentum"] == pytest.approx(momentum, abs=1e-9)
        # and trains the second epoch only, counting on from the file's count
        assert report["mode"] == mode and list(report["seen"]) == ["1"]
        assert report["global_step"] == report["version"] == 2 * steps
    assert sorted(reports[0]["seen"]["1"] + reports[1]["seen"]["1"]) == list(range(SAMPLES))
    assert reports[0]["checksum"] == reports[1]["checksum"] != reports[0]["start"]["checksum"]


@pytest.mark.multiprocess
def test_a_local_sgd_checkpoint_of_the_previous_release_resumes(run_script, tmp_path):
    path, saved = _fixture("local")
    run_script(
        "local_train.py", str(tmp_path), "--epochs", "2", "--samples", str(SAMPLES), "--round-samples", "64",
        "--resume", str(path),
        timeout_s=180,
    )  # fmt: skip
    reports = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    steps = saved["global_step"]
    for report in reports:
        assert report["start"]["global_step"] == steps
        assert report["start"]["checksum"] == pytest.approx(_parameter_sums(saved), abs=1e-9)
        assert report["mode"] == "local" and list(report["seen"]) == ["1"]
        # the rounds count on from the file's (4 rounds of 64 samples in the first epoch)
        assert report["global_step"] == report["steps_total"] == 2 * steps
        assert report["rounds"] > saved[CHECKPOINT_KEY]["local_sgd"]["rounds"]
    assert sorted(reports[0]["seen"]["1"] + reports[1]["seen"]["1"]) == list(range(SAMPLES))
    assert reports[0]["checksum"] == reports[1]["checksum"]


@pytest.mark.parametrize("name", ["asp", "bsp", "local", "asp_mid_epoch"])
def test_a_fixture_restores_its_claim_pool_position_and_one_without_starts_the_epoch_again(name):
    path, saved = _fixture(name)
    strategy = AsyncPSStrategy()
    strategy.load_checkpoint(path)
    expected = {"epoch": 0, "sample": SAMPLES // 2} if name == "asp_mid_epoch" else None
    assert saved[CHECKPOINT_KEY].get(POOL_KEY) == strategy._checkpointing.pool_position == expected


@pytest.mark.multiprocess
def test_a_checkpoint_at_a_validation_point_inside_an_epoch_resumes_the_rest_of_its_epoch(run_script, tmp_path):
    path, saved = _fixture("asp_mid_epoch")
    run_script(
        "mid_epoch_resume.py", str(tmp_path), "--mode", "asp", "--samples", str(SAMPLES), "--epochs", "1",
        "--resume", str(path),
        timeout_s=180,
    )  # fmt: skip
    reports = [read_json(tmp_path / f"rank{rank}.json") for rank in (0, 1)]
    # the epoch's second half (its order after the point), each sample once
    rest = epoch_order(SAMPLES, 0, shuffle=True, seed=0)[saved[CHECKPOINT_KEY][POOL_KEY]["sample"] :]
    assert sorted(reports[0]["seen"]["0"] + reports[1]["seen"]["0"]) == sorted(rest)
    for report in reports:
        assert report["global_step"] == report["epoch_end_steps"]["0"] == SAMPLES // 16
