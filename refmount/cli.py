"""Command line: `refmount mount|scan|umount|stats|inspect`. User mistakes print one line, exit non-zero."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys

from refmount import __version__
from refmount.errors import RefmountError

EXIT_USAGE = 2
_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '2G', '1.5GiB', '4096' -> bytes (binary units)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 4096, 512M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


_DURATION = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'30s', '5m', '1h', '1.5h', '90' (seconds) -> seconds, more than 0."""
    m = _DURATION.match(str(text))
    seconds = float(m.group(1)) * _SECONDS[(m.group(2) or "").lower()] if m else 0
    if not m or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 30s, 5m, 1h)")
    return seconds


def parse_json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"anon\": true}'")
    return value


def parse_protocols(text: str) -> set[str]:
    protocols = {p.strip().lower() for p in text.split(",") if p.strip()}
    if not protocols:
        raise argparse.ArgumentTypeError("give at least one protocol, e.g. 'http,https'")
    return protocols


def parse_bearer_tokens(text: str) -> dict[str, str]:
    """HOST=FILE[,HOST=FILE...] (or a JSON object from a TOML table) -> {host: file}."""
    if text.lstrip().startswith("{"):
        pairs = parse_json_object(text)
        if not all(isinstance(v, str) for v in pairs.values()):
            raise argparse.ArgumentTypeError("each host needs the path of its token file")
        return pairs
    tokens = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, path = item.partition("=")
        if not sep or not host.strip() or not path.strip() or "/" in host:
            raise argparse.ArgumentTypeError(f"{item!r} is not HOST=FILE (the token is read from FILE)")
        tokens[host.strip().lower()] = path.strip()
    if not tokens:
        raise argparse.ArgumentTypeError("give HOST=FILE")
    return tokens


def _positive(cast, what: str):
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 4 << 10, 64 << 20


