"""`refmount inspect REFS`: per array, what it is and which netCDF-C can read it in each view."""

from __future__ import annotations

import json

from refmount.errors import one_line
from refmount.view.arrays import count_chunks, decoded_verdicts, raw_verdicts, scan_arrays
from refmount.view.forms import FORMS, form_notes
from refmount.refs import load_refs
from refmount.refs.model import each_file


def _chunk_counts(refset, info) -> tuple[int, int]:
    """(present, missing) chunk keys of an array (Parquet sets: their record files are read)."""
    if getattr(refset, "may_lack", False):  # a native store's grid: which chunks exist is not listed
        return None, None
    if getattr(refset, "lazy", False):
        import trio

        expected = info.chunk_count()

        async def count() -> int:
            return sum([1 async for _, i in each_file(refset, info.dir_id) if i >= refset.meta.capacity])

        present = trio.run(count)
        return present, max(expected - present, 0)
    present, expected = count_chunks(refset, info)
    return present, max(expected - present, 0)


def inspect_refs(refset, zarr3: bool = False) -> list[dict]:
    """`zarr3`: `refset` is the v2 form of a Zarr v3 set (refmount.view.zarr3), which only the decoded view shows."""
    rows = []
    for info in scan_arrays(refset):
        present, missing = _chunk_counts(refset, info)
        raw49, raw410 = raw_verdicts(info) if not zarr3 else ("no: Zarr v3 (netCDF-C reads Zarr v2 only)",) * 2
        decoded49, decoded493 = decoded_verdicts(info)
        rows.append({
            "array": info.name,
            "dtype": info.meta and info.meta.dtype,
            "shape": info.meta and info.meta.shape,
            "chunks": info.meta and info.meta.chunks,
            "codecs": [c.get("id") for c in info.codecs],
            "chunks_present": present,
            "chunks_missing": missing,
            "raw": {"netcdf-c 4.9.0": raw49, "netcdf-c >= 4.10": raw410},
            "decoded": {"netcdf-c 4.9.0": decoded49, "netcdf-c >= 4.9.3": decoded493},
            "decoded_changes": info.notes,
            # the metadata each kind of reader gets (refmount.view.forms; `refmount stats` says who got which)
            "decoded_forms": form_notes(info) if not info.hidden_reason and info.out_zarray else {},
        })
    return rows


def refused_rows(refset) -> list[dict]:
    """Variables of scanned data files (refmount.refs.scan) that the parser could not reference."""
    rows = []
    for name, reasons in (getattr(refset, "refused", None) or {}).items():
        for reason in reasons:
            variable, _, why = reason.partition(": ")
            rows.append({"file": name if getattr(refset, "scanned", None) == "many" else "", "variable": variable,
                         "refused": why or reason})
    return rows


def format_lines(refset) -> list[str]:
    """Per format of the scanned data files: how many, what becomes arrays and what does not."""
    from refmount.refs.scan.formats import FORMAT_NAMES, VIRTUALISED

    counts: dict[str, int] = {}
    for fmt in (getattr(refset, "formats", None) or {}).values():
        counts[fmt] = counts.get(fmt, 0) + 1
    lines = []
    for fmt, count in counts.items():
        arrays, not_virtualised = VIRTUALISED.get(fmt, ("(as its references say)", "(unknown)"))
        lines.append(f"{count} {FORMAT_NAMES.get(fmt, fmt)} file{'s' if count > 1 else ''}: arrays: {arrays}; "
                     f"not virtualised: {not_virtualised}")
    return lines


def run_inspect(location: str, *, remote_options: dict | None = None, as_json: bool = False, version=None,
                containers: dict | None = None, data_url: str | None = None) -> int:
    from refmount.view.zarr3 import is_v3, v2_refset

    refset = load_refs(location, remote_options=remote_options, version=version, containers=containers,
                       data_url=data_url)
    rows = inspect_refs(v2_refset(refset), zarr3=True) if is_v3(refset) else inspect_refs(refset)
    refused = refused_rows(refset)
    source = getattr(refset, "format", None)
    if as_json:
        print(json.dumps([{**row, "format": source} for row in rows] + refused if source else rows + refused, indent=2))
        return 0

    def say(text: str) -> None:  # (names come from the document: no escape reaches the terminal)
        print(one_line(text))

    if source:
        say(f"format: {source}")
    for line in format_lines(refset):
        say(line)
    for row in refused:  # what a scanned data file holds that could not be referenced
        where = f"{row['file']}: " if row["file"] else ""
        say(f"{where}{row['variable']}: not referenced ({row['refused']})")
    if not rows:
        say(f"{location}: no Zarr arrays (no .zarray or zarr.json keys)")
        return 0
    say("decoded view forms (each program gets its own; `refmount stats MOUNTPOINT` says which programs got which):")
    for form in FORMS.values():
        say(f"    {form.name:<9}{form.description}")
    say("netCDF-C reads the decoded view exactly as 'file:///MNT#mode=nczarr,file' (4.9.0 reads it so in zarr mode too)")
    for row in rows:
        codecs = "+".join(map(str, row["codecs"])) or "none"
        present = "chunks not listed (from the grid)" if row["chunks_present"] is None else \
            f"{row['chunks_present']} chunks present, {row['chunks_missing']} missing"
        say(f"{row['array']}: {row['dtype']} shape {row['shape']} chunks {row['chunks']} codecs {codecs}; {present}")
        for view in ("raw", "decoded"):
            for version, verdict in row[view].items():
                say(f"    {view:<8}{version:<18}{verdict}")
        if row["decoded_changes"]:
            say(f"    decoded view changes: {'; '.join(row['decoded_changes'])}")
        for form, served in row["decoded_forms"].items():
            say(f"    decoded form {form:<9}{served}")
    return 0
