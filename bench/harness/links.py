"""The emulated WAN between the host (refmount, the peers) and a server in a network namespace.

Three ways, by what the kernel allows: `tc netem` on a veth pair (Link.set_rtt); kernel TCP through a
router namespace whose iptables (legacy) send every packet to an NFQUEUE where bench/nfqdelay.c holds it
RTT/2 behind a rate limit (NfqLink, nfq_line); or bench/delayproxy.py, a userspace TCP proxy in the
namespace (delay_proxy). `pick_link` chooses. Everything made here is removed by `down()` or when the
context managers exit, also on a signal (see system.exit_on_signals)."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from harness import BENCH
from harness.servers import PORT
from harness.system import ensure_installed, log, sh, stop

# What --link nfqueue needs, as Debian packages (the bench scripts' shell wrappers install them).
NFQUEUE_PACKAGES = ["iptables", "gcc", "libnetfilter-queue-dev"]


class Link:
    """Namespace `ns` with veth `inner` (server side) paired with `outer` on the host, in one /30."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.ns = f"rmwan{tag}"
        self.outer, self.inner = f"rmw{tag}h", f"rmw{tag}n"
        self.host_ip, self.server_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"

    def up(self) -> None:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        sh("ip", "link", "set", self.inner, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.outer)
        sh("ip", "link", "set", self.outer, "up")
        self.exec("ip", "addr", "add", f"{self.server_ip}/30", "dev", self.inner)
        self.exec("ip", "link", "set", self.inner, "up")
        self.exec("ip", "link", "set", "lo", "up")

    def exec(self, *cmd: str) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.ns, *cmd)

    def netem_available(self) -> bool:
        """Whether this kernel has sch_netem (some minimal kernels are built without it)."""
        done = sh("tc", "qdisc", "replace", "dev", self.outer, "root", "netem", "delay", "0ms", check=False)
        return done.returncode == 0

    def set_rtt(self, rtt_ms: float) -> None:
        """Both ends: netem with half the delay each way and a 1 Gbit/s rate (a queue deep enough for it)."""
        shape = ["netem", "delay", f"{rtt_ms / 2:g}ms", "rate", "1gbit", "limit", "100000"]
        sh("tc", "qdisc", "replace", "dev", self.outer, "root", *shape)
        self.exec("tc", "qdisc", "replace", "dev", self.inner, "root", *shape)

    def down(self) -> None:
        sh("ip", "link", "del", self.outer, check=False)  # deletes the pair
        sh("ip", "netns", "del", self.ns, check=False)


