"""The JSON every bench writes: one envelope (which bench, the command, when, on what, under what load)
around the bench's own tables and figures. bench/report.py renders it into docs/performance.md.

    {"schema": "refmount-bench/1", "bench": "speed", "command": "bench/run-speed.sh --quick",
     "date": "2026-11-29T10:02:11Z", "finished": "...", "seconds": 143.2, "mode": "quick" | "full",
     "machine": {"nproc", "cpu", "kernel", "ram_gib", "python", "versions": {...}},
     "load": {"start": [1, 5, 15 min], "end": [...]},
     "tables": [{"title": "...", "markdown": "| ... |"}], "notes": ["..."], ...the bench's own fields}
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from harness import ROOT
from harness.system import load, log, machine

SCHEMA = "refmount-bench/1"


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def command_line() -> str:
    """What was typed: the shell wrapper's own command line (it exports BENCH_COMMAND), else
    `python bench/NAME.py ARGS` relative to the checkout."""
    if os.environ.get("BENCH_COMMAND"):
        return os.environ["BENCH_COMMAND"]
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


class Record:
    """Started when the bench starts (date, machine, load at start); `write` adds the end and the tables."""

    def __init__(self, bench: str, quick: bool = False, tools: dict[str, str] | None = None) -> None:
        self.bench, self.quick = bench, quick
        self.started = time.time()
        self.command = command_line()
        self.machine = machine(tools)
        self.load_start = load()

    def envelope(self) -> dict:
        ended = time.time()
        self.machine["loadavg_end"] = os.getloadavg()[0]
        return {"schema": SCHEMA, "bench": self.bench, "command": self.command, "date": utc(self.started),
                "finished": utc(ended), "seconds": round(ended - self.started, 1),
                "mode": "quick" if self.quick else "full", "machine": self.machine,
                "load": {"start": self.load_start, "end": load()}}

    def write(self, path: Path, tables: dict[str, str] | str, notes: list[str] | None = None, **fields) -> dict:
        """Write the envelope, `tables` ({title: markdown}, or one untitled markdown table), `notes` (lines
        shown under the tables) and the bench's own `fields` to `path`; returns what was written."""
        if isinstance(tables, str):
            tables = {"": tables}
        envelope = self.envelope()
        clash = set(fields) & {*envelope, "tables", "notes"}
        if clash:
            raise ValueError(f"bench fields {sorted(clash)} would hide the record's own")
        data = {**envelope, "tables": [{"title": t, "markdown": m} for t, m in tables.items()],
                "notes": list(notes or []), **fields}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, default=str))
        tmp.rename(path)
        log(f"wrote {path}")
        return data
