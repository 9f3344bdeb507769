"""Processes, timing, CPU and memory of a pid, the page cache and the machine's facts."""

from __future__ import annotations

import os
import platform
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness import ROOT

TICKS = os.sysconf("SC_CLK_TCK")
STEP_TIMEOUT_S = 300  # no single shell step of a bench may take longer


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def run(cmd: list[str] | str, timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """A command (or a bash pipeline with pipefail) that must succeed; output captured as text."""
    if isinstance(cmd, str):
        cmd = ["bash", "-c", "set -o pipefail; " + cmd]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout, **kwargs)


def timed_run(cmd: list[str] | str, timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    done = run(cmd, timeout)
    return done, time.perf_counter() - t0


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)


def timed(cmd: str, cpu_of=None) -> tuple[float, float, str]:
    """(seconds, CPU seconds, stdout+stderr) of a shell pipeline; CPU of `cpu_of()`'s pid if given (a
    daemon), else of the pipeline's own processes."""
    pid = cpu_of() if cpu_of else None
    before = proc_cpu_s(pid) if pid else children_cpu_s()
    t0 = time.perf_counter()
    done = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed: {done.stderr.strip()[-400:]}")
    cpu = (proc_cpu_s(pid) if pid else children_cpu_s()) - before
    return seconds, cpu, done.stdout + done.stderr


def dd_bytes(output: str) -> int:
    """Bytes copied, summed over the `dd` reports in `output`."""
    return sum(int(n) for n in re.findall(r"^(\d+) bytes", output, re.M))


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    """Stop a child we started (by its pid): SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP raise SystemExit (as Ctrl-C raises KeyboardInterrupt), so that every `finally`
    and ExitStack callback runs: mounts unmounted, servers stopped, namespaces removed."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- CPU and memory of a process ---------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def proc_minflt(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_status_mib(pid: int, field: str) -> float:
    """A /proc/PID/status memory line (VmHWM: peak RSS, VmRSS, ...) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def vmhwm_mib(pid: int) -> float:
    """Peak RSS of `pid` (VmHWM rather than ru_maxrss, which Linux carries across fork + exec)."""
    return proc_status_mib(pid, "VmHWM")


# -- the machine ---------------------------------------------------------------------------------------


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(v, 2) for v in os.getloadavg()]


# The peers' versions, and refmount's (this checkout's), for the record of a run.
TOOLS = {"rclone": "rclone version | head -1", "nginx": "nginx -v 2>&1 | sed 's/^nginx version: //'",
         "curl": "curl --version | head -1 | cut -d' ' -f1,2",
         "ncdump": "ncdump 2>&1 | tail -1 | sed 's/^netcdf library version \\([^ ]*\\).*/netCDF-C \\1/'",
         "refmount": f"PYTHONPATH={ROOT} {sys.executable} -m refmount --version"}


def machine(tools: dict[str, str] | None = None) -> dict:
    """CPU, kernel, RAM, load at the time of the call, and the versions of `tools` ({name: shell command};
    default TOOLS)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    ram = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    versions = {name: subprocess.run(["bash", "-c", cmd], capture_output=True, text=True).stdout.strip()
                for name, cmd in (TOOLS if tools is None else tools).items()}
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "ram_gib": round(ram, 1),
            "python": platform.python_version(), "loadavg_start": os.getloadavg()[0], "versions": versions}


def machine_line(m: dict) -> str:
    return (f"machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['ram_gib']:.0f} GiB RAM; "
            f"load average {m['loadavg_start']:.1f} at start, {m.get('loadavg_end', float('nan')):.1f} at end")


def ensure_installed(commands: dict[str, str], files: dict[str, str] | None = None) -> None:
    """Install from Debian what this bench needs and the machine lacks: `commands` {command: package},
    `files` {path: package} (headers). As root, `apt-get install -y` the missing packages (as the shell
    wrappers do); otherwise exit naming them."""
    import shutil

    missing = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None}
                     | {pkg for path, pkg in (files or {}).items() if not Path(path).exists()})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"{Path(sys.argv[0]).name}: needs {' '.join(missing)} (apt-get install -y {' '.join(missing)})")
    log(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, stdout=subprocess.DEVNULL)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"apt-get install {' '.join(missing)} failed: {done.stderr.strip()[-400:]}")


class TreePeak:
    """Peak summed PSS of this process's descendants (and itself if `include_self`), sampled every
    `interval` s in a thread. Catches forked workers (refmount's parallel JSON loader), which the
    parent's VmHWM does not include; PSS so that pages shared after fork are counted once."""

    def __init__(self, include_self: bool, interval: float = 0.05) -> None:
        self.include_self, self.interval = include_self, interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            pids = descendants(os.getpid()) + ([os.getpid()] if self.include_self else [])
            self.peak_mb = max(self.peak_mb, sum(map(pss_mb, pids)))


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass  # exited meanwhile
    return 0.0
