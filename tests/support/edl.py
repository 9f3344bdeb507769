"""Earthdata Login on loopback: real aiohttp servers, each on its own address (127.0.0.x) and port, as
NASA's services behave (the ways in and out, and expiry).

- `LoginHost`: /oauth/authorize checks HTTP Basic against its own netrc entry (the users it knows),
  hands out a one-time code and redirects back to the data host's redirect_uri; 401 otherwise.
  It also issues and revokes EDL user tokens (bearer tokens).
- `DataHost`: a url without a session redirects to the login host; /login?code= redeems the code,
  sets a host-only session cookie (with a lifetime) and redirects to the url first asked for. With a
  session (or a valid bearer token) it answers ranges, or, with `signed_host`, redirects to a signed
  url on that third host. /s3credentials (behind the same login) hands out temporary S3
  credentials that `S3Gate` accepts until they expire.
- `SignedHost`: serves ranges of a url whose signature and expiry check out; no credentials.
- `S3Gate`: a proxy in front of moto's S3 server that accepts only presigned requests whose
  X-Amz-Security-Token is a session token handed out and not expired, with its own access key id
  (moto does not check session tokens itself).

Every server logs every request's headers (and query) in `log`: tests assert from them that no
credential reaches a host it does not belong to.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import json
import netrc
import secrets
import threading
import time
from urllib.parse import quote, urlencode, urlsplit

from aiohttp import ClientSession, web

RANGE_HEADERS = ("Content-Range", "Content-Length", "ETag", "Last-Modified", "Accept-Ranges", "Content-Type")


class Loop:
    """An asyncio loop in a thread that runs the servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def serve(self, app: web.Application, host: str) -> int:
        async def start():
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, 0)
            await site.start()
            self.runners.append(runner)
            return runner.addresses[0][1]

        return self.run(start())

    def close(self) -> None:
        async def stop():
            for runner in self.runners:
                await runner.cleanup()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Server:
    """One host: an aiohttp app on `address`, logging every request."""

    name = "server"

    def __init__(self, loop: Loop, address: str) -> None:
        self.address = address
        self.log: list[dict] = []
        app = web.Application(middlewares=[self._logged])
        self.routes(app)
        self.port = loop.serve(app, address)
        self.netloc = f"{address}:{self.port}"
        self.url = f"http://{self.netloc}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @web.middleware
    async def _logged(self, request, handler):
        self.log.append({"method": request.method, "path": request.path, "query": dict(request.query),
                         "headers": dict(request.headers)})
        return await handler(request)

    def headers_seen(self, name: str) -> list[str]:
        return [entry["headers"][key] for entry in self.log for key in entry["headers"] if key.lower() == name.lower()]


def serve_range(request: web.Request, data: bytes, etag: str) -> web.Response:
    headers = {"ETag": etag, "Last-Modified": "Sat, 28 Nov 2026 00:00:00 GMT", "Accept-Ranges": "bytes"}
    spec = request.headers.get("Range")
    if request.method == "HEAD" or not spec:
        headers["Content-Length"] = str(len(data))
        return web.Response(status=200, body=b"" if request.method == "HEAD" else data, headers=headers)
    first, _, last = spec.removeprefix("bytes=").partition("-")
    start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
    if start >= len(data):
        return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return web.Response(status=206, body=data[start:end + 1], headers=headers)


class LoginHost(Server):
    name = "login"

    def __init__(self, loop: Loop, address: str, netrc_path: str) -> None:
        self.netrc_path = netrc_path
        self.codes: dict[str, str] = {}  # code -> user
        self.tokens: dict[str, tuple[str, float]] = {}  # bearer token -> (user, expires)
        self.logins = 0
        super().__init__(loop, address)

    def routes(self, app):
        app.router.add_get("/oauth/authorize", self.authorize)

    def users(self) -> dict[str, str]:
        """The users this host knows: its own entry of the netrc (what the user registered)."""
        entry = netrc.netrc(self.netrc_path).hosts.get(self.address)
        return {entry[0]: entry[2]} if entry else {}

    async def authorize(self, request):
        auth = request.headers.get("Authorization", "")
        user = None
        if auth.startswith("Basic "):
            login, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            if self.users().get(login) == password:
                user = login
        if user is None:
            return web.Response(status=401, text="Unauthorized", headers={"WWW-Authenticate": 'Basic realm="EDL"'})
        code = secrets.token_urlsafe(16)
        self.codes[code] = user
        self.logins += 1
        back = request.query["redirect_uri"]
        state = request.query.get("state", "")
        raise web.HTTPFound(f"{back}?{urlencode({'code': code, 'state': state})}")

    def redeem(self, code: str) -> str | None:
        return self.codes.pop(code, None)

    def issue_token(self, user: str, lifetime: float = 3600) -> str:
        token = "edl-" + secrets.token_urlsafe(24)
        self.tokens[token] = (user, time.time() + lifetime)
        return token

    def token_user(self, token: str) -> str | None:
        found = self.tokens.get(token)
        return found[0] if found and found[1] > time.time() else None


