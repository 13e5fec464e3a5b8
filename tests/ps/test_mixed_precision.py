"""fp16 with a GradScaler in the parameter server's modes: a step the scaler skips is skipped by the server too."""

import math

import pytest
import torch

from lightning_hetero.ps.protocol import FLAG_LAST, FLAG_SKIPPED, PushHeader, new_message, payload
from tests.helpers import read_json
from tests.ps.test_server import _server


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
