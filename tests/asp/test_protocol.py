from lightning_hetero.asp.protocol import (
    FLAG_JOIN,
    FLAG_LAST,
    FLAG_PULL_ONLY,
    HEADER_SLOTS,
    STATUS_ABORTED,
    PeerLostError,
    PushHeader,
    new_message,
    payload,
    read_push_header,
    read_reply_header,
    write_push_header,
    write_reply_header,
)


def test_headers_round_trip_exactly_and_leave_the_payload_alone():
    msg = new_message(3)
    payload(msg).copy_(payload(msg).new_tensor([1.5, -2.0, 3.25]))
    write_push_header(msg, FLAG_LAST | FLAG_PULL_ONLY | FLAG_JOIN, 2**30 + 7, 0.125)
    assert read_push_header(msg) == PushHeader(FLAG_LAST | FLAG_PULL_ONLY | FLAG_JOIN, 2**30 + 7, 0.125)
    write_reply_header(msg, STATUS_ABORTED, 123456789, 4, lost_rank=3)
    assert tuple(read_reply_header(msg)) == (STATUS_ABORTED, 123456789, 4, 3)
    assert payload(msg).tolist() == [1.5, -2.0, 3.25]
    assert msg.numel() == HEADER_SLOTS + 3


def test_peer_lost_error_names_rank_and_role():
    error = PeerLostError(2, "worker", "Connection closed by peer")
    assert str(error) == "AsyncPSStrategy lost the worker on rank 2: Connection closed by peer"
    assert (error.rank, error.role, error.cause) == (2, "worker", "Connection closed by peer")