def parse_block_size(text: str) -> int:
    """A power of two from 4K to 64M: blocks tile remote objects and the kernel's pages."""
    size = parse_size(text)
    if size < MIN_BLOCK_SIZE or size > MAX_BLOCK_SIZE or size & (size - 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a power of two from 4K to 64M")
    return size


_ADDRESS = re.compile(r"^(?:(\[[0-9A-Fa-f:.]+\]|[^:\[\]]*):)?(\d{1,5})$")


def parse_address(text: str) -> tuple[str, int]:
    """'9101', ':9101' -> ('127.0.0.1', 9101): loopback unless told; '0.0.0.0:9101', '[::1]:9101',
    'host:9101' as given."""
    m = _ADDRESS.match(text.strip())
    port = int(m.group(2)) if m else 0
    if not m or not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not PORT or ADDR:PORT (examples: 9101, 127.0.0.1:9101, "
                                         "0.0.0.0:9101)")
    return (m.group(1) or "127.0.0.1").strip("[]"), port


positive_float = _positive(float, "a positive number of seconds")
positive_int = _positive(int, "a positive integer")


class _VersionAction(argparse.Action):
    """--version: refmount's, and which pyfuse3 would serve a mount (imported only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from refmount.fuse.pyfuse3_build import describe

        print(f"refmount {__version__}, {describe()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as one line naming the option, exit status 2. Abbreviations
    are off (a typo must not silently pick an option), and an unknown option gets a "did you mean"."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            message = self._explain_unknown(unknown.group(1).split())
        sys.stderr.write(f"refmount: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)

    def _explain_unknown(self, words: list[str]) -> str:
        options = [w.split("=", 1)[0] for w in words if w.startswith("-")]
        if not options:
            return f"unexpected argument {words[0]!r}"
        bad = options[0]
        return f"unknown option {bad!r}" + did_you_mean(bad, self._all_options())

    def _all_options(self) -> list[str]:
        names = []
        for action in self._actions:
            names += action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    names += [n for a in sub._actions for n in a.option_strings]
        return names


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def add_mount_options(p: argparse.ArgumentParser) -> None:
    """Every option of `refmount mount` (also used by the fstab helper and the systemd config)."""
    FORM_NAMES = ("nc49", "nc493", "nc410", "zarr", "gdal", "portable")  # refmount.view.forms.FORMS (not imported: numpy)
    # (from refs.limits, not refs: its loaders import numpy and trio, which every command's parser would pay)
    from refmount.refs.limits import (DEFAULT_LOAD_TIMEOUT, DEFAULT_MAX_VALUE_SIZE, default_max_keys,
                                      default_max_refs_size, format_size)

    DEFAULT_MAX_KEYS = default_max_keys()

    p.add_argument("refs", metavar="REFS",
                   help="reference set: a JSON file (optionally .gz/.bz2/.xz/.zst), a Parquet reference "
                        "directory, an Icechunk repository, an OPeNDAP DMR++ file (X.dmrpp beside its data file X), "
                        "an http(s)://, s3://, ... url of either, or - for JSON on stdin; or data files scanned at "
                        "mount: a netCDF, HDF5, HDF4, GRIB, TIFF or FITS file, a glob, a directory, an s3:// prefix or @FILE of "
                        "them (see 'data files and archives' below)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing empty directory")
    g = p.add_argument_group("view")
    g.add_argument("--view", choices=("decoded", "raw"), default="decoded",
                   help="decoded (default): chunks decompressed and metadata rewritten so that any netCDF-C "
                        "(even without filter plugins) reads correct values; raw: every key's bytes exactly "
                        "as referenced")
    g.add_argument("--chars", choices=("char", "string", "ubyte"), default=None,
                   help="serve netCDF char arrays and strings in this form to every reader, overriding the form "
                        "each reader gets (see --form): char (netCDF-C 4.9.0's '<U1', which netCDF-C >= 4.9.3 and "
                        "zarr cannot read), string ('|S1', which crashes netCDF-C 4.9.0), ubyte (the bytes as "
                        "numbers, which every client reads)")
    g.add_argument("--form", choices=("auto", *FORM_NAMES), default="auto",
                   help="the metadata form of --view decoded: auto (default) gives each program the form it reads "
                        "right, told from the netCDF-C or GDAL library it has loaded: nc49 (netCDF-C 4.9.0: Debian "
                        "12's ncdump, NCO, CDO), nc493 (netCDF-C 4.9.3 to 4.9.x: Debian 13's), nc410 (netCDF-C >= "
                        "4.10: netCDF4-python wheels; nc493 and nc410 are NCZarr, read exactly as "
                        "'file:///MNT#mode=nczarr,file'), gdal (GDAL's "
                        "Zarr driver), zarr (everything else: zarr, xarray's zarr engine, cp), and to zarr-python "
                        "in a program of another form a zarr.json (Zarr v3) in the zarr form; a form name serves "
                        "that form to every program (and no zarr.json). A program may choose its own with "
                        "REFMOUNT_FORM=<form> in its environment")
    g.add_argument("--fallback-form", choices=FORM_NAMES, default="portable",
                   help="the form of a program that cannot be identified (another user's process, a pid "
                        "namespace without /proc): portable (default: characters as numbers, scalars [1], both "
                        "netCDF-C type hints; no reader crashes on it)")
    g = p.add_argument_group("process")
    g.add_argument("-f", "--foreground", action="store_true",
                   help="stay attached to the terminal (for systemd and debugging) instead of daemonising")
    g.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="log verbosity (default: info)")
    g.add_argument("--log-file", metavar="PATH",
                   help="append logs here; default: stderr in the foreground; in the background syslog (the "
                        "journal) if /dev/log exists, else $XDG_STATE_HOME/refmount/MOUNTPOINT.log "
                        "(/var/log/refmount/ for root). The mount prints where its log goes")
    g.add_argument("--dry-run", action="store_true",
                   help="load and validate the reference set, print a summary, and exit without mounting")
    g.add_argument("--metrics", type=parse_address, default=None, metavar="ADDR:PORT",
                   help="serve the mount's counters (those of 'refmount stats') to Prometheus at "
                        "http://ADDR:PORT/metrics; a bare PORT listens on 127.0.0.1 only (default: off)")
    g.add_argument("--owner-pid", type=positive_int, metavar="PID",
                   help="unmount when process PID exits (refmount.mount() in Python passes its own PID for a "
                        "temporary mountpoint)")
    g = p.add_argument_group("caching")
    g.add_argument("--memory-target", type=parse_size, default=None, metavar="SIZE",
                   help="the daemon's whole memory (RSS): Python and its libraries, the reference set's tables, "
                        "cached blocks, fetches in flight and read-ahead, decoded chunks and decoding; the caches "
                        "get what the rest leaves, and shrink (read-ahead first) if the process nears it "
                        "(default: 1G, or what --cache-size and --decoded-cache-size add up to when given)")
    g.add_argument("--cache-size", type=parse_size, default=None, metavar="SIZE",
                   help="the block cache's part of the memory: cached blocks, requests in flight and read-ahead "
                        "(default: two thirds of what --memory-target leaves for caches in --view decoded, all of "
                        "it in --view raw; 512M when only the cache sizes are given)")
    g.add_argument("--block-size", type=parse_block_size, default="1M", metavar="SIZE",
                   help="size of a cached block, the unit of caching: a power of two from 4K to 64M (default: 1M)")
    g.add_argument("--decoded-cache-size", type=parse_size, default=None, metavar="SIZE",
                   help="memory for decoded chunks in --view decoded (default: the rest of what --memory-target "
                        "leaves for caches; 256M when only the cache sizes are given)")
    g.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="do not read ahead of sequential readers")
    g.add_argument("--cache-dir", metavar="DIR",
                   help="also keep fetched blocks on disk in DIR, checksummed and kept across remounts "
                        "(one mount per DIR; default: memory only)")
    g.add_argument("--disk-cache-size", type=parse_size, default="10G", metavar="SIZE",
                   help="bound for --cache-dir, least recently used blocks evicted first (default: 10G)")
    from refmount.api import REMOTE_OPTIONS_ENV

    g = p.add_argument_group("network")
    # (also from the environment, where every user's `ps` cannot read it, as a command line's words
    # can be for the daemon's whole life: refmount.mount() passes its remote_options so)
    g.add_argument("--remote-options", type=parse_json_object, default=os.environ.get(REMOTE_OPTIONS_ENV, "{}"),
                   metavar="JSON",
                   help="options for the target filesystems, as fsspec's remote_options, e.g. "
                        "'{\"anon\": true}' or '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'; "
                        "'headers' also applies to http(s); default: $REFMOUNT_REMOTE_OPTIONS, else none "
                        "(secrets such as an Authorization header belong there, in --config or in "
                        "--bearer-token, not on the command line, which every user of the machine can read)")
    g.add_argument("--read-timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="total time one read may take, retries included, before it fails with EIO; also each index "
                        "page and catalog document a mount lists (default: 30)")
    g.add_argument("--stall-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="abandon and retry a connection that sends nothing for this long; a reference file or "
                        "store metadata whose server sends nothing for this long fails the mount (default: 10)")
    g.add_argument("--connections", type=positive_int, default=32, metavar="N",
                   help="most parallel connections per host, opened (--http-client stdlib) when the mount first "
                        "meets the host, so that parallel reads skip the handshake; read-ahead "
                        "adapts below it (a scan's parts: at most 8; the chunks a sparse read predicts, one request "
                        "each: up to N), and one remote object gets all but one of them (default: 32)")
    g.add_argument("--max-full-download", type=parse_size, default=None, metavar="SIZE",
                   help="a server that ignores Range sends every object from its first byte: reads of an object "
                        "share one pass over it (which keeps the blocks the reference set refers to as it goes), "
                        "and no pass streams further into an object than this; a read beyond gets EIO "
                        "(default: 1G, or --disk-cache-size with --cache-dir)")
    g.add_argument("--proxy", metavar="URL",
                   help="send http(s) target requests through this proxy (default: the HTTP_PROXY, HTTPS_PROXY "
                        "and NO_PROXY variables)")
    g.add_argument("--verify-remote", action="store_true",
                   help="http(s): make every ranged request conditional on the version first seen (If-Match with its "
                        "ETag, else If-Unmodified-Since), so the server itself refuses bytes of a replaced object")
    g.add_argument("--http-client", choices=("stdlib", "aiohttp"), default="stdlib",
                   help="how http(s) and s3 ranges are received: 'stdlib' reads a plain 206 answer with Python's "
                        "http.client in a worker thread, straight into cache blocks (less CPU per GB); anything "
                        "else (proxies, redirects, servers ignoring Range, chunked bodies) goes through aiohttp. "
                        "'aiohttp' uses aiohttp for everything (default: stdlib)")
    add_login_options(g)
    g.add_argument("--ca-bundle", metavar="PATH",
                   help="trust the certificate authorities in PATH for https (default: REQUESTS_CA_BUNDLE, "
                        "CURL_CA_BUNDLE, SSL_CERT_FILE, then the system store; AWS_CA_BUNDLE for s3)")
    g = p.add_argument_group("security")
    g.add_argument("--allow-other", action="store_true",
                   help="let every user of this machine read the mount (needs user_allow_other in /etc/fuse.conf "
                        "unless root): every key whose bytes are inline or remote, fetched with the mount's own "
                        "credentials (--remote-options, ~/.netrc, a proxy's); a key whose bytes come from local "
                        "files only for a user who may read those files (checked at each open; files show as 0444)")
    g.add_argument("--allow-protocols", type=parse_protocols, metavar="LIST",
                   help="comma-separated target protocols allowed, e.g. 'https,s3' (default: all, except that "
                        "a remote reference set may not point at local files, nor one from a public address at "
                        "ftp, sftp, smb, webhdfs and the like, whose connections refmount cannot check)")
    add_redirect_option(g)
    g.add_argument("--max-keys", type=positive_int, default=DEFAULT_MAX_KEYS, metavar="N",
                   help="refuse reference sets (or gen sections) with more keys than this (default: half the "
                        f"memory available at start / 350 bytes per key, here {DEFAULT_MAX_KEYS:,})")
    g.add_argument("--max-refs-size", type=parse_size, default=None, metavar="SIZE",
                   help="refuse reference files larger than this once decompressed, and gen sections that "
                        "would make more text of keys and urls (default: a sixth of the memory available at "
                        f"start, here {format_size(default_max_refs_size())})")
    g.add_argument("--max-value-size", type=parse_size, default=DEFAULT_MAX_VALUE_SIZE, metavar="SIZE",
                   help="refuse reference files in which one JSON value (an inline chunk, a metadata object) is "
                        f"larger than this once decompressed; loading holds at most about twice it in memory "
                        f"(default: {format_size(DEFAULT_MAX_VALUE_SIZE)})")
    g.add_argument("--load-timeout", type=positive_float, default=DEFAULT_LOAD_TIMEOUT, metavar="SECONDS",
                   help=f"give up loading the reference set after this long (default: {DEFAULT_LOAD_TIMEOUT:g})")
    add_archive_options(p)
    g = p.add_argument_group("kernel tuning (root only)")
    g.add_argument("--no-tune-kernel", dest="tune_kernel", action="store_false",
                   help="leave the kernel readahead and FUSE max_background as they are")
    g.add_argument("--read-ahead", type=parse_size, default="1M", metavar="SIZE",
                   help="kernel readahead for the mount when tuning (default: 1M)")
    g = p.add_argument_group("Icechunk repositories")
    add_version_options(g)
    add_authorization_options(g)
    add_dmrpp_options(p.add_argument_group("DMR++ files"))


def add_dmrpp_options(g) -> None:
    """--data-url (mount and inspect)."""
    g.add_argument("--data-url", metavar="URL",
                   help="read a DMR++ file's data from URL (a path or url of the netCDF-4/HDF5 file it describes) "
                        "instead of the file its dmrpp:href names, or the one beside it (its own name without "
                        ".dmrpp); chunks with their own href keep it")


def add_login_options(g) -> None:
    """Logins (mount and scan: index pages, sniffing and scans use them as reads do)."""
    g.add_argument("--cookie-jar", metavar="FILE",
                   help="keep the cookies (a login's session cookie) in FILE, Netscape format as curl's -b/-c "
                        "and NASA's ~/.urs_cookies: loaded at start, written (mode 0600) when a server sets one "
                        "(default: in memory only). Cookies go only where browsers would send them")
    g.add_argument("--bearer-token", action="append", type=parse_bearer_tokens, metavar="HOST=FILE",
                   help="send 'Authorization: Bearer' with the token in FILE to HOST (or HOST:PORT) only, e.g. an "
                        "Earthdata Login token; the file is reread when it changes, the token never appears in ps "
                        "or logs (repeatable, or comma-separated). Other hosts get their own ~/.netrc ($NETRC) entry")
    g.add_argument("--s3-credentials-url", metavar="URL",
                   help="sign s3:// targets with the temporary credentials this url hands out (JSON accessKeyId, "
                        "secretAccessKey, sessionToken, expiration: a NASA DAAC's s3credentials endpoint, fetched "
                        "through its login), fetched again before they expire")


def add_redirect_option(g) -> None:
    g.add_argument("--allow-cross-host-redirects", action="store_true",
                   help="also follow an HTTP redirect from a public host into this machine's own network (loopback, "
                        "link-local, private addresses). A redirect to another host is followed by default, as "
                        "GDAL and curl -L do (the signed-url hop of NASA's Earthdata Cloud), carrying none of the "
                        "--remote-options headers and no credential but that host's own; never to a scheme other "
                        "than http(s), never from https down to http")


def add_archive_options(p: argparse.ArgumentParser, mount: bool = True) -> None:
    """How data files (netCDF, HDF5, HDF4, GRIB, TIFF, FITS) and archives of them are scanned (mount and scan)."""
    g = p.add_argument_group("data files and archives" + (" (REFS a data file, a glob, a directory, an s3:// "
                                                          "prefix or @FILE; see docs/archives.md)" if mount else ""))
    g.add_argument("--concat", metavar="DIM",
                   help="combine the files into one dataset along dimension DIM (as kerchunk's MultiZarrToZarr): "
                        "variables over DIM concatenated in the order of DIM's values, its values re-encoded to "
                        "one CF unit and calendar; other variables taken once when identical in every file "
                        "(default: one subdirectory per file)")
    g.add_argument("--identical", action="append", default=[], metavar="VAR",
                   help="with --concat: take variable VAR from the first file without comparing it (repeatable, or "
                        "comma-separated)")
    g.add_argument("--skip-mismatched", action="store_true",
                   help="with --concat: leave out, with a log line, a file whose variables not along DIM differ "
                        "from the first file's (default: refuse the whole set, naming the file and variable)")
    g.add_argument("--strict", action="store_true",
                   help="a file of a glob, directory or list that is not a data file, or cannot be scanned, "
                        "and a catalog's item that is gone (404/410) or not valid STAC, fails the whole mount "
                        "(default: it is left out with a log line)")
    if mount:
        g.add_argument("--refresh", type=parse_duration, metavar="DURATION",
                       help="list the glob, directory, s3:// prefix, index page or catalog again every DURATION "
                            "(30s, 5m, 1h): new files appear (or extend the --concat dimension), changed ones are "
                            "scanned again, gone ones leave; open files keep the version they opened "
                            "(see docs/catalogs.md)")


def add_version_options(g) -> None:
    """--branch/--tag/--snapshot (mount and inspect)."""
    g.add_argument("--branch", metavar="NAME",
                   help="mount the snapshot this branch points at when mounting (default: main); the mount stays "
                        "on that snapshot, mount again to see later commits")
    g.add_argument("--tag", metavar="NAME", help="mount the snapshot of this tag")
    g.add_argument("--snapshot", metavar="ID", help="mount this snapshot id")
    g.add_argument("--container", action="append", metavar="NAME=URL_PREFIX",
                   help="re-point the repository's virtual chunk container NAME to URL_PREFIX for this mount, as "
                        "Icechunk's set_virtual_chunk_container does: its relative vcc://NAME/... chunk urls "
                        "resolve under URL_PREFIX (repeatable, or comma-separated)")


def add_authorization_options(g) -> None:
    g.add_argument("--authorize-container", action="append", metavar="URL_PREFIX",
                   help="Icechunk: read virtual chunks from the repository's virtual chunk container with this url "
                        "prefix (as Icechunk's authorize_virtual_chunk_access; repeatable, or comma-separated). "
                        "A mount whose snapshot uses a container not authorised is refused")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refmount", description="Mount kerchunk/fsspec reference sets as a read-only filesystem.")
    parser.add_argument("--version", action=_VersionAction, help="show refmount's version and pyfuse3's, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    p = sub.add_parser("mount", help="mount a reference set (returns once the mount is ready)",
                       description="Mount reference set REFS on MOUNTPOINT; returns once the mount answers.")
    add_mount_options(p)
    p.add_argument("--config", metavar="FILE", help="read REFS, MOUNTPOINT and options from a TOML file "
                   "(keys named like these options, e.g. cache-size = \"2G\"); used by refmount@.service")
    p = sub.add_parser("scan", help="write the references of data files (netCDF, HDF5, HDF4, GRIB, TIFF, FITS) to a file",
                       description="Scan the data files SOURCE names (a file, a glob, a directory, an s3:// prefix "
                                   "or @FILE; several may be given) and write their references to OUT: kerchunk JSON "
                                   "when OUT ends in .json or .json.gz, else Parquet (a new directory).")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to write: NAME.json, NAME.json.gz, or a directory for Parquet")
    p.add_argument("--remote-options", type=parse_json_object, default={}, metavar="JSON", help="as for mount")
    p.add_argument("--cache-dir", metavar="DIR", help="as for mount: scans are kept in DIR/scans (default: "
                   "$XDG_CACHE_HOME/refmount/scans)")
    p.add_argument("--load-timeout", type=positive_float, default=300.0, metavar="SECONDS",
                   help="give up scanning one file after this long (default: 300)")
    add_archive_options(p, mount=False)
    g = p.add_argument_group("logins (as for mount)")
    add_login_options(g)
    add_redirect_option(g)
    p = sub.add_parser("umount", help="unmount a refmount mount", description="Unmount MOUNTPOINT (works even if "
                       "the daemon died) and wait for the daemon to exit.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-z", "--lazy", action="store_true", help="detach now even if busy, clean up when no longer used")
    p.add_argument("--config", metavar="FILE", help="take MOUNTPOINT from this TOML config file")
    p = sub.add_parser("stats", help="print live counters of a running mount",
                       description="Print live counters of the daemon serving MOUNTPOINT.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("list", help="list live refmount mounts",
                       description="List every live refmount mount: mountpoint, reference set, view, PID, log.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("inspect", help="report each array's codecs and which netCDF-C versions can read it",
                       description="Report, for each array of REFS: dtype, shape, chunks, codecs, present and "
                                   "missing chunks, and whether netCDF-C 4.9.0 and >= 4.10 can read it per view.")
    p.add_argument("refs", metavar="REFS")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--remote-options", type=parse_json_object, default={}, metavar="JSON",
                   help="as for mount")
    add_version_options(p)
    add_dmrpp_options(p)
    return parser


def _listed(values) -> tuple:
    """A repeatable option's values, each also comma-separated."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def _bearer_tokens(args) -> dict[str, str]:
    """--bearer-token's HOST=FILE pairs, all of them (mount and scan)."""
    return {host: path for pairs in args.bearer_token or () for host, path in pairs.items()}


def options_from_args(args):
    from refmount.fuse.daemon import MountOptions
    from refmount.refs.icechunk_containers import parse_authorized, parse_repoint

    return MountOptions(
        refs="/dev/stdin" if args.refs == "-" else args.refs, mountpoint=args.mountpoint, view=args.view, foreground=args.foreground,
        memory_target=args.memory_target, cache_size=args.cache_size, block_size=args.block_size, remote_options=args.remote_options,
        read_timeout=args.read_timeout, stall_timeout=args.stall_timeout, connections=args.connections,
        allow_other=args.allow_other, allow_protocols=args.allow_protocols,
        allow_cross_host_redirects=args.allow_cross_host_redirects, max_keys=args.max_keys,
        log_level=args.log_level, log_file=args.log_file, tune_kernel=args.tune_kernel,
        read_ahead_kb=args.read_ahead // 1024, decoded_cache_size=args.decoded_cache_size,
        prefetch=args.prefetch, cache_dir=args.cache_dir, disk_cache_size=args.disk_cache_size,
        max_full_download=args.max_full_download,
        chars=args.chars, form=None if args.form == "auto" else args.form, fallback_form=args.fallback_form,
        proxy=args.proxy, owner_pid=args.owner_pid, metrics=args.metrics,
        verify_remote=args.verify_remote, ca_bundle=args.ca_bundle, http_client=args.http_client,
        cookie_jar=args.cookie_jar, s3_credentials_url=args.s3_credentials_url,
        bearer_tokens=_bearer_tokens(args),
        max_refs_size=args.max_refs_size, max_value_size=args.max_value_size, load_timeout=args.load_timeout,
        branch=args.branch, tag=args.tag, snapshot=args.snapshot,
        containers=parse_repoint(args.container), authorized_containers=parse_authorized(args.authorize_container),
        data_url=args.data_url,
        concat=args.concat, identical=_listed(args.identical), skip_mismatched=args.skip_mismatched, strict=args.strict,
        refresh=args.refresh,
    )


def config_to_argv(path: str, command: str) -> tuple[list[str], list[str]]:
    """Options and positionals from a TOML config file (systemd units): the same names as the CLI
    options, with dashes or underscores; `refs` and `mountpoint` are the positionals."""
    import tomllib

    try:
        with open(path, "rb") as f:
            config = tomllib.load(f)
    except OSError as e:
        raise RefmountError(f"config file {path!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise RefmountError(f"config file {path!r} is not valid TOML: {e}") from None
    options: list[str] = []
    for key, value in config.items():
        name = key.replace("_", "-")
        if name in ("refs", "mountpoint"):
            continue
        if isinstance(value, bool):
            if name in ("prefetch", "tune-kernel"):  # on by default: only "false" means something
                options += [] if value else [f"--no-{name}"]
            elif value:
                options.append(f"--{name}")
        elif isinstance(value, dict):
            options += [f"--{name}", json.dumps(value)]
        elif isinstance(value, list):
            options += [f"--{name}", ",".join(map(str, value))]
        else:
            options += [f"--{name}", str(value)]
    missing = [k for k in (("refs", "mountpoint") if command == "mount" else ("mountpoint",)) if k not in config]
    if missing:
        raise RefmountError(f"config file {path!r} lacks {', '.join(missing)}")
    positionals = [str(config["refs"]), str(config["mountpoint"])] if command == "mount" else [str(config["mountpoint"])]
    if command == "umount":
        options = []
    return options, positionals


def _expand_config(argv: list[str]) -> list[str]:
    if "--config" not in argv or not argv or argv[0] not in ("mount", "umount"):
        return argv
    i = argv.index("--config")
    if i + 1 >= len(argv):
        return argv  # argparse reports the missing value
    options, positionals = config_to_argv(argv[i + 1], argv[0])
    rest = argv[1:i] + argv[i + 2:]
    return [argv[0], *options, *rest, *positionals]


def _version(args):
    from refmount.refs.icechunk import version_from_options

    return version_from_options(args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _expand_config(argv)
    except RefmountError as e:
        sys.stderr.write(f"refmount: {e}\n")
        return 1
    try:
        args = build_parser().parse_args(argv)  # (--help writes too: into a closed pipe, below)
        status = _run(args)
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler below, not at exit
        return status
    except RefmountError as e:
        from refmount.fetch.stats import redact  # (a signed url a loader's error names: its token)

        sys.stderr.write(f"refmount: {redact(str(e))}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("refmount: interrupted\n")
        return 130
    except SystemExit:  # --help, or a usage error, written: its flush at exit may meet a closed pipe too
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
        raise
    except BrokenPipeError:  # `refmount stats MNT | head`: the reader has what it wanted
        _stdout_to_devnull()
        return 141


def _stdout_to_devnull() -> None:
    """So that the exit-time flush of a closed pipe fails silently too."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _scan(args) -> int:
    import logging

    from types import SimpleNamespace

    from refmount.fuse.early import install_logins
    from refmount.refs import default_max_refs_size
    from refmount.refs.scan.archive import ArchiveOptions
    from refmount.refs.scan.export import scan_to_file
    from refmount.view.bounded import decode_bounded

    from refmount.fetch.stats import RedactingFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("refmount: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    progress = None
    if sys.stderr.isatty():
        from refmount.fuse.progress import ScanProgress

        progress = ScanProgress()
    options = ArchiveOptions(concat=args.concat, identical=_listed(args.identical), skip_mismatched=args.skip_mismatched,
                             strict=args.strict, cache_dir=args.cache_dir, remote_options=args.remote_options,
                             progress=progress, decode=decode_bounded, s3_credentials_url=args.s3_credentials_url,
                             allow_cross_host_redirects=args.allow_cross_host_redirects)
    install_logins(SimpleNamespace(  # (the mount's: bearer tokens, cookies, netrc, S3 credentials)
        bearer_tokens=_bearer_tokens(args),
        cookie_jar=args.cookie_jar, s3_credentials_url=args.s3_credentials_url, remote_options=args.remote_options,
        allow_cross_host_redirects=args.allow_cross_host_redirects))
    try:
        return scan_to_file(args.sources, args.output, options, max_refs_size=default_max_refs_size(),
                            timeout=args.load_timeout)
    finally:
        if progress:
            progress.close()


def _run(args) -> int:
    if args.command == "mount":
        from refmount.fuse import daemon

        opts = options_from_args(args)
        if args.dry_run:
            from refmount.fuse.summary import print_summary

            return print_summary(opts)
        return daemon.mount(opts)
    if args.command == "scan":
        return _scan(args)
    if args.command == "umount":
        from refmount.fuse.daemon import umount

        return umount(args.mountpoint, lazy=args.lazy)
    if args.command == "stats":
        from refmount.fuse.summary import print_stats

        return print_stats(args.mountpoint, as_json=args.json)
    if args.command == "inspect":
        from refmount.view.inspect import run_inspect

        from refmount.refs.icechunk_containers import parse_repoint

        return run_inspect(args.refs, remote_options=args.remote_options, as_json=args.json,
                           version=_version(args), containers=parse_repoint(args.container),
                           data_url=args.data_url)
    if args.command == "list":
        from refmount.fuse.summary import print_list

        return print_list(as_json=args.json)
    return 0
