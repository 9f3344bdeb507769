"""s3:// targets on the HTTP engine: obstore signs each object's url, the HTTP backend fetches it.

An s3:// object is read as an http(s) url presigned by obstore (SigV4 in the query string, only the
Host header signed), through the same HttpBackend as http(s) targets: the stdlib engine for plain
206 answers, aiohttp for anything else. So every check of http.py applies to S3 as it is
(Content-Range, body length, Content-Encoding, ETag/Last-Modified/size on every answer, redirects
same-host only, one-line errors, --read-timeout and --stall-timeout, the retry policy), and bodies
land in the block buffers the engine is given. obstore is used for what it does well here: the
credential chain and the signature. Its own GET is not used: it follows redirects to any host,
takes that host's bytes, and forwards X-Amz-Security-Token there (docs/operations.md), and it
allocates a buffer per request that no pool of ours can replace.

`--remote-options` are s3fs's; `engine_config` maps those it can (key, secret, token, anon,
endpoint_url, client_kwargs.region_name / endpoint_url / verify, config_kwargs.s3.addressing_style,
profile) and says which option it cannot, in which case the mount reads s3:// through s3fs as
before (fsspec_backend.py). Credentials not given in the options come from botocore's chain, as
s3fs's would (environment, profiles, SSO, web identity, container, instance metadata).

A presigned url is valid for SIGNED_FOR; each is signed again after half of that. Without a region
in the options or an endpoint of its own, a bucket's region is asked of AWS once, as botocore
would learn it from a redirect.
"""

from __future__ import annotations

import datetime
import http.client
import logging
import os
import ssl
import threading
import time
from urllib.parse import quote, urlsplit

import trio

from refmount.errors import FetchError
from refmount.fetch.stats import redact

log = logging.getLogger("refmount")

SIGNED_FOR = datetime.timedelta(hours=1)
# s3fs options that do not change what a read of an object gets (caching, listing, uploads, sessions)
_NO_EFFECT = frozenset({
    "default_block_size", "default_fill_cache", "default_cache_type", "cache_regions", "use_listings_cache",
    "listings_expiry_time", "max_paths", "skip_instance_cache", "asynchronous", "loop", "max_concurrency",
    "fixed_upload_size", "default_acl", "autocommit", "headers", "ssl"})
_AWS_REGION_PROBE = "https://s3.amazonaws.com"  # a HEAD of a bucket here tells its region (x-amz-bucket-region)


def engine_config(options: dict) -> tuple[dict | None, str | None]:
    """(config, None) for S3Signer from s3fs-style --remote-options, or (None, the option it cannot
    express): reads then go through s3fs."""
    config: dict = {"anon": bool(options.get("anon", False))}
    for name, value in options.items():
        if name in _NO_EFFECT or name == "anon":
            continue
        if name in ("key", "secret", "token", "profile", "endpoint_url") and isinstance(value, str):
            config[name] = value
        elif name == "client_kwargs" and isinstance(value, dict):
            for inner, setting in value.items():
                if inner in ("region_name", "endpoint_url") and isinstance(setting, str):
                    config["region" if inner == "region_name" else "endpoint_url"] = setting
                elif inner == "verify" and isinstance(setting, (bool, str)):
                    config["verify"] = setting
                else:
                    return None, f"client_kwargs.{inner}"
        elif name == "config_kwargs" and isinstance(value, dict):
            for inner, setting in value.items():
                if inner == "signature_version" and setting in ("s3v4", "v4"):
                    continue
                if inner == "s3" and isinstance(setting, dict) and set(setting) <= {"addressing_style"} \
                        and setting.get("addressing_style", "auto") in ("auto", "path", "virtual"):
                    config["virtual"] = setting.get("addressing_style") == "virtual"
                else:
                    return None, f"config_kwargs.{inner}"
        else:
            return None, name
    if config.get("virtual") and "endpoint_url" in config:  # (botocore puts the bucket into the endpoint's host)
        return None, "config_kwargs.s3.addressing_style virtual with endpoint_url"
    if ("key" in config) != ("secret" in config):
        return None, "key without secret" if "key" in config else "secret without key"
    if options.get("ssl") is False:
        config["verify"] = False
    return config, None


