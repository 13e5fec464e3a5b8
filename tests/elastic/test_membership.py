import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from benchmarks.harness.launch import free_port

from lightning_hetero.elastic.connection import JobConnection
from lightning_hetero.elastic.membership import (
    ElasticError,
    Membership,
    lighthouse_host_port,
    reachable,
    wait_reachable,
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_addresses_need_a_port():
    assert lighthouse_host_port("http://h:1") == ("h", 1)
    with pytest.raises(ValueError, match="needs a port"):
        lighthouse_host_port("http://h")


def test_an_unreachable_lighthouse_is_named_once_startup_timeout_s_is_spent():
    address = f"http://127.0.0.1:{_closed_port()}"
    assert not reachable(address)
    start = time.monotonic()
    with pytest.raises(ElasticError, match=rf"lighthouse at {address} within startup_timeout_s=0.5"):
        wait_reachable(address, startup_timeout_s=0.5)
    assert time.monotonic() - start < 30  # gave up, no hang (the margin is wide on purpose)


def test_a_listening_lighthouse_is_reachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        wait_reachable(address, startup_timeout_s=5)
        assert reachable(address)


def _members(address: str, names: str, round_timeout_s: float) -> list[Membership]:
    return [
        Membership(address, name, lambda state: None, dict, round_timeout_s=round_timeout_s, lost_after_s=1)
        for name in names
    ]


def _rounds(members: list[Membership]) -> list[tuple[int, int]]:
    """One round end of ``members`` together; each one's (sum of the ones sent, participants)."""
    with ThreadPoolExecutor(len(members)) as pool:
        ends = list(pool.map(lambda m: m.round(lambda rank, n: torch.ones(1)), members))
    return [(round(float(summed[0])), participants) for summed, _, participants in ends]


@pytest.mark.timing
def test_a_lost_worker_does_not_hold_the_round_for_a_live_one_that_does_not_come():
    """After a loss, the hosted lighthouse waits ``join_timeout_s`` (not ``round_timeout_s``) for the live workers
    that are not at the round end (as one stuck in the collective the lost worker broke): the others go on before
    their own round end times out."""
    connection = JobConnection("test", "elastic", "state", f"http://localhost:{free_port()}", quorum_timeout_s=20)
    server = connection.host_lighthouse()
    members = _members(connection.lighthouse, "abcd", connection.quorum_timeout_s)
    try:
        assert _rounds(members) == [(4, 4)] * 4
        members[1].shutdown()  # b is lost; c lives on but does not come to the next round end
        assert _rounds([members[0], members[3]]) == [(2, 2)] * 2
    finally:
        for member in members:
            member.shutdown()
        server.shutdown()


@pytest.mark.timing
def test_every_worker_ends_with_an_error_naming_the_lost_lighthouse():
    """torchft's own lighthouse (``torchft_lighthouse``, the recipe for a lighthouse apart from the workers) dies:
    each worker's next round end fails naming it, after ``lost_after_s`` (no hang)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "torchft_lighthouse"), "--bind", f"[::]:{port}", "--min_replicas", "1"]
    lighthouse = subprocess.Popen([*command, "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000"])
    address = f"http://localhost:{port}"
    members: list[Membership] = []
    try:
        wait_reachable(address, startup_timeout_s=30)
        members = _members(address, "ab", round_timeout_s=60)
        assert _rounds(members) == [(2, 2)] * 2
        lighthouse.kill()
        with ThreadPoolExecutor(2) as pool:
            ends = [pool.submit(m.round, lambda rank, n: torch.ones(1)) for m in members]
            for end in ends:
                with pytest.raises(ElasticError, match=rf"lost the torchft lighthouse at {address}"):
                    end.result(timeout=60)
    finally:
        lighthouse.kill()
        lighthouse.wait()
        for member in members:
            member.shutdown()


def test_a_worker_that_falls_behind_recovers_from_a_peer_at_the_next_round_end():
    """What a worker whose history lost a round where two met does (``Membership.fall_behind``): torchft counts it
    behind and recovers it from a peer at the next round end."""
    connection = JobConnection("test", "elastic", "state", f"http://localhost:{free_port()}", quorum_timeout_s=20)
    server = connection.host_lighthouse()
    loaded: list[dict] = []
    members = [
        Membership(
            connection.lighthouse, "a", loaded.append, lambda: {"from": "a"}, round_timeout_s=20, lost_after_s=1
        ),
        Membership(
            connection.lighthouse, "b", loaded.append, lambda: {"from": "b"}, round_timeout_s=20, lost_after_s=1
        ),
    ]
    try:
        assert _rounds(members) == [(2, 2)] * 2
        loaded.clear()  # (torchft's initial sync at step 0 may have recovered one of them)
        assert [m.step for m in members] == [1, 1]
        members[0].fall_behind()
        assert members[0].step == 0
        assert _rounds(members) == [(2, 2)] * 2
        assert loaded == [{"from": "b"}] and [m.step for m in members] == [2, 2]
    finally:
        for member in members:
            member.shutdown()
        server.shutdown()