class DataHost(Server):
    name = "data"

    def __init__(self, loop: Loop, address: str, login: LoginHost, files: dict[str, bytes],
                 signed_host: "SignedHost | None" = None, gate: "S3Gate | None" = None,
                 session_lifetime: float = 3600, credentials_lifetime: float = 3600) -> None:
        self.login, self.files, self.signed_host, self.gate = login, files, signed_host, gate
        self.sessions: dict[str, float] = {}  # session cookie value -> expiry
        self.session_lifetime = session_lifetime
        self.credentials_lifetime = credentials_lifetime
        self.credentials_issued = 0
        super().__init__(loop, address)

    def routes(self, app):
        app.router.add_get("/login", self.redeem)
        app.router.add_get("/s3credentials", self.s3credentials)
        app.router.add_get("/{name:.+}", self.data)

    def _authorized(self, request) -> bool:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.login.token_user(auth[7:]) is not None
        session = request.cookies.get("edl_session")
        return session is not None and self.sessions.get(session, 0) > time.time()

    def _to_login(self, request):
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):  # EDL answers a bad token itself, no redirect
            raise web.HTTPUnauthorized(text="token expired or revoked")
        query = urlencode({"client_id": "daac", "response_type": "code", "redirect_uri": f"{self.url}/login",
                           "state": request.path_qs})
        raise web.HTTPFound(f"{self.login.url}/oauth/authorize?{query}")

    async def redeem(self, request):
        user = self.login.redeem(request.query.get("code", ""))
        if user is None:
            return web.Response(status=401, text="bad code")
        session = secrets.token_urlsafe(16)
        self.sessions[session] = time.time() + self.session_lifetime
        response = web.HTTPFound(request.query.get("state") or "/")
        # (the cookie outlives the session on the server's side, as a data host's may: it must log in again)
        response.set_cookie("edl_session", session, path="/", httponly=True, max_age=3600)
        raise response

    async def s3credentials(self, request):
        if not self._authorized(request):
            self._to_login(request)
        key, token = self.gate.issue(self.credentials_lifetime)
        self.credentials_issued += 1
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=self.credentials_lifetime)
        return web.json_response({"accessKeyId": key, "secretAccessKey": self.gate.secret, "sessionToken": token,
                                  "expiration": expires.strftime("%Y-%m-%d %H:%M:%S+00:00")})

    async def data(self, request):
        name = request.match_info["name"]
        if name not in self.files:
            return web.Response(status=404)
        if not self._authorized(request):
            self._to_login(request)
        if self.signed_host is not None and name.startswith("signed/"):
            raise web.HTTPFound(self.signed_host.sign(name))
        return serve_range(request, self.files[name], f'"{hashlib.md5(self.files[name]).hexdigest()}"')


class SignedHost(Server):
    """Object storage behind signed urls (CloudFront / S3 presigned, as NASA's DAACs redirect to)."""

    name = "signed"

    def __init__(self, loop: Loop, address: str, files: dict[str, bytes]) -> None:
        self.files = files
        self.key = secrets.token_bytes(16)
        super().__init__(loop, address)

    def routes(self, app):
        app.router.add_get("/{name:.+}", self.data)

    def sign(self, name: str, lifetime: float = 60) -> str:
        expires = str(int(time.time() + lifetime))
        signature = hmac.new(self.key, f"{name}:{expires}".encode(), "sha256").hexdigest()
        return f"{self.url}/{quote(name)}?{urlencode({'Expires': expires, 'Signature': signature})}"

    async def data(self, request):
        name = request.match_info["name"]
        expires = request.query.get("Expires", "0")
        want = hmac.new(self.key, f"{name}:{expires}".encode(), "sha256").hexdigest()
        if not hmac.compare_digest(want, request.query.get("Signature", "")) or int(expires) < time.time():
            return web.Response(status=403, text="bad or expired signature")
        return serve_range(request, self.files[name], f'"{hashlib.md5(self.files[name]).hexdigest()}"')


