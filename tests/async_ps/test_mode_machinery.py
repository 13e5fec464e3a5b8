"""ASP's machinery (the server, its receiving threads, the client and its messages) exists only once a run trains in
ASP: a BSP or local-SGD run holds none and runs at most one Python thread more than plain DDP. BSP trains through
DDP's reducer, as ``strategy="ddp"`` does; ASP and local SGD train the module itself."""

import pytest

from tests.helpers import read_json, run_ranks

RUNS = ("ddp", "bsp", "local", "asp", "switch")


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    out = tmp_path_factory.mktemp("mode_threads")
    reports = {}
    for run in RUNS:
        results = run_ranks("mode_threads.py", 2, str(out), run)
        for result in results:
            assert result.returncode == 0, result.stderr[-3000:]
        reports[run] = [read_json(out / f"{run}_rank{rank}.json") for rank in range(2)]
    return reports


@pytest.mark.parametrize("mode", ["bsp", "local"])
def test_bsp_and_local_sgd_hold_no_server_client_or_messages(census, mode):
    for rank, report in enumerate(census[mode]):
        for epoch in report["epochs"]:
            assert (epoch["server"], epoch["client"], epoch["server_loop"]) == (False, False, False), (rank, epoch)
            assert not [name for name in epoch["names"] if name.startswith("ps-")], (rank, epoch["names"])


@pytest.mark.parametrize("mode", ["bsp", "local"])
def test_bsp_and_local_sgd_run_at_most_one_thread_more_than_ddp(census, mode):
    for rank in range(2):
        ddp = max(epoch["threads"] for epoch in census["ddp"][rank]["epochs"])
        assert max(epoch["threads"] for epoch in census[mode][rank]["epochs"]) <= ddp + 1, (rank, census[mode][rank])


def test_asp_starts_its_server_in_rank_0_and_a_client_on_every_rank(census):
    server_rank, worker = census["asp"]
    assert all(epoch["server"] and epoch["client"] for epoch in server_rank["epochs"])
    assert "ps-worker-1" in server_rank["epochs"][0]["names"]
    assert all(epoch["client"] and not epoch["server"] for epoch in worker["epochs"])


def test_the_hybrid_starts_asp_at_its_first_switch_to_asp(census):
    for rank, report in enumerate(census["switch"]):
        bsp_epoch, asp_epoch = report["epochs"]
        assert (bsp_epoch["mode"], bsp_epoch["client"], bsp_epoch["server"]) == ("bsp", False, False)
        assert (asp_epoch["mode"], asp_epoch["client"], asp_epoch["server"]) == ("asp", True, rank == 0)
        assert report["last_switch_s"] is not None


def test_bsp_trains_through_ddps_reducer_and_asp_and_local_sgd_train_the_module(census):
    for rank in range(2):
        for run, wrapped in (("ddp", True), ("bsp", True), ("local", False), ("asp", False)):
            for epoch in census[run][rank]["epochs"]:
                assert epoch["ddp_wrapped"] is wrapped, (run, rank, epoch)
                assert epoch.get("buckets_rebuilt", wrapped) is wrapped, (run, rank, epoch)  # a backward ran through it
        bsp_epoch, asp_epoch = census["switch"][rank]["epochs"]  # the hybrid sets the wrapper aside in ASP
        assert (bsp_epoch["ddp_wrapped"], bsp_epoch["buckets_rebuilt"], asp_epoch["ddp_wrapped"]) == (True, True, False)
