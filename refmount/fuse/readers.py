"""Which program opens a file, and so which metadata form it reads right (refmount.view.forms).

A FUSE request carries the caller's thread id. From /proc we read what the program is and the
libraries it has mapped:
- a netCDF-C library (Debian 12's libnetcdf.so.19, Debian 13's libnetcdf.so.22, the wheels'
  netcdf4.libs/libnetcdf-*.so.22, ...): its version string ("4.9.0 of Aug  7 2022 ...", what
  nc_inq_libvers returns) gives "nc49" for 4.9.0 and older, "portable" for 4.9.1 and 4.9.2, "nc493"
  for 4.9.3 to 4.9.x (Debian 13's 4.9.3), "nc410" for >= 4.10 (the wheels' 4.10.1): `netcdf_form`;
  a chrooted program's library is read through /proc/PID/root;
- a GDAL library with a GDAL program (gdalinfo, gdalmdiminfo, ogr2ogr, qgis, ...) or without netCDF-C:
  "gdal" (GDAL's own tools map netCDF-C too, for their netCDF driver);
- neither: "zarr" (zarr-python, xarray's zarr engine, cp, tar, rclone, ...).
`REFMOUNT_FORM=<form>` in a program's environment chooses its form (e.g. `REFMOUNT_FORM=nc49 cp -r`
makes a copy for Debian's ncdump). A reader whose /proc we cannot read (another user's process
without root, a pid from another pid namespace: 0) gets the fallback form.

A library's version is read once per file (device, inode); a process's form is kept per (thread,
start time) and, until a netCDF-C or GDAL library is found, looked at again whenever the process's
virtual size changed (a library loaded since: `import netCDF4` after zarr first read the mount).
"""

from __future__ import annotations

import os
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass

import trio

from refmount.view.forms import FALLBACK, FORMS

ENV_VAR = "REFMOUNT_FORM"
_NETCDF = re.compile(r"^libnetcdf(?:[-.].*)?\.so(?:\.(\d+))?")
_GDAL = re.compile(r"^libgdal(?:[-.].*)?\.so")
_VERSION = re.compile(rb"(\d+)\.(\d+)\.(\d+)(?:\.\d+)?(-[\w.]+)? of [A-Z][a-z]{2} [ \d]\d \d{4} \d\d:\d\d:\d\d \$")
# GDAL's programs (they map netCDF-C too, for the netCDF driver, but read Zarr through GDAL's driver)
_GDAL_PROGRAMS = re.compile(r"^(gdal|ogr|gnm|nearblack|qgis)")
NCZARR_SINCE = (4, 9, 3)  # the first netCDF-C to read NCZarr's keys from .zattrs (forms.NC493)
_MAX_PROCESSES = 4096
_MAX_LIBRARY_BYTES = 64 << 20


@dataclass(frozen=True)
class Reader:
    program: str  # the executable's name ("ncdump", "python3.11"), or why it is unknown
    library: str  # "netCDF-C 4.9.0", "GDAL", "REFMOUNT_FORM", or ""
    form: str
    final: bool = True  # no library loaded later can change it

    @property
    def label(self) -> str:
        return f"{self.program} ({self.library})" if self.library else self.program


