"""The compact, immutable in-memory form of a reference set.

Every key gets an index ``i``. Per-key facts live in parallel numpy arrays rather than Python objects,
so a million references cost tens of MB instead of hundreds:

- ``url_id[i]``: index into ``urls`` (interned), or ``INLINE`` when the bytes are in ``inline[i]``;
- ``offset[i]``, ``length[i]``: the byte range; ``length[i] == WHOLE_FILE`` for a ``[url]`` reference;
- keys are stored UTF-8 in one blob; lookups go through a sorted array of their hashes (O(log n));
- ``dir_of[i]``: the id of the key's parent directory (0 is the root).

Loaders (json, parquet, gen) feed a `RefSetBuilder` in batches; nothing re-parses strings at read time.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.limits import format_size
from refmount.cache.malloc import give_back_freed_memory

INLINE = -1
WHOLE_FILE = -1
MAX_LENGTH = 2**53  # offsets and lengths beyond this cannot come from honest JSON (float precision)
MAX_NAME_BYTES = 255
MAX_KEY_BYTES = 4096  # PATH_MAX: a longer path cannot be opened; and each key's directories cost its length squared
_first = itemgetter(0)


@dataclass(frozen=True, slots=True)
class Ref:
    """One reference, materialised on demand for a single key."""

    key: str
    url: str | None  # None for inline data
    offset: int
    length: int  # WHOLE_FILE when the reference is the entire remote file
    data: bytes | None = None  # inline bytes

    @property
    def is_inline(self) -> bool:
        return self.url is None

    @property
    def is_whole_file(self) -> bool:
        return self.url is not None and self.length == WHOLE_FILE


def key_problem(key: str) -> str | None:
    """Why `key` cannot be a path, or None. The slow, per-key form of `_check_keys`."""
    if key == "":
        return "is empty"
    if "\x00" in key:
        return "contains a NUL byte"
    if key.startswith("/"):
        return "starts with '/'"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"is longer than {MAX_KEY_BYTES} bytes"
    for segment in key.split("/"):
        problem = name_problem(segment)
        if problem is not None:
            return f"has a path segment that {problem}"
    return None


def name_problem(name: str) -> str | None:
    """Why `name` cannot be one entry of a directory, or None: the one check of every name that comes
    from outside (a key's segment, a listed file, an index link, a DMR++ variable, a catalog item)."""
    if name == "":
        return "is empty"
    if "\x00" in name:
        return "contains a NUL byte"
    if "/" in name:
        return "contains '/'"
    if name in (".", ".."):
        return f"is {name!r}"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a local file name's bytes that are no UTF-8 (os.fsdecode's surrogates)
        return "is not UTF-8"
    if size > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def _has_bad_key(encoded: bytes, count: int) -> bool:
    """Cheap whole-batch screen over the NUL-joined UTF-8 keys with numpy (a few passes at C speed);
    may only err towards True. Separators are '/' and the NULs between keys."""
    raw = np.frombuffer(encoded, dtype=np.uint8)
    nul = raw == 0
    if len(raw) == 0 or int(np.count_nonzero(nul)) != count - 1:
        return True  # an empty batch, or a NUL inside a key
    sep = np.ones(len(raw) + 2, dtype=bool)  # sep[k + 1] is raw[k]; both ends count as separators
    sep[1:-1] = nul | (raw == 0x2F)
    if (sep[1:] & sep[:-1]).any():
        return True  # an empty segment: a leading or trailing '/', '//', or an empty key
    dot = raw == 0x2E
    if (dot & sep[:-2] & sep[2:]).any() or (dot[:-1] & dot[1:] & sep[:-3] & sep[3:]).any():
        return True  # a '.' or '..' segment
    if ((raw[:-1] == 0xED) & (raw[1:] >= 0xA0)).any():
        return True  # a lone surrogate (surrogatepass's ED A0-BF ..): not UTF-8
    return int(np.diff(np.flatnonzero(sep)).max()) - 1 > MAX_NAME_BYTES


