"""An append that costs what it adds: new files after the end of a parquet archive.

A batch over a grown archive would combine every recorded file and write the whole output
again — minutes and gigabytes for 10^5 files. When the files new since the output was written
all come after its last file along the concat dimension (the usual growth: a file a day),
and nothing recorded changed or went away, :func:`extend` combines only the archive's first
file (whose units, calendar and attributes every file is re-encoded to and checked against),
its last file (continuity: no overlap, the padded last chunk that becomes interior) and the
new files, and writes the new extent (:func:`refgrid.writers.parquet.append_parquet`): the
record files from the last file's first chunk on, and ``.zmetadata``. Time and memory then
grow with the new files, not with the archive.

The result equals a from-scratch batch of the same files, or the append is not taken: every
document of the combined first/last/new files, but for its shape and chunk grid, must equal
the archive's, and so must refgrid's bookkeeping; otherwise (and for backfill, replaced,
removed or failed files, JSON output, an array whose first dimension is not the concat
dimension) the batch rebuilds the output and says why (:class:`Plan`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from pyarrow import ArrowException

from refgrid.archive.assemble import combine_records, order
from refgrid.archive.journal import Journal
from refgrid.archive.record import loads
from refgrid.core.keys import ZMETADATA, document_key
from refgrid.core.sources import (
    ATTRIBUTES_KEY,
    RECORDS_KEY,
    SOURCES_KEY,
    SourceIdentity,
    identity_difference,
)
from refgrid.core.typed import StorageOptions
from refgrid.errors import RefgridError, WriteError
from refgrid.grid.json_forms import emit_chunk_grid, parse_chunk_grid
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest, ManifestBuilder
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import bookkeeping, documents
from refgrid.writers import sized
from refgrid.writers.padded import Padded, needs_rewrite, rewrite_padded, sidecar_for
from refgrid.writers.parquet import append_parquet, read_record, record_name

GRID_KEYS = ("shape", "chunk_grid")
"""What an append changes in an array's document."""