def ssl_for(config: dict):
    """The backend's ssl setting: False (verify: false), or a context trusting client_kwargs.verify,
    --ca-bundle, AWS_CA_BUNDLE or the usual conventions (tls.py), in that order."""
    from refmount.fetch.tls import ca_bundle, explicit_ca_bundle

    verify = config.get("verify", True)
    if verify is False:
        return False
    cafile = verify if isinstance(verify, str) else (explicit_ca_bundle() or os.environ.get("AWS_CA_BUNDLE")
                                                     or ca_bundle())
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as e:
        raise FetchError(f"CA bundle {cafile!r} cannot be used for s3: {e}") from None


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key) of s3://bucket/key (the key as it is: s3fs does not decode %xx either)."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise FetchError(f"{redact(url)}: not an s3://bucket/key url")
    return bucket, key


class S3Signer:
    """`signer(url, method)` -> the presigned http(s) url of s3://bucket/key. Buckets are made ready
    (`ready`: their region looked up, credentials found) in a worker thread, once each."""

    def __init__(self, config: dict, ssl_context, connect_timeout: float = 10.0) -> None:
        self.config = config
        self.ssl = ssl_context
        self.connect_timeout = connect_timeout
        self._stores: dict[str, object] = {}  # bucket -> obstore S3Store, or a base url when anonymous
        self._signed: dict[tuple, tuple] = {}  # (url, method) -> (signed url, when signed, credentials' generation)
        self._credentials = None  # botocore's, when the options give none
        self._lock = threading.Lock()
        self._regions: dict[str, str] = {}  # bucket -> its region, once found
        # --s3-credentials-url (s3creds.py): temporary credentials, refreshed; the stores and signed
        # urls are made anew for each generation of them
        self.temporary = None
        self._generation = None

    async def ready(self, url: str) -> None:
        if self.temporary is not None:
            credentials = await self.temporary.ensure()
            if credentials.generation != self._generation:
                with self._lock:
                    self._stores.clear()
                    self._signed.clear()
                    self._generation = credentials.generation
        bucket = split_url(url)[0]
        if bucket not in self._stores:
            await trio.to_thread.run_sync(self._prepare_for, url, bucket)

    def _prepare_for(self, url: str, bucket: str) -> None:
        try:
            self._prepare(bucket)
        except Exception as e:  # noqa: BLE001 - obstore's configuration errors run to many lines
            raise FetchError(f"{redact(url)}: {_first_line(e)}") from None

    def __call__(self, url: str, method: str) -> str:
        signed = self._signed.get((url, method))
        now = time.monotonic()
        generation = self._generation  # (a url signed with credentials since replaced is not reused)
        if signed is not None and now - signed[1] < SIGNED_FOR.total_seconds() / 2 and signed[2] == generation:
            return signed[0]
        bucket, key = split_url(url)
        store = self._stores.get(bucket)
        if store is None:
            self._prepare_for(url, bucket)  # (normally done in a thread by `ready`)
            store = self._stores[bucket]
        if isinstance(store, str):  # anonymous: nothing to sign
            wire = store + quote(key, safe="/~")
        else:
            import obstore

            try:
                wire = obstore.sign(store, method, key, SIGNED_FOR)
            except Exception as e:  # noqa: BLE001 - obstore's errors run to many lines
                raise FetchError(f"{redact(url)}: cannot sign the request: {_first_line(e)}") from None
        if len(self._signed) > 100_000:
            self._signed.clear()
        self._signed[(url, method)] = (wire, now, generation)
        return wire

    def _prepare(self, bucket: str) -> None:
        with self._lock:
            if bucket in self._stores:
                return
            config = self.config
            endpoint = config.get("endpoint_url")
            region = self._regions.get(bucket)
            if region is None:
                region = config.get("region") or (None if endpoint else self._bucket_region(bucket))
                region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
                self._regions[bucket] = region
            virtual = config.get("virtual", False)
            if config["anon"]:
                if endpoint:
                    base = f"{endpoint.rstrip('/')}/{bucket}/"
                elif virtual:
                    base = f"https://{bucket}.s3.{region}.amazonaws.com/"
                else:
                    base = f"https://s3.{region}.amazonaws.com/{bucket}/"
                self._stores[bucket] = base
                return
            from obstore.store import S3Store

            arguments: dict = {"region": region, "virtual_hosted_style_request": virtual}
            if endpoint:
                arguments["endpoint"] = endpoint
            if self.temporary is not None and self.temporary.current is not None:
                current = self.temporary.current
                arguments.update(access_key_id=current.key, secret_access_key=current.secret,
                                 session_token=current.token)
            elif "key" in config:
                arguments.update(access_key_id=config["key"], secret_access_key=config["secret"])
                if "token" in config:
                    arguments["session_token"] = config["token"]
            else:
                arguments["credential_provider"] = self._botocore_credentials
            client = {"allow_http": bool(endpoint and endpoint.startswith("http://"))}
            self._stores[bucket] = S3Store(bucket, client_options=client, **arguments)

    def _botocore_credentials(self) -> dict:
        """Credentials from botocore's chain (as s3fs finds them), for obstore: asked again every 5
        minutes; botocore refreshes temporary ones itself."""
        if self._credentials is None:
            import botocore.session

            session = botocore.session.Session(profile=self.config.get("profile"))
            self._credentials = session.get_credentials()
            if self._credentials is None:
                raise RuntimeError("no AWS credentials found (for a public bucket, pass '{\"anon\": true}' "
                                   "in --remote-options)")
        frozen = self._credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)}

    def _bucket_region(self, bucket: str) -> str | None:
        """The region AWS names for `bucket` (x-amz-bucket-region, on any answer to a HEAD of it), or
        None if it cannot be asked (then the environment's region, else us-east-1)."""
        probe = urlsplit(_AWS_REGION_PROBE)
        if probe.scheme == "https":
            conn = http.client.HTTPSConnection(probe.netloc, timeout=self.connect_timeout, context=self.ssl or None)
        else:
            conn = http.client.HTTPConnection(probe.netloc, timeout=self.connect_timeout)
        try:
            conn.request("HEAD", f"/{quote(bucket)}")
            return conn.getresponse().getheader("x-amz-bucket-region")
        except (OSError, http.client.HTTPException, ssl.SSLError) as e:
            log.info("s3://%s: cannot ask AWS for the bucket's region (%s)", bucket, e)
            return None
        finally:
            conn.close()


