"""fp16 with a GradScaler in the parameter server's modes: a step the scaler skips is skipped by the server too."""

import math

import pytest
import torch

from lightning_hetero.asp.protocol import FLAG_LAST, FLAG_SKIPPED, PushHeader, new_message, payload
from tests.asp.test_server import _server
from tests.helpers import read_json


def test_a_skipped_push_leaves_the_server_alone_but_ends_the_workers_epoch():
    server, _, _ = _server()
    before = server.params.clone()
    reply = new_message(server.layout.numel)
    inf = torch.full((server.layout.numel,), math.inf)
    header = server.apply(1, PushHeader(FLAG_SKIPPED | FLAG_LAST, 0, 0.5, epoch=2), inf, reply)
    assert header.version == 0 and server.version == 0  # no update
    assert torch.equal(server.params, before) and torch.equal(payload(reply), before)  # the latest parameters back
    assert server.finished_epoch[1] == 2  # its last push of the epoch still counts


@pytest.mark.multiprocess
def test_asp_with_fp16_skips_the_infinite_step_on_the_server(run_script, tmp_path):
    run_script("ps_amp.py", str(tmp_path), "asp")
    fast, broken = (read_json(tmp_path / f"asp_rank{rank}.json") for rank in range(2))
    assert broken["scale"] == fast["scale"] / 2  # only rank 1's scaler saw the infinite gradient
    assert fast["global_step"] == broken["global_step"] == fast["steps"] + broken["steps"] - 1  # one push skipped
    assert fast["finite"] and broken["finite"]


@pytest.mark.multiprocess
def test_fp16_scalers_agree_at_local_round_ends_so_bsp_ranks_skip_alike_end_identical_and_resume_the_scale(
    run_script, tmp_path
):
    run_script("ps_amp.py", str(tmp_path), "local:0-0,bsp:1-", "--broken-epochs", "0,1", "--resume", timeout_s=180)
    fast, broken = (read_json(tmp_path / f"local_rank{rank}.json") for rank in range(2))
    # local SGD (epoch 0): the infinite gradient skipped rank 1's own local step only, so rank 1's scaler backed off;
    # the round end (before BSP is entered: the scales are read at the epoch's end, before the switch) made both
    # scalers the smaller one. The pseudo-gradients come from fp32 parameters: the round ends on the same finite
    # parameters on both ranks
    assert fast["epoch_scales"][0] == broken["epoch_scales"][0] == 2.0**10 / 2
    assert fast["epoch_checksums"][0] == broken["epoch_checksums"][0]
    # in BSP the infinite gradient of epoch 1 reached both ranks through the all-reduce: both skipped that step and
    # backed off alike, and the ranks end identical
    assert fast["scale"] == broken["scale"] == broken["epoch_scales"][0] / 2
    assert fast["checksum"] == broken["checksum"] and fast["finite"] and broken["finite"]
    # the scaler is checkpointed (Lightning saves rank 0's), and every rank resumes from it with a fresh scaler
    checkpoint = torch.load(tmp_path / "local.ckpt", weights_only=False)
    assert checkpoint["MixedPrecision"]["scale"] == fast["scale"]
    assert fast["resumed_start_scale"] == broken["resumed_start_scale"] == fast["scale"]
