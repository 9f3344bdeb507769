"""One registry of the mount's metrics. Each component registers the families it keeps figures for
(name, kind, help, labels) and where in the mount's stats dict (fuse/assemble.py `stats()`) their
samples are; `--metrics` (fuse/metrics.py) exports the registry in Prometheus's text format and
`refmount stats` shows the same families and samples to a person. `refmount stats --json` is the stats
dict itself (every figure, also those that are no metric: rates, plans, names).

A family's `collect(stats)` yields (labels, value) pairs; a value that is no number (absent, a bool,
None) is left out, and a histogram's value is {"buckets": {le: count}, "sum": s, "count": n}.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Callable, Iterable

KINDS = ("counter", "gauge", "histogram")
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# The components that register families: imported before the registry is read (in `refmount stats`,
# which loads nothing else). Each registers at its import.
COMPONENTS = ("refmount.fetch.stats", "refmount.fetch.auth", "refmount.cache.pacer", "refmount.cache.blocks",
              "refmount.cache.budget", "refmount.cache.governor", "refmount.fuse.served")


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    collect: Callable[[dict], Iterable[tuple[dict, object]]]
    component: str


class Registry:
    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._dynamic: list[Callable[[dict], Iterable[tuple[Family, list]]]] = []

    def register(self, name: str, kind: str, help: str, labels: tuple[str, ...] = (), *,
                 collect: Callable[[dict], Iterable[tuple[dict, object]]], component: str = "") -> Family:
        """Add a family (once: a second registration of the same name must be the same family)."""
        if kind not in KINDS or not _NAME.match(name):
            raise ValueError(f"metric {name!r}: kind {kind!r} or name is not valid")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        family = Family(name, kind, help, tuple(labels), collect, component)
        known = self._families.get(name)
        if known is not None and (known.kind, known.labels) != (family.kind, family.labels):
            raise ValueError(f"metric {name!r} registered twice, differently")
        self._families.setdefault(name, family)
        return family

    def register_section(self, section: str, help: str, now_words: tuple[str, ...], component: str = "") -> None:
        """Families named after the numbers of a stats section whose keys its component decides at run
        time (the read-ahead's): each a counter `refmount_SECTION_KEY_total`, or a gauge
        `refmount_SECTION_KEY` when the key names what is there now (is or ends in one of `now_words`)."""
        def families(stats: dict):
            for key, value in _flat(stats.get(section) or {}):
                now = any(key == w or key.endswith("_" + w) for w in now_words)
                name = _metric_name(f"refmount_{section}_{key}" + ("" if now else "_total"))
                what = f"{help} ({section}): {key.replace('_', ' ')}." + (" (now)" if now else "")
                yield Family(name, "gauge" if now else "counter", what, (), lambda _s: (), component), [({}, value)]

        self._dynamic.append(families)

    def collect(self, stats: dict) -> list[tuple[Family, list[tuple[dict, object]]]]:
        """Every family with its samples now, by name (so that the components' families keep one order
        whatever order they were imported in); a family without a sample is left out."""
        load_components()
        out: dict[str, tuple[Family, list]] = {}
        for family in self._families.values():
            samples = [(labels, value) for labels, value in family.collect(stats) if _is_value(family, value)]
            if samples:
                out[family.name] = (family, samples)
        for dynamic in self._dynamic:
            for family, samples in dynamic(stats):
                samples = [(labels, value) for labels, value in samples if _is_value(family, value)]
                if samples and family.name not in out:
                    out[family.name] = (family, samples)
        return [out[name] for name in sorted(out)]


REGISTRY = Registry()
register = REGISTRY.register


def load_components() -> None:
    for name in COMPONENTS:
        importlib.import_module(name)


def _is_value(family: Family, value) -> bool:
    if family.kind == "histogram":
        return isinstance(value, dict) and "buckets" in value
    return value is not None and not isinstance(value, bool) and isinstance(value, (int, float))


def _metric_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def _flat(section: dict, prefix: str = ""):
    for key, value in section.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}_")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield prefix + key, value


# -- collectors: where a family's samples are in the stats dict -----------------------------------

def at(*path: str):
    """The number at stats[path[0]][path[1]]..., unlabelled."""
    def collect(stats: dict):
        value = stats
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        yield {}, value
    return collect


def per(section: str, label: str, key: str):
    """For each entry of stats[section] (a dict by `label`), its `key`."""
    def collect(stats: dict):
        for name, item in (stats.get(section) or {}).items():
            if isinstance(item, dict):
                yield {label: name}, item.get(key)
    return collect


def text(stats: dict) -> str:
    """The registry's families and samples for a person (`refmount stats`): each family's name, kind
    and help, then its samples, one a line; a histogram as count, mean and the buckets of p50/p99."""
    lines = []
    for family, samples in REGISTRY.collect(stats):
        lines.append(f"{family.name} ({family.kind}): {family.help}")
        for labels, value in samples:
            shown = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "mountpoint")
            shown = f"{{{shown}}} " if shown else ""
            lines.append(f"  {shown}{_histogram_line(value) if family.kind == 'histogram' else _number(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"


def _histogram_line(histogram: dict) -> str:
    count = histogram["count"]
    if not count:
        return "none yet"

    def under(q: float) -> str:
        for bound, n in sorted(histogram["buckets"].items(), key=lambda item: float(item[0])):
            if n >= q * count:
                return "more" if bound == "+Inf" else f"<= {float(bound) * 1000:g} ms"
        return "?"

    return f"{count:,} fetches, mean {histogram['sum'] / count * 1000:.3g} ms, p50 {under(0.5)}, p99 {under(0.99)}"