class S3Gate(Server):
    """In front of moto: only requests signed with a live session token handed out pass."""

    name = "s3"

    def __init__(self, loop: Loop, address: str, moto_url: str) -> None:
        self.moto_url = moto_url
        self.secret = "edl-secret-" + secrets.token_hex(8)
        self.issued: dict[str, tuple[str, float]] = {}  # session token -> (access key id, expires)
        self.refused: list[str] = []
        self.passed = 0
        self._session: ClientSession | None = None
        super().__init__(loop, address)

    def routes(self, app):
        app.router.add_route("*", "/{path:.*}", self.forward)

    def issue(self, lifetime: float) -> tuple[str, str]:
        key = "ASIA" + secrets.token_hex(8).upper()
        token = "FwoGZX" + secrets.token_urlsafe(32)
        self.issued[token] = (key, time.time() + lifetime)
        return key, token

    async def forward(self, request):
        token = request.query.get("X-Amz-Security-Token") or request.headers.get("X-Amz-Security-Token")
        credential = request.query.get("X-Amz-Credential", "")
        if not credential:  # a request signed in its Authorization header (s3fs's listings)
            credential = request.headers.get("Authorization", "").partition("Credential=")[2]
        found = self.issued.get(token or "")
        why = None
        if found is None:
            why = "unknown session token"
        elif found[1] <= time.time():
            why = "expired session token"
        elif not credential.startswith(found[0] + "/"):
            why = "access key id does not match the session token"
        if why is not None:
            self.refused.append(why)
            return web.Response(status=400 if "expired" in why else 403, text=why)
        self.passed += 1
        if self._session is None:
            self._session = ClientSession(auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("range", "if-match", "if-none-match")}
        async with self._session.request(request.method, self.moto_url + request.path_qs, headers=headers) as r:
            body = await r.read()
            out = {k: v for k, v in r.headers.items() if k in RANGE_HEADERS}
            return web.Response(status=r.status, body=body if request.method != "HEAD" else None, headers=out)


def credential_headers_seen(server: Server) -> dict[str, list[str]]:
    """The credentials each kind a server was sent: Authorization, Cookie, X-Amz-Security-Token."""
    seen = {"Authorization": server.headers_seen("Authorization"), "Cookie": server.headers_seen("Cookie"),
            "X-Amz-Security-Token": server.headers_seen("X-Amz-Security-Token")}
    seen["X-Amz-Security-Token"] += [e["query"]["X-Amz-Security-Token"] for e in server.log
                                     if "X-Amz-Security-Token" in e["query"]]
    return seen


def netloc_of(url: str) -> str:
    return urlsplit(url).netloc


__all__ = ["Loop", "LoginHost", "DataHost", "SignedHost", "S3Gate", "credential_headers_seen", "json"]


# -- the whole scene: every way in, one reference set --------------------------------------------------

USER, PASSWORD = "alice", "correct horse battery"