class NfqLink(Link):
    """Kernel TCP through a delay line (--link nfqueue): the host's veth `outer` joins a router namespace,
    whose second veth joins the server namespace `ns` (nginx). Two /30s of 10.214.<subnet>.0/29; the
    host reaches the server by a route via the router (removed with the veth). In the router, iptables
    (legacy: this kernel has xt_NFQUEUE but no nft queue) sends every packet arriving from the host to
    NFQUEUE 0 and every packet arriving from the server to NFQUEUE 1, where bench/nfqdelay holds it.
    Packets are held in the middle, after they left their sender's namespace (the skb is orphaned
    there), so the sender's TCP small-queues limit does not count them, as on a real path."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.ns, self.router = f"rmkS{tag}", f"rmkR{tag}"
        self.outer, self.router_host = f"rmk{tag}h", f"rmk{tag}a"
        self.router_server, self.inner = f"rmk{tag}b", f"rmk{tag}n"
        base = f"10.214.{subnet}"
        self.host_ip, self.router_host_ip = f"{base}.1", f"{base}.2"
        self.router_server_ip, self.server_ip = f"{base}.5", f"{base}.6"
        self.server_net = f"{base}.4/30"

    def up(self) -> None:
        for ns in (self.router, self.ns):
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.router_host)
        sh("ip", "link", "add", self.router_server, "type", "veth", "peer", "name", self.inner)
        for dev in (self.router_host, self.router_server):
            sh("ip", "link", "set", dev, "netns", self.router)
        sh("ip", "link", "set", self.inner, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.outer)
        sh("ip", "link", "set", self.outer, "up")
        sh("ip", "route", "add", self.server_net, "via", self.router_host_ip, "dev", self.outer)
        r = self.in_router
        r("ip", "addr", "add", f"{self.router_host_ip}/30", "dev", self.router_host)
        r("ip", "addr", "add", f"{self.router_server_ip}/30", "dev", self.router_server)
        for dev in (self.router_host, self.router_server, "lo"):
            r("ip", "link", "set", dev, "up")
        r("sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.exec("ip", "addr", "add", f"{self.server_ip}/30", "dev", self.inner)
        self.exec("ip", "link", "set", self.inner, "up")
        self.exec("ip", "link", "set", "lo", "up")
        self.exec("ip", "route", "add", "default", "via", self.router_server_ip)

    def in_router(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.router, *cmd, check=check)

    def queue(self, on: bool) -> None:
        """Send the packets crossing the router to the delay line's queues (on), or let them pass (off)."""
        for dev, num in ((self.router_host, 0), (self.router_server, 1)):
            self.in_router("iptables-legacy", "-t", "mangle", "-A" if on else "-D", "PREROUTING", "-i", dev,
                           "-j", "NFQUEUE", "--queue-num", str(num), check=on)

    def tcp_settings(self) -> str:
        """The TCP sysctls both ends run with (the server's namespace starts from the kernel defaults)."""
        keys = ["net.ipv4.tcp_congestion_control", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]
        host = sh("sysctl", "-n", *keys).stdout.split("\n")
        server = self.exec("sysctl", "-n", *keys).stdout.split("\n")
        return "; ".join(f"{k.rsplit('.', 1)[1]} host {h.split()} server {s.split()}".replace("'", "")
                         for k, h, s in zip(keys, host, server))

    def down(self) -> None:
        sh("ip", "link", "del", self.outer, check=False)  # deletes the pair and the host's route
        for ns in (self.router, self.ns):  # the router's rules and its other veth go with it
            sh("ip", "netns", "del", ns, check=False)


def link_up(stack, link: Link, run_dir: Path) -> Link:
    """Bring `link` up, removed when `stack` closes; its names in run_dir/link for the shell wrappers'
    EXIT trap (namespace, veth, router namespace), which removes it should the bench be killed outright."""
    stack.callback(link.down)
    (run_dir / "link").write_text(f"{link.ns} {link.outer} {getattr(link, 'router', '')}\n")
    link.up()
    return link


def need_nfqueue() -> None:
    """Install what --link nfqueue needs (iptables-legacy, gcc, libnetfilter_queue's header) if missing."""
    ensure_installed({"iptables-legacy": "iptables", "gcc": "gcc", "ip": "iproute2"},
         {"/usr/include/libnetfilter_queue/libnetfilter_queue.h": "libnetfilter-queue-dev"})


def nfqueue_missing() -> list[str]:
    """What --link nfqueue needs and this machine lacks (the shell wrappers install them)."""
    need = {"iptables-legacy": shutil.which("iptables-legacy"), "gcc": shutil.which("gcc"),
            "libnetfilter-queue-dev": Path("/usr/include/libnetfilter_queue/libnetfilter_queue.h").exists()}
    return [name for name, present in need.items() if not present]


def build_nfqdelay(run_dir: Path) -> Path:
    binary = run_dir / "nfqdelay"
    done = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(binary), str(BENCH / "nfqdelay.c"), "-lnetfilter_queue",
                           "-lnfnetlink"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot build bench/nfqdelay.c: {done.stderr.strip()[-400:]}")
    return binary


