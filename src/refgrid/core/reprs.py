"""Summaries of the model for people: concise text reprs, Jupyter HTML reprs with the chunk
picture, and the JSON of ``refgrid inspect --json``.

The model classes display themselves through this module (their :class:`Displayed` base),
so it takes their objects as they come (duck-typed: the protocols below say what it reads)
rather than importing the model back.

Every number is computed from the manifest's numpy columns at once, so a summary of an array
of 10^7 chunks costs milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape
from typing import ClassVar, Protocol, TypedDict, TypeGuard

import numpy as np

from refgrid.core.sources import SourceIdentity, source_count

HTML_STYLE = ("<style>.refgrid-repr table{border-collapse:collapse}.refgrid-repr td,"
              ".refgrid-repr th{padding:1px 8px;text-align:left}"
              ".refgrid-repr summary{cursor:pointer}</style>")


class Manifest(Protocol):
    """What a summary reads of a :class:`refgrid.model.manifest.ChunkManifest`."""

    @property
    def paths(self) -> Sequence[str]: ...
    @property
    def path_id(self) -> np.ndarray: ...
    @property
    def length(self) -> np.ndarray: ...
    @property
    def inline(self) -> Mapping[tuple[int, ...], bytes]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def missing(self) -> np.ndarray: ...
    @property
    def unsized(self) -> np.ndarray: ...


class Axis(Protocol):
    """What a summary reads of one :class:`refgrid.grid.rectilinear.AxisChunks`."""

    @property
    def logical(self) -> np.ndarray: ...
    @property
    def encoded(self) -> np.ndarray: ...
    @property
    def nchunks(self) -> int: ...


class Grid(Protocol):
    """What a summary reads of a :class:`refgrid.grid.rectilinear.RectilinearGrid`."""

    @property
    def axes(self) -> Sequence[Axis]: ...
    @property
    def is_regular(self) -> bool: ...
    @property
    def nchunks(self) -> int: ...
    @property
    def chunk_counts(self) -> tuple[int, ...]: ...
    def svg(self, dims: Sequence[str] | None = None, title: str | None = None) -> str: ...


class Array(Protocol):
    """What a summary reads of a :class:`refgrid.model.virtual.VirtualArray`."""

    @property
    def name(self) -> str: ...
    @property
    def dims(self) -> tuple[str, ...]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def value_dtype(self) -> np.dtype: ...
    @property
    def codecs(self) -> Sequence[Mapping[str, object]]: ...
    @property
    def grid(self) -> Grid: ...
    @property
    def manifest(self) -> Manifest: ...


class Group(Protocol):
    """What a summary reads of a :class:`refgrid.model.virtual.VirtualGroup`."""

    @property
    def sources(self) -> Mapping[str, SourceIdentity]: ...
    def walk(self) -> Iterable[tuple[str, object]]: ...


class Entry(Protocol):
    """What a report shows of a :class:`refgrid.model.virtual.ReportEntry`."""

    @property
    def url(self) -> str: ...
    @property
    def variable(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def reason(self) -> str: ...


class ArraySummary(TypedDict):
    dims: list[str]
    shape: list[int]
    dtype: str
    codecs: list[str]
    grid: str
    chunks: int
    chunk_counts: list[int]
    chunk_lengths: list[list[int]]
    """Per dimension the smallest and the largest chunk length."""
    padded: int
    missing: int
    inline: int
    bytes: int
    referenced_bytes: int
    inline_bytes: int
    files: int


class GroupSummary(TypedDict):
    arrays: dict[str, ArraySummary]
    groups: list[str]
    sources: int
    bytes: int
    referenced_bytes: int


def size(nbytes: int | float) -> str:
    """``"1.2 MiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def manifest_counts(manifest: Manifest) -> tuple[int, int, int, int, int]:
    """``(stored, missing, inline, referenced bytes, inline bytes)``."""
    stored = manifest.path_id >= 0
    return (int(stored.sum()), int(manifest.missing.sum()), len(manifest.inline),
            int(manifest.length[stored & ~manifest.unsized].sum()),
            sum(len(b) for b in manifest.inline.values()))


def padded_count(grid: Grid) -> int:
    """Chunks inside the array that decode to more than their extent."""
    return sum(int((a.encoded[:-1] != a.logical[:-1]).sum()) for a in grid.axes)


