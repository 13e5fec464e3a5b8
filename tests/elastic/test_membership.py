import socket
import time

import pytest

from lightning_hetero.elastic.membership import ElasticError, lighthouse_host_port, reachable, wait_reachable


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
