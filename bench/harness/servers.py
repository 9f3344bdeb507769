"""Servers that honour Range: our own nginx (on loopback, or inside a link's namespace) and the aiohttp
range server of tests/support (faults, ignore_range, request counts)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from harness import ROOT
from harness.system import free_port, log, port_open, stop, wait_for

PORT = 8080  # nginx's port inside a link's namespace (alone there, so fixed)
DIRECT_PORT = 8081  # proxy mode: nginx also listens here on the server address, for the proxy's ceiling

NGINX_CONF = """\
worker_processes 2;
pid {run}/nginx.pid;
error_log {run}/nginx-error.log warn;
daemon off;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {run}/nginx-tmp/body;
    proxy_temp_path {run}/nginx-tmp/proxy;
    fastcgi_temp_path {run}/nginx-tmp/fastcgi;
    uwsgi_temp_path {run}/nginx-tmp/uwsgi;
    scgi_temp_path {run}/nginx-tmp/scgi;
    types {{ application/octet-stream bin nc; }}
    server {{
        listen {listen};
        root {data};
        autoindex on;
    }}
}}
"""

# Access log formats (nginx variables), one request a line.
REQUESTS_LOG = "$request_method $uri $http_range $status"  # bench_archive's request kinds
BYTES_LOG = "$request_method $uri $http_range $status $body_bytes_sent"  # bench_sparse's bytes sent


def nginx_conf(run_dir: Path, data: Path, listen: str, access_log: Path | None = None,
               log_format: str = REQUESTS_LOG, tls: bool = False) -> Path:
    """nginx.conf in `run_dir` serving `data` (autoindex, sendfile, Range) on `listen` ("ADDR:PORT", or
    several separated by "; listen "); with `access_log`, each request a line of `log_format` there;
    `tls`: https with run_dir's leaf.pem and key.pem (write_certificates)."""
    (run_dir / "nginx-tmp").mkdir(exist_ok=True)
    if tls:
        listen += (f" ssl; ssl_certificate {run_dir}/leaf.pem; ssl_certificate_key {run_dir}/key.pem; "
                   "ssl_session_cache shared:SSL:1m")
    text = NGINX_CONF.format(run=run_dir, listen=listen, data=data)
    if access_log:
        text = text.replace("access_log off;", f"log_format requests '{log_format}';\n"
                                               f"    access_log {access_log} requests;")
    conf = run_dir / "nginx.conf"
    conf.write_text(text)
    return conf


def start_nginx(data: Path, run_dir: Path, port: int, access_log: Path | None = None,
                log_format: str = REQUESTS_LOG, tls: bool = False) -> subprocess.Popen | None:
    """Our own nginx master on 127.0.0.1:`port` (foreground, so we hold its pid), or None if it did not
    come up (the port was taken meanwhile)."""
    conf = nginx_conf(run_dir, data, f"127.0.0.1:{port}", access_log, log_format, tls)
    proc = subprocess.Popen(["nginx", "-p", str(run_dir), "-c", str(conf), "-e", str(run_dir / "nginx-error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: proc.poll() is not None or port_open(port), "nginx", 10)
    except RuntimeError:
        stop(proc)
    if proc.poll() is None:
        return proc
    log(f"nginx did not start on port {port}: {proc.stderr.read().decode().strip()}")
    return None


@contextmanager
def nginx_serving(data: Path, run_dir: Path, access_log: Path | None = None, log_format: str = REQUESTS_LOG,
                  tls: bool = False):
    """A private nginx on a free loopback port serving `data`; yields its base url ("http://.../")."""
    for _ in range(5):  # a free port can be taken between our probe and nginx's bind
        port = free_port()
        proc = start_nginx(data, run_dir, port, access_log, log_format, tls)
        if proc is not None:
            break
    else:
        raise RuntimeError("could not start nginx")
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(proc)  # the master stops its workers


def curl_ok(url: str) -> bool:
    return subprocess.run(["curl", "-sfI", "-m", "2", url], capture_output=True).returncode == 0


@contextmanager
def nginx_in(link, data: Path, run_dir: Path, proxied: bool = False, access_log: Path | None = None,
             log_format: str = REQUESTS_LOG, probe: str = "big.bin"):
    """nginx in `link`'s server namespace on the server address, or (proxied) on the namespace's loopback
    behind the delay proxy plus on the server address's DIRECT_PORT; yields the url the contenders use.
    `probe`: a file under `data` that tells when nginx answers."""
    listen = (f"127.0.0.1:{PORT}; listen {link.server_ip}:{DIRECT_PORT}" if proxied
              else f"{link.server_ip}:{PORT}")
    conf = nginx_conf(run_dir, data, listen, access_log, log_format)
    proc = subprocess.Popen(["ip", "netns", "exec", link.ns, "nginx", "-p", str(run_dir), "-c", str(conf),
                             "-e", str(run_dir / "nginx-error.log")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://{link.server_ip}:{PORT}/"
    direct = f"http://{link.server_ip}:{DIRECT_PORT}/" if proxied else url
    try:
        wait_for(lambda: proc.poll() is not None or curl_ok(direct + probe), "nginx in the namespace", 15)
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(run_dir / 'nginx-error.log').read_text()}")
        yield url
    finally:
        stop(proc)


def range_server(root: Path):
    """tests/support's aiohttp RangeServer on loopback serving `root` (a context manager; `.url_for(name)`,
    `.stats`, `.set_faults(...)`, `.ignore_range`)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.rangeserver import RangeServer

    return RangeServer(root)


def write_certificates(folder: Path) -> Path:
    """A private CA and a leaf certificate for 127.0.0.1 (leaf.pem holds leaf + CA, key.pem its key);
    returns the CA's file."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1), not_valid_after=now + datetime.timedelta(days=1))
    ca = (x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(),
                                  serial_number=x509.random_serial_number(), **valid)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                                    issuer_name=ca_name, public_key=key.public_key(),
                                    serial_number=x509.random_serial_number(), **valid)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "leaf.pem").write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    (folder / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "ca.pem"