@contextmanager
def nfq_delay(link: NfqLink, run_dir: Path, binary: Path, rtt_ms: float, rate_mbit: float = 1000):
    """bench/nfqdelay in the router namespace, holding each packet RTT/2 per direction (after a
    `rate_mbit` bottleneck; 0: none); logs its counters when stopped."""
    cmd = ["ip", "netns", "exec", link.router, str(binary), "--delay-ms", f"{rtt_ms / 2:g}",
           "--rate-mbit", f"{rate_mbit:g}", "0", "1"]
    with delay_process(cmd, run_dir, "nfqdelay", f"nfqdelay (RTT {rtt_ms:g} ms, {rate_mbit:g} Mbit/s)") as proc:
        yield proc


@contextmanager
def nfq_line(link: NfqLink, run_dir: Path, binary: Path, rtt_ms: float, rate_mbit: float = 1000):
    """The delay line running and the router's packets queued to it, for the duration."""
    with nfq_delay(link, run_dir, binary, rtt_ms, rate_mbit) as proc:
        link.queue(True)
        try:
            yield proc
        finally:
            link.queue(False)


@contextmanager
def delay_proxy(link: Link, run_dir: Path, rtt_ms: float, window: int, rate_mbit: float = 1000,
                init_window: int | None = None):
    """bench/delayproxy.py in the namespace, on the server address in front of nginx; logs its counters
    (connections, bytes, its own CPU) when stopped."""
    cmd = ["ip", "netns", "exec", link.ns, sys.executable, str(BENCH / "delayproxy.py"),
           "--listen", f"{link.server_ip}:{PORT}", "--upstream", f"127.0.0.1:{PORT}", "--rtt-ms", f"{rtt_ms:g}",
           "--rate-mbit", f"{rate_mbit:g}", "--window", str(window)]
    if init_window is not None:
        cmd += ["--init-window", str(init_window)]
    with delay_process(cmd, run_dir, "proxy", f"delay proxy (RTT {rtt_ms:g} ms, {rate_mbit:g} Mbit/s)") as proc:
        yield proc


@contextmanager
def delay_process(cmd: list[str], run_dir: Path, name: str, title: str):
    """Start a delay line (`cmd`, run through `ip netns exec`, which execs: its pid is the line's) and
    wait for its "ready" line; stop it at the end and log the counters it prints on stderr."""
    err = open(run_dir / f"{name}.err", "w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    (run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
    try:
        ready = [None]
        reader = threading.Thread(target=lambda: ready.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(15)
        if ready[0] != "ready\n":
            raise RuntimeError(f"{title.split(' (')[0]} did not start: {Path(err.name).read_text().strip()[-400:]}")
        yield proc
    finally:
        stop(proc)
        err.seek(0)
        lines = err.read().strip().splitlines()
        log(f"  {title}: {lines[-1] if lines else 'no counters'}")
        err.close()
        (run_dir / f"{name}.pid").unlink(missing_ok=True)


def connect_ms(url: str, times: int = 5, probe: str = "big.bin") -> float:
    """Median TCP connect time to the server (one round trip): checks the delay line's RTT."""
    out = []
    for _ in range(times):
        done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", "10", "-w", "%{time_connect}", "-r", "0-0",
                               url + probe], capture_output=True, text=True)
        out.append(float(done.stdout or "nan") * 1000)
    return statistics.median(out)


def pick_link(wanted: str, tag: str, subnet: int) -> str:
    """netem, nfqueue or proxy: what --link asks for, or (auto) the first this machine can do."""
    if wanted in ("auto", "netem"):
        probe = Link(tag, subnet)
        try:
            probe.up()
            if probe.netem_available():
                return "netem"
        finally:
            probe.down()
        if wanted == "netem":
            raise SystemExit("--link netem, but this kernel has no sch_netem")
    missing = nfqueue_missing()
    if wanted == "nfqueue" and missing:
        raise SystemExit(f"--link nfqueue needs {', '.join(missing)} (apt-get install {' '.join(NFQUEUE_PACKAGES)})")
    if wanted == "auto":
        return "proxy" if missing else "nfqueue"
    return wanted