def s3_backend(options: dict, policy, stats, *, connections_per_host: int, allow_cross_host_redirects: bool,
               verify_remote: bool, client: str, logins=None, credentials=None):
    """An HttpBackend for s3:// urls, or None when --remote-options say something the engine cannot do
    (the reason is logged; s3fs then reads them)."""
    config, refused = engine_config(options)
    if credentials is not None and (config is None or config["anon"] or "key" in config):
        raise FetchError(f"--s3-credentials-url cannot be used with --remote-options "
                         f"{refused or ('anon' if config['anon'] else 'key')}")
    if config is None:
        log.info("s3:// targets go through s3fs: --remote-options %s has no equivalent on refmount's engine",
                 refused)
        return None
    if not config["anon"]:
        try:
            import obstore.store  # noqa: F401
        except ImportError:
            log.info("s3:// targets go through s3fs: obstore (which signs requests for refmount's engine) is "
                     "not installed")
            return None
    from refmount.fetch.http import HttpBackend

    context = ssl_for(config)
    backend = HttpBackend(policy, stats, connections_per_host=connections_per_host,
                          allow_cross_host_redirects=allow_cross_host_redirects, headers=None,
                          verify_remote=verify_remote, ssl=context, client=client, logins=logins)
    backend.signer = S3Signer(config, context if context is not False else None, policy.connect_timeout)
    backend.signer.temporary = credentials
    return backend


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0]
