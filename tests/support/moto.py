"""moto's S3 server on a free loopback port, for the tests that need a real S3 API."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time


@contextlib.contextmanager
def moto_server():
    """Start `python -m moto.server` on 127.0.0.1 and yield its endpoint url; stopped by PID at exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # (10 s at most)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