class ReaderIdentifier:
    def __init__(self, fallback: str = FALLBACK, proc: str = "/proc") -> None:
        self.fallback = fallback
        self.proc = proc
        self._processes: OrderedDict[tuple[int, int], tuple[int, Reader]] = OrderedDict()
        self._versions: dict[tuple[str, str], tuple | None] = {}  # (device, inode) -> (version, as named)
        self.served: Counter[tuple[str, str]] = Counter()  # (reader label, form) -> files opened
        self._one_at_a_time = trio.CapacityLimiter(1)  # (the tables above are not shared across threads)

    async def form_of_caller(self, pid: int, opens: bool = True) -> str:
        """`form_of`: on this thread for a process known already (its /proc/PID/stat read, which takes
        no lock of the caller's memory map, unlike its maps: `ncdump -h` opens ~500 files, and a worker
        thread's hand-off for each was ~20 ms of it), else in a worker thread: it reads /proc and, once
        per library file, searches up to 64 MiB of it for netCDF-C's version string, which must not
        hold up the FUSE thread."""
        async with self._one_at_a_time:
            reader = self.identify(pid, known_only=True) or await trio.to_thread.run_sync(self.identify, pid)
            return self._counted(reader, opens)

    def form_of(self, pid: int, opens: bool = True) -> str:
        """The form to serve to the process that sent a request with this pid; counted in `served`
        when it `opens` a file (not when it looks one up)."""
        return self._counted(self.identify(pid), opens)

    def _counted(self, reader: Reader, opens: bool) -> str:
        if opens:
            self.served[reader.label, reader.form] += 1
        return reader.form

    def identify(self, pid: int, known_only: bool = False) -> Reader | None:
        """The reader of this pid; `known_only`: None rather than read more of /proc than its stat."""
        stat = self._stat(pid)
        if stat is None:
            return Reader("unidentified" if pid else "unidentified (another pid namespace)", "", self.fallback, False)
        comm, start, vsize = stat
        key = (pid, start)
        cached = self._processes.get(key)
        if cached is not None and (cached[1].final or cached[0] == vsize):
            self._processes.move_to_end(key)
            return cached[1]
        if known_only:
            return None
        reader = self._examine(pid, comm, cached[1] if cached else None)
        self._processes[key] = (vsize, reader)
        self._processes.move_to_end(key)
        while len(self._processes) > _MAX_PROCESSES:
            self._processes.popitem(last=False)
        return reader

    def statistics(self) -> dict:
        """{form: {reader: files opened}}, for `refmount stats`."""
        out: dict[str, dict[str, int]] = {}
        for (label, form), count in sorted(self.served.items()):
            out.setdefault(form, {})[label] = count
        return out

    # -- /proc ------------------------------------------------------------------------------------

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            with open(f"{self.proc}/{pid}/{name}", "rb") as f:
                return f.read()
        except OSError:
            return None

    def _stat(self, pid: int) -> tuple[str, int, int] | None:
        """(command name, start time, virtual size) from /proc/PID/stat."""
        if pid <= 0:
            return None
        data = self._read(pid, "stat")
        if not data:
            return None
        head, _, rest = data.rpartition(b")")
        fields = rest.split()
        try:  # fields 22 (start time) and 23 (vsize) of proc(5), counted after the command name
            return head.partition(b"(")[2].decode("utf-8", "replace"), int(fields[19]), int(fields[20])
        except (IndexError, ValueError):
            return None

    def _examine(self, pid: int, comm: str, before: Reader | None) -> Reader:
        try:
            program = os.path.basename(os.readlink(f"{self.proc}/{pid}/exe")) or comm
        except OSError:
            program = comm
        if before is None:  # (the environment is read once: it is what the program was started with)
            wanted = self._environment_form(pid)
            if wanted:
                return Reader(program, ENV_VAR, wanted)
        maps = self._read(pid, "maps")
        if maps is None:  # another user's process: its libraries are not ours to see
            return Reader(program, "", self.fallback, False)
        netcdf, gdal = None, False
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].decode("utf-8", "surrogateescape")
            name = path.rpartition("/")[2]
            if netcdf is None and (m := _NETCDF.match(name)):
                netcdf = self._netcdf_version(pid, path, parts[3].decode(), parts[4].decode(), m.group(1))
            elif not gdal and _GDAL.match(name):
                gdal = True
        if gdal and (netcdf is None or _GDAL_PROGRAMS.match(program)):
            return Reader(program, "GDAL", "gdal")
        if netcdf is not None:
            version, text = netcdf
            return Reader(program, f"netCDF-C {text}", netcdf_form(version))
        return Reader(program, "", "zarr", False)

    def _environment_form(self, pid: int) -> str | None:
        data = self._read(pid, "environ") or b""
        for item in data.split(b"\0"):
            if item.startswith(ENV_VAR.encode() + b"="):
                value = item.partition(b"=")[2].decode("utf-8", "replace").strip()
                return value if value in FORMS else None
        return None

    def _netcdf_version(self, pid: int, path: str, device: str, inode: str,
                        soname: str | None) -> tuple[tuple[int, int, int], str]:
        """(version, as named) of netCDF-C's library file: the version it names itself by (what
        nc_inq_libvers returns; a development snapshot, "4.9.3-development", counts as the release
        before: netCDF4 1.6.5's, of 2023, reads 4.9.2's form, not 4.9.3's); else a guess from its soname
        (19: 4.8-4.9, 22: 4.10); (0, 0, 0) when neither tells."""
        key = (device, inode)
        if key not in self._versions:
            found = None
            for candidate in (f"{self.proc}/{pid}/root{path}", path):  # (the process may see another root)
                try:
                    with open(candidate, "rb") as f:
                        m = _VERSION.search(f.read(_MAX_LIBRARY_BYTES))
                except OSError:
                    continue
                if m:
                    major, minor, patch = (int(x) for x in m.groups()[:3])
                    suffix = (m.group(4) or b"").decode("ascii", "replace")
                    found = ((major, minor, patch - 1) if suffix else (major, minor, patch), f"{major}.{minor}.{patch}{suffix}")
                break
            self._versions[key] = found
        found = self._versions[key]
        if found is not None:
            return found
        if soname and soname.isdigit():  # (4.9.3 is .so.22 too: Debian 13)
            return ((4, 10, 0), "4.10 (by its soname)") if int(soname) >= 22 else ((4, 9, 0), "4.9 (by its soname)")
        return (0, 0, 0), "unknown version"


def netcdf_form(version: tuple[int, int, int]) -> str:
    """The form of a netCDF-C version: "nc49" to 4.9.0; "portable" for 4.9.1 and 4.9.2, which read
    neither 4.9.0's '<U1' nor the NCZarr keys of 4.9.3 in .zattrs (theirs are in .zgroup and .zarray;
    measured: the netCDF4 1.6.3 wheel's 4.9.1 opens only that form); "nc493" (NCZarr's own metadata,
    strings as characters) to 4.9.x; "nc410" (the same, strings as strings) from 4.10."""
    if version < (4, 9, 1):
        return "nc49"
    if version < NCZARR_SINCE:
        return "portable"
    return "nc410" if version >= (4, 10, 0) else "nc493"