@dataclass(frozen=True)
class Plan:
    """How a batch brings its output up to date: ``"new"`` (no earlier output),
    ``"unchanged"`` (nothing to add), ``"append"`` (:func:`extend`) or ``"rebuild"`` (the
    whole output written again), and why."""

    path: Literal["new", "unchanged", "append", "rebuild"]
    reason: str
    old: tuple[str, ...] = ()
    """The archive's files, in order (for an append)."""
    new: tuple[str, ...] = ()
    """The files to add, in order (for an append)."""
    meta: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The output's ``.zmetadata`` as read (for an append: parsed once, 10 MB at 10^5
    files)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def plan(journal: Journal, target: Path, good: Sequence[str], format: str,
         settings: Mapping[str, str]) -> Plan:
    """Whether the files ``good`` (recorded, scanned without failure) can be appended to the
    output at ``target``, written by an earlier batch from the same work directory with the
    same ``settings`` (which its report beside the output holds)."""
    if not target.exists():
        return Plan("new", "no earlier output")
    if format != "parquet":
        return Plan("rebuild", f"{format} references are written whole (parquet output "
                    "appends what it adds)")
    try:
        before = json.loads(target.with_name(target.name + ".report.json").read_text(
            encoding="utf-8"))
    except (OSError, ValueError) as e:
        return Plan("rebuild", f"the earlier run's report cannot be read ({e})")
    if not isinstance(before, dict) or before.get("settings") != dict(settings) or \
            before.get("error"):
        return Plan("rebuild", "the earlier output was written with other settings (or "
                    "failed)")
    try:
        meta = json.loads((target / ZMETADATA).read_text(encoding="utf-8"))
        sources = meta[SOURCES_KEY]["sources"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Plan("rebuild", f"the earlier output cannot be read ({type(e).__name__}: {e})")
    old = {url: identity for url, identity in sources.items()
           if isinstance(identity, Mapping) and not identity.get("rewritten")}
    if not old:
        return Plan("rebuild", "the earlier output names no source file")
    listed = set(good)
    gone = [url for url in old if url not in listed]
    if gone:
        return Plan("rebuild", f"{len(gone)} file(s) of the output are gone or failed (e.g. "
                    f"{gone[0]})")
    changed = [url for url, identity in old.items() if identity_difference(
        cast(SourceIdentity, identity), journal.entries[url].header["identity"])]
    if changed:
        return Plan("rebuild", f"{len(changed)} file(s) of the output changed since it was "
                    f"written (e.g. {changed[0]})")
    new = [url for url in good if url not in old]
    if not new:
        return Plan("unchanged", "no new file")
    last = list(old)[-1]
    unplaced = [url for url in (last, *new) if "first" not in journal.entries[url].header]
    if unplaced:
        return Plan("rebuild", f"{unplaced[0]} has no value of the concat coordinate to "
                    "order it by")
    ordered = order(journal, [last, *new])
    if ordered[0] != last:
        early = next(url for url in ordered if url != last)
        return Plan("rebuild", f"{early} lies inside the archive's range (backfill)")
    return Plan("append", f"{len(new)} file(s) after the archive's last",
                tuple(old), tuple(ordered[1:]), meta)


@dataclass(frozen=True)
class Appended:
    group: VirtualGroup
    """The first, last and new files combined (its report: the combine's notes)."""
    records: int
    """Record files written."""


class NotAppendable(Exception):
    """The new files combine, but the result would differ from the archive's documents
    beyond its extent: the output is rebuilt instead (the message says why)."""


def extend(journal: Journal, target: Path, chosen: Plan, concat_dim: str, *,
           overlap: Literal["error", "allow"], codecs: Literal["error", "recode"],
           padded: Padded, storage_options: StorageOptions) -> Appended:
    """Append ``chosen.new`` to the parquet output at ``target`` (see the module)."""
    first, last = chosen.old[0], chosen.old[-1]
    anchors = [first] if first == last else [first, last]
    group = combine_records(journal, [*anchors, *chosen.new], concat_dim, overlap=overlap,
                            codecs=codecs, storage_options=dict(storage_options))
    try:
        return _extend(journal, target, chosen, group, anchors, concat_dim, padded,
                       storage_options)
    except (NotAppendable, WriteError):
        raise
    except (RefgridError, OSError, KeyError, IndexError, TypeError, ValueError,
            ArrowException) as e:  # the earlier output is not as this batch wrote it
        raise NotAppendable(f"the earlier output cannot be extended ({type(e).__name__}: "
                            f"{e})") from e


def _extend(journal: Journal, target: Path, chosen: Plan, group: VirtualGroup,
            anchors: list[str], concat_dim: str, padded: Padded,
            storage_options: StorageOptions) -> Appended:
    first, last = anchors[0], anchors[-1]
    skip = _length(journal, first, concat_dim) if last != first else 0
    meta = chosen.meta
    old_docs: dict[str, dict[str, Any]] = meta["metadata"]
    digests: Mapping[str, str] = meta[SOURCES_KEY].get(RECORDS_KEY, {})
    last_length = _length(journal, last, concat_dim)
    tails, whole = {}, {}
    for path, node in group.walk():
        if isinstance(node, VirtualArray) and concat_dim in node.dims:
            if node.dims[0] != concat_dim:
                raise NotAppendable(f"{concat_dim!r} is not the first dimension of {path!r} "
                                    "(its chunks interleave in the record files)")
            if node.one_inline_chunk:
                whole[path] = _grown(node, target, path, skip + last_length, digests)
            else:
                tails[path] = node.slice(concat_dim, skip, node.shape[0])
    tail = sized(group.with_arrays({**tails, **whole}), storage_options)
    sidecar = sidecar_for(target)
    if padded == "rewrite" and needs_rewrite(tail):
        tail, _ = rewrite_padded(tail, sidecar, storage_options=storage_options)
    docs: dict[str, Mapping[str, object]] = dict(documents(tail))
    appended: dict[str, tuple[int, ChunkManifest]] = {
        path: (0, array.manifest) for path, array in whole.items()}
    for path in tails:
        array = tail[path]
        assert isinstance(array, VirtualArray)
        key = document_key(path)
        old = old_docs.get(key)
        if not isinstance(old, Mapping) or old["shape"][1:] != list(array.shape[1:]):
            raise NotAppendable(f"the archive's {path!r} is not shaped as the new files'")
        before = parse_chunk_grid(old["chunk_grid"], old["shape"])
        cut = int(before.shape[0]) - last_length
        keep, kept = before.slice(0, 0, cut)
        if cut < 0 or int(before.bounds(0)[kept.stop]) != cut:
            raise NotAppendable(f"the archive's chunks of {path!r} do not end where its last "
                                "file begins")
        grid = RectilinearGrid.concat([keep, array.grid], 0)
        docs[key] = {**docs[key], "shape": list(grid.shape), "chunk_grid": emit_chunk_grid(grid)}
        appended[path] = (kept.stop * (before.nchunks // max(before.chunk_counts[0], 1)),
                          array.manifest)
    _check_same(old_docs, docs, meta[SOURCES_KEY].get(ATTRIBUTES_KEY) or {},
                bookkeeping(tail))
    new_sources: dict[str, SourceIdentity] = {
        url: identity for url, identity in tail.sources.items() if url not in anchors}
    records = append_parquet(target, meta, appended, docs, new_sources,
                             sidecar if sidecar.is_dir() else None)
    return Appended(group, records)


def _grown(array: VirtualArray, target: Path, path: str, start: int,
           digests: Mapping[str, str]) -> VirtualArray:
    """The archive's one-chunk ``path`` with ``array``'s elements from ``start`` on after
    it (the concat coordinate, re-encoded to the first file's units: its bytes grow with the
    steps, 8 a step, and are written again whole)."""
    name = record_name(path, 0)
    stored = read_record(target / name, digests.get(name))
    if len(stored) != 1 or stored.raw is None or stored.raw[0] is None:
        raise NotAppendable(f"the archive's {path!r} is not one inline chunk")
    step = math.prod(array.shape[1:]) * array.dtype.itemsize
    data = bytes(stored.raw[0]) + array.manifest.inline[(0,) * len(array.dims)][start * step:]
    shape = (len(data) // step if step else 0, *array.shape[1:])
    grid = RectilinearGrid.regular(shape, [max(1, n) for n in shape])
    built = ManifestBuilder(grid.chunk_counts)
    built.inlined((0,) * len(array.dims), data)
    return replace(array, grid=grid, manifest=built.build())


def _length(journal: Journal, url: str, concat_dim: str) -> int:
    """How far the recorded file ``url`` extends along ``concat_dim`` (every array of it
    alike: groups whose own lengths along it differ are rebuilt)."""
    group, _ = loads(journal.record(url), f"{journal.path}: record of {url}")
    lengths = {node.shape[node.axis(concat_dim)] for _, node in group.walk()
               if isinstance(node, VirtualArray) and concat_dim in node.dims}
    if len(lengths) > 1:
        raise NotAppendable(f"the arrays of {url} differ in length along {concat_dim!r} "
                            f"({sorted(lengths)})")
    return lengths.pop() if lengths else 0


def _check_same(old: Mapping[str, object], new: Mapping[str, object],
                old_kept: object, new_kept: object) -> None:
    if list(old) != list(new):
        raise NotAppendable(f"the new files' nodes {sorted(set(new) ^ set(old))} differ from "
                            "the archive's")
    for key, doc in new.items():
        was = old[key]
        if not isinstance(was, Mapping) or not isinstance(doc, Mapping) or \
                _without_grid(was) != _without_grid(doc):
            raise NotAppendable(f"{key} of the new files differs from the archive's beyond "
                                "its extent (attributes, codecs or fill values)")
    if json.loads(json.dumps(new_kept)) != old_kept:
        raise NotAppendable("refgrid's bookkeeping of the new files differs from the "
                            "archive's")


def _without_grid(doc: Mapping[str, object]) -> dict[str, object]:
    return json.loads(json.dumps({k: v for k, v in doc.items() if k not in GRID_KEYS}))
