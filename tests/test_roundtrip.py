"""fetch/roundtrip.py: the kernel's round trip of a host's first connection, and a late answer on a
first hop next door (a tunnel, a proxy) counted as the far origin it may stand for."""
from __future__ import annotations

import socket

from refmount.fetch import roundtrip


def test_a_loopback_connection_tells_its_round_trip_and_a_late_answer_counts():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            rtt = roundtrip.tcp_rtt(sock)
            assert rtt is not None and 0 < rtt < 0.5
            roundtrip.note(f"http://127.0.0.1:{port}/a", sock, answered=0.001)
            assert roundtrip.of(f"http://127.0.0.1:{port}/b") == rtt  # per host, the first one kept
            roundtrip.note(f"http://127.0.0.1:{port}/a", sock, answered=0.5)
            assert roundtrip.of(f"http://127.0.0.1:{port}/b") == rtt
            roundtrip.note(f"http://localhost:{port}/a", sock, answered=0.16)  # (another host name)
            assert roundtrip.of(f"http://localhost:{port}/x") == 0.16
    assert roundtrip.tcp_rtt(None) is None
    assert roundtrip.of("http://127.0.0.1:1/never") is None