def grid_kind(grid: Grid) -> str:
    return "regular" if grid.is_regular else "rectilinear"


def array_summary(array: Array) -> ArraySummary:
    manifest = array.manifest
    _, missing, inline, referenced, inline_bytes = manifest_counts(manifest)
    used = np.unique(manifest.path_id[manifest.path_id >= 0])
    return {
        "dims": list(array.dims), "shape": list(array.shape), "dtype": str(array.value_dtype),
        "codecs": [str(c.get("name")) for c in array.codecs],
        "grid": grid_kind(array.grid), "chunks": array.grid.nchunks,
        "chunk_counts": list(array.grid.chunk_counts),
        "chunk_lengths": [[int(a.logical.min()), int(a.logical.max())] if a.nchunks else [0, 0]
                          for a in array.grid.axes],
        "padded": padded_count(array.grid), "missing": missing, "inline": inline,
        "bytes": math.prod(array.shape) * array.dtype.itemsize,
        "referenced_bytes": referenced, "inline_bytes": inline_bytes, "files": len(used)}


def _arrays(group: Group) -> list[tuple[str, Array]]:
    return [(p, n) for p, n in group.walk() if _is_array(n)]


def _is_array(node: object) -> TypeGuard[Array]:
    return hasattr(node, "manifest")  # (the model is not imported here: it imports us)


def group_summary(group: Group) -> GroupSummary:
    arrays = {p: array_summary(a) for p, a in _arrays(group)}
    return {"arrays": arrays,
            "groups": [p for p, g in group.walk() if not _is_array(g)],
            "sources": source_count(group.sources),
            "bytes": sum(a["bytes"] for a in arrays.values()),
            "referenced_bytes": sum(a["referenced_bytes"] for a in arrays.values())}


# -- text --------------------------------------------------------------------------------

def _dims(s: ArraySummary) -> str:
    return ", ".join(f"{d}: {n}" for d, n in zip(s["dims"], s["shape"], strict=True))


def unusual_chunks(s: ArraySummary) -> list[str]:
    """``["7 padded", "2 missing"]``: the chunks that are not plain references, counted."""
    return [f"{n:,} {what}" for what, n in (("padded", s["padded"]), ("missing", s["missing"]),
                                            ("inline", s["inline"])) if n]


def _chunking(s: ArraySummary) -> str:
    lengths = " x ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in s["chunk_lengths"])
    extra = unusual_chunks(s)
    return (f"{s['grid']} grid, {s['chunks']:,} chunk{'s' if s['chunks'] != 1 else ''} of "
            f"{lengths or 'one value'}"
            + (f" ({', '.join(extra)})" if extra else ""))


def array_line(path: str, s: ArraySummary) -> str:
    """One line: ``tas (time: 365, lat: 6, lon: 8) float32 · rectilinear grid, ...``."""
    return (f"{path} ({_dims(s)}) {s['dtype']} · {_chunking(s)} · "
            f"{'→'.join(s['codecs'])} · {_stored(s)}")


def _stored(s: ArraySummary) -> str:
    """``"51.9 KiB in 12 files"``, ``"2.9 KiB inline"``, or both."""
    parts = [f"{size(s['referenced_bytes'])} in {s['files']} file"
             f"{'s' if s['files'] != 1 else ''}"] if s["files"] else []
    if s["inline_bytes"] or not parts:
        parts.append(f"{size(s['inline_bytes'])} inline")
    return ", ".join(parts)


def array_text(array: Array) -> str:
    return f"<refgrid.VirtualArray {array_line(array.name, array_summary(array))}>"


def group_text(group: Group) -> str:
    s = group_summary(group)
    lines = [f"<refgrid.VirtualGroup> {len(s['arrays'])} arrays, {size(s['bytes'])} "
             f"({size(s['referenced_bytes'])} referenced) from {files_text(s['sources'])}"]
    lines += [f"  {array_line(p, a)}" for p, a in s["arrays"].items()]
    return "\n".join(lines)


def files_text(n: int) -> str:
    return f"{n:,} source file{'s' if n != 1 else ''}"


