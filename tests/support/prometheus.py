"""A throwaway Prometheus server (Debian's `prometheus`) on a loopback port, scraping the given
targets every second, its data in a temporary directory; started and stopped by PID."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support.nginx import free_port


class Prometheus:
    def __init__(self, root: Path, targets: list[str], interval: str = "1s") -> None:
        self.root = Path(root)
        self.targets = targets
        self.interval = interval
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Prometheus":
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {self.interval}\n  scrape_timeout: {self.interval}\n"
            f"scrape_configs:\n  - job_name: refmount\n    static_configs:\n"
            f"      - targets: {json.dumps(self.targets)}\n")
        self._log = open(self.root / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"prometheus did not become ready: {self.log()}")

    def query(self, expression: str) -> list[dict]:
        """The result vector of an instant query through the HTTP API: [{"metric": {...}, "value": [t, "v"]}]."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=5) as resp:
            answer = json.load(resp)
        if answer.get("status") != "success":
            raise RuntimeError(f"query {expression!r} failed: {answer}")
        return answer["data"]["result"]

    def values(self, expression: str, label: str) -> dict[str, float]:
        """{value of `label`: sample value} for an instant query."""
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expression)}

    def log(self) -> str:
        try:
            return (self.root / "prometheus.log").read_text(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
