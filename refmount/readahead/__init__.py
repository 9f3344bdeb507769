"""Read-ahead: what to fetch before readers ask for it, and how much memory that may hold.

- budget.py: the read-ahead share of the block cache's memory budget, handed out as reservations
  (tokens released exactly once), as mountpoint-s3's `mem_limiter` does;
- walk.py: the walks reads make over an array's chunk grid (no I/O);
- planner.py: the one place that decides, per reader, which chunks to fetch ahead (a `GridPlan`);
- streams.py: sequential read-ahead of remote files' bytes (the byte streams), per reader.

Walks and streams are keyed by reader: the pid of the process that opened the file (`READER`, set
by the filesystem around each read), so that readers reading side by side are not taken for one walk.
"""

from __future__ import annotations

from contextvars import ContextVar

# The pid of the process whose open the current read goes through (0: unknown). A context variable:
# set by the filesystem for the read's trio task, seen by every view the read passes through.
READER: ContextVar[int] = ContextVar("refmount_reader", default=0)

_PROCESSES: dict[int, int] = {}  # thread id -> its process id (tgid), for the last threads seen


def process_of(pid: int) -> int:
    """The process a FUSE request's pid (the calling thread's id) belongs to: a reader's threads
    (zarr and dask read a few chunks at once from threads) walk as one reader. 0 if unknown."""
    if pid <= 0:
        return 0
    found = _PROCESSES.get(pid)
    if found is None:
        found = pid
        try:
            with open(f"/proc/{pid}/status", "rb") as f:  # (a thread's /proc entry is there, though unlisted)
                for line in f:
                    if line.startswith(b"Tgid:"):
                        found = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            pass
        if len(_PROCESSES) >= 4096:
            _PROCESSES.clear()
        _PROCESSES[pid] = found
    return found
