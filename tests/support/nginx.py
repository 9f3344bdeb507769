"""A throwaway nginx (Debian's nginx-light) on a loopback port, configured by the test, stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """`server_block` goes inside `server { listen 127.0.0.1:PORT; ... }`; a proxy cache zone named
    `refs` is defined under `root`. `log_format`: the access log's format (nginx variables), else
    nginx's 'combined'."""

    def __init__(self, root: Path, server_block: str, log_format: str | None = None) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.server_block = server_block
        self.log_format = log_format
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Nginx":
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        for d in ("tmp", "cache", "logs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        r = self.root
        user = "user root;" if os.geteuid() == 0 else ""  # workers must reach files under a 0700 tmp dir
        log = f"log_format test '{self.log_format}'; access_log {r}/logs/access.log test;" if self.log_format \
            else f"access_log {r}/logs/access.log;"
        (r / "nginx.conf").write_text(f"""
{user}
worker_processes 1;
error_log {r}/logs/error.log warn;
pid {r}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    {log}
    client_body_temp_path {r}/tmp/body; proxy_temp_path {r}/tmp/proxy; fastcgi_temp_path {r}/tmp/fastcgi;
    uwsgi_temp_path {r}/tmp/uwsgi; scgi_temp_path {r}/tmp/scgi;
    proxy_cache_path {r}/cache levels=1:2 keys_zone=refs:10m max_size=1g inactive=1h use_temp_path=off;
    server {{
        listen 127.0.0.1:{self.port};
        {self.server_block}
    }}
}}
""")
        self.proc = subprocess.Popen([binary, "-p", str(r), "-c", str(r / "nginx.conf"), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("nginx did not start")

    def access_log(self) -> list[str]:
        path = self.root / "logs" / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the master stops its workers
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
