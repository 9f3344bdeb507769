"""moto's S3 server on a free loopback port, for the tests that need a real S3 API."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time


@contextlib.contextmanager
def moto_server(env: dict | None = None):
    """Start `python -m moto.server` on 127.0.0.1 and yield its endpoint url; stopped by PID at exit.
    `env`: moto's settings (INITIAL_NO_AUTH_ACTION_COUNT=N checks IAM policies after N requests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env} if env else None)
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


TEST_KEYS = {"key": "AKIATESTTESTTEST0000", "secret": "test/secret/0000"}


@contextlib.contextmanager
def bucket_of(root, bucket: str = "stores"):
    """moto's S3 with every file under `root` in `bucket` (same keys as paths); yields s3fs options."""
    from pathlib import Path

    import s3fs

    with moto_server() as endpoint:
        options = {**TEST_KEYS, "endpoint_url": endpoint}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir(bucket)
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                fs.pipe_file(f"{bucket}/{path.relative_to(root)}", path.read_bytes())
        yield options