def manifest_text(manifest: Manifest) -> str:
    stored, missing, inline, referenced, inline_bytes = manifest_counts(manifest)
    return (f"<refgrid.ChunkManifest {manifest.shape}: {stored:,} stored in "
            f"{len(manifest.paths):,} files ({size(referenced)}), {missing:,} missing, "
            f"{inline:,} inline ({size(inline_bytes)})>")


# -- HTML ----------------------------------------------------------------------------------

def grid_html(grid: Grid, dims: Sequence[str] | None = None) -> str:
    return f'<div class="refgrid-repr">{grid.svg(dims)}</div>'


def _array_rows(path: str, s: ArraySummary) -> str:
    return (f"<tr><td><b>{escape(path)}</b></td><td>{escape(_dims(s))}</td>"
            f"<td>{escape(s['dtype'])}</td><td>{escape(_chunking(s))}</td>"
            f"<td>{escape(' → '.join(s['codecs']))}</td><td>{size(s['bytes'])}</td>"
            f"<td>{escape(_stored(s))}</td></tr>")


HEADER = ("<tr><th>array</th><th>dims</th><th>dtype</th><th>chunks</th><th>codecs</th>"
          "<th>size</th><th>referenced</th></tr>")


def array_html(array: Array) -> str:
    s = array_summary(array)
    return (f'{HTML_STYLE}<div class="refgrid-repr"><b>refgrid.VirtualArray</b>'
            f"<table>{HEADER}{_array_rows(array.name, s)}</table>"
            f"{array.grid.svg(array.dims, array.name)}</div>")


def group_html(group: Group) -> str:
    s = group_summary(group)
    pictures = "".join(
        f"<details><summary>{escape(p)}: chunk grid</summary>{a.grid.svg(a.dims, p)}"
        "</details>" for p, a in _arrays(group))
    return (f'{HTML_STYLE}<div class="refgrid-repr"><b>refgrid.VirtualGroup</b>: '
            f"{len(s['arrays'])} arrays, {size(s['bytes'])} ({size(s['referenced_bytes'])} "
            f"referenced) from {files_text(s['sources'])}"
            f"<table>{HEADER}{''.join(_array_rows(p, a) for p, a in s['arrays'].items())}"
            f"</table>{pictures}</div>")


def manifest_html(manifest: Manifest) -> str:
    return f'<div class="refgrid-repr"><code>{escape(manifest_text(manifest))}</code></div>'


def text(kind: str, obj: object) -> str:
    """The text repr of a model object of ``kind`` (array, group, manifest)."""
    # (each takes the object of its own kind)
    texts: dict[str, Callable[..., str]] = {"array": array_text, "group": group_text,
                                            "manifest": manifest_text}
    return texts[kind](obj)


def html(kind: str, obj: object) -> str:
    """The HTML repr of a model object of ``kind`` (array, group, manifest, grid)."""
    # (each takes the object of its own kind)
    pages: dict[str, Callable[..., str]] = {"array": array_html, "group": group_html,
                                            "manifest": manifest_html, "grid": grid_html}
    return pages[kind](obj)


class Displayed:
    """``repr()`` and Jupyter's ``_repr_html_`` by :func:`text` and :func:`html` (dataclasses
    using it pass ``repr=False``)."""

    _display: ClassVar[str]

    def __repr__(self) -> str:
        return text(self._display, self)

    def _repr_html_(self) -> str:
        return html(self._display, self)


def report_lines(entries: Iterable[Entry], shown: int = 3) -> list[str]:
    """A scan or combine report for people: one line per variable and action, the files it
    concerns counted and a few named (an attribute that differs in 11 files is one line, not
    11), the first reason given."""
    grouped: dict[tuple[str, str], list[Entry]] = {}
    for entry in entries:
        grouped.setdefault((entry.variable, entry.action), []).append(entry)
    lines = []
    for (variable, action), found in grouped.items():
        where = f"{variable}: " if variable else ""
        if len(found) == 1:
            lines.append(f"{found[0].url}: {where}{action}: {found[0].reason}")
            continue
        names = [e.url.rstrip("/").rsplit("/", 1)[-1] for e in found]
        more = f", ... ({len(found) - shown} more)" if len(found) > shown else ""
        lines.append(f"{where}{action} in {len(found)} files ({', '.join(names[:shown])}"
                     f"{more}): {found[0].reason}" + ("" if len({e.reason for e in found}) == 1
                                                      else ", and others"))
    return lines
