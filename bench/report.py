"""Render benchmark runs (the JSON each bench writes through bench/harness/record.py) as markdown, so
that the figures in docs/performance.md are the runs' own and never drift from them.

    python bench/report.py bench/out/speed.json ...          # print each run's block
    python bench/report.py --update docs/performance.md      # rewrite the blocks the page marks
    python bench/report.py --check docs/performance.md       # exit 1 if a block differs from its JSON

A page marks a block as

    <!-- report: bench/out/speed.json -->
    (generated: the command, date, machine, load, then the run's tables)
    <!-- /report -->

and the path (relative to the checkout) names the run it shows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "refmount-bench/1"
BLOCK = re.compile(r"(<!-- report: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)


def load_record(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a bench record of {SCHEMA} (written before bench/harness; run the bench again)")
    return data


def machine_text(m: dict) -> str:
    versions = m.get("versions") or {}
    tools = ", ".join(f"{v}" for v in versions.values() if v)
    return (f"{m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']:.0f} GiB RAM, kernel {m['kernel']}, "
            f"Python {m.get('python', '?')}" + (f"; {tools}" if tools else ""))


def render(data: dict) -> str:
    """One run as markdown: what ran, when, where and under what load, then its tables and notes."""
    load = data["load"]
    date = data["date"].replace("T", " ").replace("Z", " UTC")
    mode = ("a quick run: smaller inputs, fewer runs; it shows the bench works, its figures are not the ones "
            "of record" if data["mode"] == "quick" else "a full run")
    lines = [f"- **Command:** `{data['command']}`, {mode}",
             f"- **Date:** {date}, {data['seconds']:.0f} s",
             f"- **Machine:** {machine_text(data['machine'])}",
             f"- **Load average** (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in load['start'])} at the start, "
             f"{', '.join(f'{v:.1f}' for v in load['end'])} at the end"]
    for table in data["tables"]:
        lines.append("")
        if table["title"]:
            lines += [f"*{table['title']}*", ""]
        lines.append(table["markdown"].strip())
    if data.get("notes"):
        lines.append("")
        lines += [f"- {note}" for note in data["notes"]]
    return "\n".join(lines) + "\n"


def update(page: Path, write: bool) -> list[str]:
    """Rewrite (or with write=False only compare) the page's report blocks; returns the stale ones."""
    text = page.read_text()
    stale = []

    def fill(match: re.Match) -> str:
        body = render(load_record(ROOT / match["path"]))
        if body != match["body"]:
            stale.append(match["path"])
        return match[1] + body + match[4]

    new = BLOCK.sub(fill, text)
    if write and new != text:
        page.write_text(new)
    return stale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", nargs="*", type=Path, help="bench JSON files to print")
    p.add_argument("--update", type=Path, metavar="PAGE", help="rewrite the page's <!-- report: ... --> blocks")
    p.add_argument("--check", type=Path, metavar="PAGE", help="exit 1 if a block differs from its JSON")
    args = p.parse_args(argv)
    try:
        for path in args.records:
            print(render(load_record(path)))
        if args.update:
            for path in update(args.update, write=True):
                print(f"updated the block of {path}", file=sys.stderr)
        if args.check:
            stale = update(args.check, write=False)
            if stale:
                print(f"{args.check}: stale blocks of {', '.join(stale)}; run python bench/report.py --update "
                      f"{args.check}", file=sys.stderr)
                return 1
    except (OSError, ValueError, KeyError) as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