def _check_keys(encoded: bytes, count: int, keys: list[str] | None) -> None:
    """Validate a batch of NUL-joined keys (`keys`: the same as strs, if at hand); per-key work
    happens only to name a culprit."""
    if _has_bad_key(encoded, count):
        for key in keys or encoded.decode("utf-8", "surrogatepass").split("\x00"):
            problem = key_problem(key)
            if problem:
                raise RefsError(f"key {quote(key)} cannot be a path: it {problem}")


# Key hashes: a polynomial hash of the UTF-8 bytes, mod 2**64, then a finaliser that spreads it.
# Computed for whole batches with numpy from prefix sums (no str per key); equal keys always hash
# equal, and a collision only costs a comparison of the bytes.
_MASK64 = (1 << 64) - 1
_P = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
_P_INVERSE = pow(_P, -1, 1 << 64)
_HASH_RUN_BYTES = 256 << 10
_powers = np.ones(1, np.uint64)
_inverse_powers = np.ones(1, np.uint64)


def _powers_up_to(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i (mod 2**64) for i < n, kept and grown by doubling."""
    global _powers, _inverse_powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        _powers = np.cumprod(np.full(size, _P, np.uint64)) * np.uint64(_P_INVERSE)  # wraps mod 2**64
        _inverse_powers = np.cumprod(np.full(size, _P_INVERSE, np.uint64)) * np.uint64(_P)
    return _powers[:n], _inverse_powers[:n]


def _finalise(h):
    """murmur3's fmix64, on a numpy uint64 array or a Python int."""
    if isinstance(h, int):
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & _MASK64
        h ^= h >> 33
        return h - (1 << 64) if h >= 1 << 63 else h
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h.view(np.int64)


def key_hash(encoded: bytes) -> int:
    """The hash of one key's UTF-8 bytes, as `key_hashes` computes it (which is faster for long keys)."""
    if len(encoded) > 512:
        return int(key_hashes(encoded, np.array([len(encoded)], np.int64))[0])
    h = 0
    for byte in reversed(encoded):
        h = (h * _P + byte) & _MASK64
    return _finalise(h)


def key_hashes(blob: bytes, key_len: np.ndarray) -> np.ndarray:
    """int64 hashes of the keys stored back to back in `blob` with byte lengths `key_len`, in runs
    of keys of about _HASH_RUN_BYTES (the prefix sums, and the powers kept, stay that small)."""
    data = np.frombuffer(blob, np.uint8)
    ends = np.cumsum(key_len)
    hashes = np.empty(len(key_len), np.int64)
    first = 0
    while first < len(key_len):
        start = int(ends[first] - key_len[first])
        last = max(first + 1, int(np.searchsorted(ends, start + _HASH_RUN_BYTES, side="right")))
        stop = int(ends[last - 1])
        powers, inverse_powers = _powers_up_to(stop - start + 1)
        prefix = np.zeros(stop - start + 1, np.uint64)
        np.cumsum(data[start:stop] * powers[:-1], out=prefix[1:])  # sum of byte[t] * P**t for t < i
        key_ends = ends[first:last] - start
        key_starts = key_ends - key_len[first:last]
        hashes[first:last] = _finalise((prefix[key_ends] - prefix[key_starts]) * inverse_powers[key_starts])
        first = last
    return hashes


async def each_file(refset, dir_id: int, start: int = 0):
    """(stable position, key index) of the files directly in a directory, via `files_from`."""
    while True:
        positions, indexes = await refset.files_from(dir_id, start, 4096)
        if len(positions) == 0:
            return
        for item in zip(positions.tolist(), indexes.tolist()):
            yield item
        start = int(positions[-1]) + 1


class DirRegistry:
    """Directory paths that keys imply. Id 0 is the root (path ''). A quarter of `max_refs_size`
    bounds the text of all paths, which costs about three times that in memory (distinct deep keys
    imply many long ones: 1,000 keys of 2,000 segments, 4 GB)."""

    def __init__(self, max_refs_size: int | None = None) -> None:
        self.max_refs_size = max_refs_size
        self.max_bytes = None if max_refs_size is None else max_refs_size // 4
        self.path_bytes = 0
        self.paths: list[str] = [""]
        self.parent: list[int] = [0]
        self.ids: dict[str, int] = {"": 0}
        self.children: list[dict[str, int]] = [{}]

    def id_for(self, path: str) -> int:
        found = self.ids.get(path)
        if found is not None:
            return found
        missing = []  # a loop, not recursion: keys may be thousands of segments deep
        while found is None:
            missing.append(path)
            path = path.rpartition("/")[0]
            found = self.ids.get(path)
        self.path_bytes += sum(map(len, missing))
        if self.max_bytes is not None and self.path_bytes > self.max_bytes:
            raise RefsError(f"the keys imply more than {format_size(self.max_bytes)} of directory paths (a quarter "
                            f"of --max-refs-size {format_size(self.max_refs_size)}), at {quote(missing[0])}")
        for path in reversed(missing):
            new = len(self.paths)
            self.paths.append(path)
            self.parent.append(found)
            self.children.append({})
            self.children[found][path.rpartition("/")[2]] = new
            self.ids[path] = new
            found = new
        return found

    def __len__(self) -> int:
        return len(self.paths)


class RefSetBuilder:
    """Accumulates references in batches and freezes them into a `RefSet`."""

    def __init__(self, max_keys: int | None = None, max_bytes: int | None = None) -> None:
        self.max_keys = max_keys
        self.max_bytes = max_bytes  # --max-refs-size: reference text read, and text that gen makes
        self.generated_bytes = 0
        self.urls: list[str] = []
        self._url_ids: dict[str, int] = {}
        self.dirs = DirRegistry(max_bytes)
        self._batches: list[tuple] = []
        self._inline: dict[int, bytes] = {}
        self.count = 0

    def url_id(self, url: str) -> int:
        found = self._url_ids.get(url)
        if found is None:
            found = self._url_ids[url] = len(self.urls)
            self.urls.append(url)
        return found

    def url_ids(self, urls) -> np.ndarray:
        """Intern many urls at C speed: only the distinct new ones take a Python step."""
        for url in dict.fromkeys(urls):
            if url not in self._url_ids:
                self.url_id(url)
        return np.fromiter(map(self._url_ids.__getitem__, urls), dtype=np.int32, count=len(urls))

    def reserve(self, n: int, what: str) -> None:
        """Refuse before doing the work when the key budget would be exceeded."""
        if self.max_keys is not None and self.count + n > self.max_keys:
            raise RefsError(
                f"{what} would make {self.count + n:,} keys, more than --max-keys {self.max_keys:,}"
            )

    def reserve_bytes(self, n: int, what: str, check_only: bool = False) -> None:
        """Refuse before making them when generated keys and urls would exceed --max-refs-size
        (`check_only`: an estimate, not counted)."""
        if self.max_bytes is not None and self.generated_bytes + n > self.max_bytes:
            raise RefsError(f"{what} would make {self.generated_bytes + n:,} bytes of keys and urls, more than "
                            f"--max-refs-size {format_size(self.max_bytes)}")
        if not check_only:
            self.generated_bytes += n

    def add_batch(self, keys: list[str], url_ids, offsets, lengths, inline: dict[int, bytes] | None = None):
        """Add len(keys) references. `inline` maps positions within this batch to their bytes
        (their url id must be INLINE). Offsets and lengths must already be validated integers."""
        if keys:
            self.add_encoded("\x00".join(keys).encode("utf-8", "surrogatepass"), len(keys), url_ids, offsets,
                             lengths, inline, keys)

    def add_encoded(self, encoded: bytes, n: int, url_ids, offsets, lengths, inline: dict[int, bytes] | None = None,
                    keys: list[str] | None = None):
        """`add_batch` with the keys given as their UTF-8 forms joined by NULs (which no key may
        hold), so that no str per key is needed."""
        self.reserve(n, "the reference set")
        _check_keys(encoded, n, keys)
        # Byte lengths from the NULs between the keys (checked above: no key holds one).
        between = np.flatnonzero(np.frombuffer(encoded, dtype=np.uint8) == 0)
        key_len = np.diff(np.concatenate(([-1], between, [len(encoded)]))) - 1
        if int(key_len.max()) > MAX_KEY_BYTES:
            _check_keys(b"", 0, keys or encoded.decode("utf-8", "surrogatepass").split("\x00"))
        blob = encoded.replace(b"\x00", b"")
        hashes = key_hashes(blob, key_len)
        dir_ids = self._dir_ids(encoded, n)
        if inline:
            for pos, data in inline.items():
                self._inline[self.count + pos] = data
        self._batches.append(
            (
                blob,
                key_len,
                hashes,
                dir_ids,
                np.asarray(url_ids, dtype=np.int32),
                np.asarray(offsets, dtype=np.int64),
                np.asarray(lengths, dtype=np.int64),
                # Sorted runs make the final sort of all hashes cheaper, and batches converted by
                # worker processes sort theirs in parallel.
                np.argsort(hashes, kind="stable").astype(np.int32),
            )
        )
        self.count += n

    def _dir_ids(self, encoded: bytes, n: int) -> np.ndarray:
        """Parent directory id of every key. A piece of a refs object usually holds the chunks of
        one array: when substring counts prove that every key has the same parent, no per-key
        Python work is needed."""
        parent = encoded.split(b"\x00", 1)[0].rpartition(b"/")[0]
        if parent:
            depth = parent.count(b"/") + 1
            prefix = parent + b"/"
            same = (encoded.count(b"/") == n * depth and encoded.startswith(prefix)
                    and encoded.count(b"\x00" + prefix) == n - 1)
        else:
            same = b"/" not in encoded
        if same:
            return np.full(n, self.dirs.id_for(parent.decode("utf-8", "surrogatepass")), dtype=np.int32)
        keys = encoded.decode("utf-8", "surrogatepass").split("\x00")
        parents = list(map(_first, map(str.rpartition, keys, repeat("/"))))
        for parent in dict.fromkeys(parents):
            self.dirs.id_for(parent)
        return np.fromiter(map(self.dirs.ids.__getitem__, parents), dtype=np.int32, count=n)

    def export(self) -> tuple:
        """This builder's contents, to be merged into another (a worker process's result)."""
        return self.urls, self.dirs.paths, self._batches, self._inline, self.count

    def merge(self, exported: tuple) -> None:
        """Append another builder's batches, mapping its url and directory ids onto ours."""
        urls, dir_paths, batches, inline, count = exported
        self.reserve(count, "the reference set")
        url_map = np.array([self.url_id(u) for u in urls] or [0], dtype=np.int32)
        dir_map = np.array([self.dirs.id_for(p) for p in dir_paths], dtype=np.int32)
        for pos, data in inline.items():
            self._inline[self.count + pos] = data
        for blob, key_len, hashes, dir_ids, url_ids, offsets, lengths, hash_order in batches:
            remote = url_ids >= 0
            url_ids[remote] = url_map[url_ids[remote]]
            self._batches.append((blob, key_len, hashes, dir_map[dir_ids], url_ids, offsets, lengths, hash_order))
        self.count += count

    def remap_urls(self, urls: list[str]) -> None:
        """Replace the url table (e.g. after rendering templates); equal results are merged."""
        new_ids: dict[str, int] = {}
        mapping = np.fromiter((new_ids.setdefault(u, len(new_ids)) for u in urls), np.int32, len(urls))
        self.urls = list(new_ids)
        self._url_ids = new_ids
        for batch in self._batches:
            ids = batch[4]
            remote = ids >= 0
            ids[remote] = mapping[ids[remote]]

    def build(self) -> RefSet:
        # Each column is released from the batches as soon as it is joined, so that building
        # holds the batches and the finished table at the same time for one column only.
        batches = [list(batch) for batch in self._batches]
        self._batches = []

        def parts(column: int) -> list:
            found = [batch[column] for batch in batches]
            for batch in batches:
                batch[column] = None
            return found

        def take(column: int, dtype) -> np.ndarray:
            found = parts(column)
            joined = np.concatenate(found).astype(dtype, copy=False) if found else np.zeros(0, dtype)
            del found
            give_back_freed_memory()  # the small parts' pages cannot hold the next big column
            return joined

        give_back_freed_memory()  # what parsing left behind

        starts = np.cumsum([0] + [len(batch[2]) for batch in batches[:-1]], dtype=np.int64)
        hash_runs = np.concatenate([order + start for order, start in zip(parts(7), starts)]) if batches else None
        blob = b"".join(parts(0))
        key_len = take(1, np.int64)
        key_start = np.zeros(len(key_len) + 1, dtype=np.int64)
        np.cumsum(key_len, out=key_start[1:])
        del key_len
        refset = RefSet(
            blob=blob,
            key_start=key_start,
            hashes=take(2, np.int64),
            hash_runs=hash_runs,
            dir_of=take(3, np.int32),
            url_id=take(4, np.int32),
            offset=take(5, np.int64),
            length=take(6, np.int64),
            urls=self.urls,
            inline=self._inline,
            dirs=self.dirs,
        )
        return refset


class RefSet:
    """Immutable reference table plus the directory structure its keys imply."""

    def __init__(self, *, blob, key_start, hashes, dir_of, url_id, offset, length, urls, inline, dirs,
                 hash_runs=None):
        self._blob = blob
        self._key_start = key_start
        self.url_id = url_id
        self.offset = offset
        self.length = length
        self.urls: list[str] = urls
        self.inline: dict[int, bytes] = inline
        self.dirs: DirRegistry = dirs
        # hash_runs: a permutation that sorts each batch's hashes (stable sorts of sorted runs merge
        # them); the result equals a stable argsort of `hashes` either way.
        if hash_runs is None:
            order = np.argsort(hashes, kind="stable")
        else:
            order = hash_runs[np.argsort(hashes[hash_runs], kind="stable")]
        sorted_hashes = hashes[order]
        dir_of = self._drop_duplicates(order, sorted_hashes, dir_of)
        self.dir_of = dir_of
        self._hash_order = order.astype(np.int32) if len(order) < 2**31 else order
        self._sorted_hashes = sorted_hashes
        del hashes
        # Listing: keys grouped by directory, in load order within a directory (stable offsets).
        if len(dir_of) and np.all(dir_of[1:] >= dir_of[:-1]):  # already grouped (kerchunk's usual order)
            self._by_dir = np.arange(len(dir_of), dtype=self._hash_order.dtype)
        else:
            self._by_dir = np.argsort(dir_of, kind="stable").astype(self._hash_order.dtype)
        self._dir_bounds = np.searchsorted(dir_of[self._by_dir], np.arange(len(dirs) + 1), side="left")
        self._check_dir_file_clashes()

    def _drop_duplicates(self, order, sorted_hashes, dir_of):
        """A key given twice keeps its last value (as a JSON object or fsspec would)."""
        same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
        if len(same) == 0:
            return dir_of
        dead = []
        for j in same:
            a, b = int(order[j]), int(order[j + 1])
            if self.key_bytes(a) == self.key_bytes(b):
                dead.append(min(a, b))
        if dead:
            dir_of = dir_of.copy()
            dir_of[dead] = -1
            for i in dead:
                self.inline.pop(i, None)
        return dir_of

    def _check_dir_file_clashes(self) -> None:
        """No key may also be a directory. Only directories holding both files and directories are
        looked at, from whichever side is smaller (a chain of thousands of directories costs nothing)."""
        for parent, children in enumerate(self.dirs.children):
            files = self.file_count(parent) if children else 0
            if not files:
                continue
            prefix = self.dirs.paths[parent] + "/" if parent else ""
            if len(children) <= files:
                clashes = [name for name in children if self.find(prefix + name) >= 0]
            else:
                names = {n.decode("utf-8", "surrogatepass") for n in self.names(self.files_in(parent), parent)}
                clashes = [name for name in children if name in names]
            if clashes:
                raise RefsError(f"key {quote(prefix + clashes[0])} is both a file and a directory prefix")

    # -- keys -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of live keys (duplicates dropped)."""
        return int(self._dir_bounds[-1] - self._dir_bounds[0])

    @property
    def capacity(self) -> int:
        """Size of the index space (live keys plus dropped duplicates)."""
        return len(self.url_id)

    def key_bytes(self, i: int) -> bytes:
        return self._blob[self._key_start[i] : self._key_start[i + 1]]

    def key(self, i: int) -> str:
        return self.key_bytes(i).decode("utf-8", "surrogatepass")

    def find(self, key: str) -> int:
        """Index of `key`, or -1."""
        encoded = key.encode("utf-8", "surrogatepass")
        h = key_hash(encoded)
        lo = int(np.searchsorted(self._sorted_hashes, h, side="left"))
        n = len(self._sorted_hashes)
        while lo < n and self._sorted_hashes[lo] == h:
            i = int(self._hash_order[lo])
            if self.dir_of[i] >= 0:
                if self.key_bytes(i) == encoded:
                    return i
            lo += 1
        return -1

    def ref(self, i: int) -> Ref:
        uid = int(self.url_id[i])
        if uid == INLINE:
            return Ref(self.key(i), None, 0, len(self.inline[i]), self.inline[i])
        return Ref(self.key(i), self.urls[uid], int(self.offset[i]), int(self.length[i]))

    # -- the access interface shared with lazy (Parquet) reference sets ------------------------------
    # Filesystem, views and array planning use only these, so a set whose references load on demand
    # can stand in for this eager one. `ensure`, `afind` and `files_from` may do I/O (async).

    def exists(self, i: int) -> bool:
        return 0 <= i < len(self.url_id) and self.dir_of[i] >= 0

    def dir_id(self, i: int) -> int:
        return int(self.dir_of[i])

    def target(self, i: int) -> tuple[int, int, int]:
        """(url id or INLINE, offset, length or WHOLE_FILE) of key index i."""
        # .item(): plain ints without numpy scalars in between, 2x faster (a listing asks for every file)
        return self.url_id.item(i), self.offset.item(i), self.length.item(i)

    def inline_data(self, i: int) -> bytes | None:
        return self.inline.get(i)

    async def ensure(self, i: int) -> None:
        """Make key index i's reference available (everything already is, here)."""

    async def afind(self, key: str) -> int:
        return self.find(key)

    async def files_from(self, dir_id: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(stable positions, key indexes) of up to `count` files directly in a directory, from
        position `start` on, as numpy arrays; empty at the end. A listing asks for what one readdir
        reply can hold, so that a million-entry directory costs numpy calls per reply, not per entry."""
        files = self.files_in(dir_id)
        stop = min(start + count, len(files))
        return np.arange(start, stop), files[start:stop]

    def names(self, indexes: np.ndarray, dir_id: int) -> list[bytes]:
        """File names (keys less their directory's path) of key indexes directly in `dir_id`."""
        skip = len(self.dirs.paths[dir_id].encode("utf-8", "surrogatepass")) + 1 if dir_id else 0
        blob = self._blob
        return [blob[a:b] for a, b in zip((self._key_start[indexes] + skip).tolist(),
                                          self._key_start[indexes + 1].tolist())]

    # -- directories ------------------------------------------------------------------------------

    def files_in(self, dir_id: int, start: int = 0):
        """Key indexes directly inside directory `dir_id`, from position `start`, in a stable order."""
        lo, hi = int(self._dir_bounds[dir_id]), int(self._dir_bounds[dir_id + 1])
        return self._by_dir[lo + start : hi]

    def file_count(self, dir_id: int) -> int:
        return int(self._dir_bounds[dir_id + 1] - self._dir_bounds[dir_id])

    def to_dict(self) -> dict:
        """The v0 form (for tests, --dry-run summaries and small sets only)."""
        out = {}
        for i in range(self.capacity):
            if self.dir_of[i] < 0:
                continue
            r = self.ref(i)
            if r.is_inline:
                out[r.key] = r.data
            elif r.is_whole_file:
                out[r.key] = [r.url]
            else:
                out[r.key] = [r.url, r.offset, r.length]
        return out