class World:
    """A login host (127.0.0.2), a data host behind it (127.0.0.3: a session cookie; some urls
    redirect on to signed urls on 127.0.0.4), a data host taking bearer tokens (127.0.0.6), and, with
    `moto_url`, a credentials endpoint behind the login handing out S3 credentials that S3Gate
    (127.0.0.5, in front of moto) accepts until they expire. `refs()` is a raw reference set over
    all of them; `expected` the bytes of each key."""

    def __init__(self, directory, moto_url: str | None = None, object_size: int = 1 << 20,
                 credentials_lifetime: float = 3600, password: str = PASSWORD) -> None:
        import os
        import random

        self.dir = directory
        self.password = password  # what the user's netrc says
        self.netrc = os.path.join(directory, "netrc")
        with open(self.netrc, "w") as f:  # the login host's entry only: no other host gets a password
            f.write(f"machine 127.0.0.2 login {USER} password \"{password}\"\n")
        os.chmod(self.netrc, 0o600)
        rng = random.Random(35)
        self.files = {"a.bin": rng.randbytes(object_size), "signed/b.bin": rng.randbytes(object_size)}
        # the login host checks Basic against its own netrc (the users it knows, with their real
        # passwords), whatever the user's netrc says
        registered = os.path.join(directory, "login-host-users.netrc")
        with open(registered, "w") as f:
            f.write(f"machine 127.0.0.2 login {USER} password \"{PASSWORD}\"\n")
        self.loop = Loop()
        self.login = LoginHost(self.loop, "127.0.0.2", registered)
        self.signed = SignedHost(self.loop, "127.0.0.4", self.files)
        self.gate = S3Gate(self.loop, "127.0.0.5", moto_url) if moto_url else None
        self.data = DataHost(self.loop, "127.0.0.3", self.login, self.files, signed_host=self.signed, gate=self.gate,
                             credentials_lifetime=credentials_lifetime)
        self.bearer_files = {"c.bin": rng.randbytes(object_size)}
        self.bearer = DataHost(self.loop, "127.0.0.6", self.login, self.bearer_files)
        self.token_file = os.path.join(directory, "edl-token")
        self.rotate_token()
        self.s3_objects = {}
        if moto_url:
            import s3fs

            fs = s3fs.S3FileSystem(key="moto", secret="moto", endpoint_url=moto_url)
            fs.mkdir("daac-bucket")
            self.s3_objects = {"granule.nc": rng.randbytes(object_size)}
            for key, body in self.s3_objects.items():
                fs.pipe(f"daac-bucket/{key}", body)
        self.servers = [s for s in (self.login, self.data, self.signed, self.bearer, self.gate) if s is not None]

    def rotate_token(self, revoke_old: bool = True) -> str:
        """A new EDL token in the token file (written whole, then renamed in: as token tools do)."""
        import os

        if revoke_old:
            self.login.tokens.clear()
        token = self.login.issue_token(USER)
        with open(self.token_file + ".new", "w") as f:
            f.write(token + "\n")
        os.replace(self.token_file + ".new", self.token_file)
        return token

    def targets(self) -> dict[str, tuple[str, bytes]]:
        """key -> (url, the object's bytes)."""
        out = {"cookie/a": (f"{self.data.url}/a.bin", self.files["a.bin"]),
               "signed/b": (f"{self.data.url}/signed/b.bin", self.files["signed/b.bin"]),
               "bearer/c": (f"{self.bearer.url}/c.bin", self.bearer_files["c.bin"])}
        for key, body in self.s3_objects.items():
            out["s3/" + key] = (f"s3://daac-bucket/{key}", body)
        return out

    def refs(self) -> dict:
        return {"version": 1, "refs": {key: [url, 0, len(body)] for key, (url, body) in self.targets().items()}}

    def mount_args(self) -> list[str]:
        # (no --allow-cross-host-redirects: the login dance and the signed-url hop are followed by default)
        args = ["--view", "raw", "--bearer-token", f"127.0.0.6={self.token_file}",
                "--cookie-jar", f"{self.dir}/urs_cookies"]
        if self.gate is not None:
            args += ["--s3-credentials-url", f"{self.data.url}/s3credentials",
                     "--remote-options", json.dumps({"endpoint_url": self.gate.url})]
        return args

    def env(self) -> dict:
        import os

        return {**os.environ, "NETRC": self.netrc}

    def assert_credentials_stayed_home(self) -> None:
        """No credential header reached a host it does not belong to (from every server's log)."""
        basic = "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        for server in self.servers:
            seen = credential_headers_seen(server)
            if server is self.login:
                assert set(seen["Authorization"]) <= {basic}, seen
                assert not seen["Cookie"] and not seen["X-Amz-Security-Token"], seen
            elif server is self.data:
                assert not seen["Authorization"] and not seen["X-Amz-Security-Token"], seen
                assert all(c.startswith("edl_session=") and ";" not in c for c in seen["Cookie"]), seen
            elif server is self.bearer:
                assert all(a.startswith("Bearer edl-") for a in seen["Authorization"]), seen
                assert not seen["Cookie"] and not seen["X-Amz-Security-Token"], seen
            elif server is self.gate:  # (a listing signs in its Authorization header: S3's own, with the key handed out)
                assert all(a.startswith("AWS4-HMAC-SHA256 Credential=ASIA") for a in seen["Authorization"]), seen
                assert not seen["Cookie"], seen
            else:  # the signed-url host gets nothing
                assert not any(seen.values()), seen

    def close(self) -> None:
        self.loop.close()


def read_loop(mountpoint, world: World, seconds: float, block: int = 64 << 10, seed: int = 0) -> dict:
    """Read random ranges of every key through the mount for `seconds`, dropping the kernel's pages of
    each file after each read; every read checked against the source bytes. -> counts."""
    import os
    import random

    rng = random.Random(seed)
    targets = world.targets()
    counts = {"reads": 0, "failed": 0, "wrong": 0, "errors": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, (_url, body) in targets.items():
            offset = rng.randrange(0, len(body) - block)
            try:
                fd = os.open(os.path.join(mountpoint, key), os.O_RDONLY)
                try:
                    got = os.pread(fd, block, offset)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError as e:
                counts["failed"] += 1
                counts["errors"].append(f"{key}: {e}")
                continue
            counts["reads"] += 1
            if got != body[offset:offset + block]:
                counts["wrong"] += 1
        time.sleep(0.05)
    return counts
