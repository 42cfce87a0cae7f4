"""Recorded files → one virtual dataset: ordered, then combined a slice of files at a time.

Files are ordered by the first value of their concat coordinate (CF times decoded, one
decode per distinct units and calendar), as :func:`refgrid.combine` orders them. The
combine then runs on consecutive slices of ``SLICE_FILES`` files and once more on the
slices' results, so the Python objects of only one slice's files are alive at a time: memory
grows with the number of chunks (numpy columns), not with objects per file.

Nothing here opens a source: records hold the concat coordinate inline and a digest of each
variable without the concat dimension, which the combine compares instead of reading.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from refgrid.archive.journal import Journal
from refgrid.archive.record import loads
from refgrid.combining import merged_sets, stack
from refgrid.combining.concat import concatenated
from refgrid.combining.coverage import Part, outer_join, part_name, stand_in
from refgrid.combining.spec import CombineSpec
from refgrid.core.cf import decode_times, is_time_units
from refgrid.core.names import from_json
from refgrid.core.typed import JSON, JSONScalar
from refgrid.errors import BatchError, CombineError
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.array import read

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

SLICE_FILES = 2000


def combine_records(journal: Journal, urls: Sequence[str], spec: CombineSpec, *,
                    storage_options: dict[str, object] | None = None,
                    advance: Callable[[int], None] = lambda n: None) -> VirtualGroup:
    """The combined dataset of the recorded ``urls``; ``advance(n)`` after n more files.
    Files are partitioned as :func:`refgrid.combine` partitions them — by the value along
    the stacking dimension and, merging, by file set — from what their workers recorded."""
    digests: dict[str, str] = {}

    def fingerprint(array: VirtualArray) -> str | None:
        return digests.get(_content_key(array))

    def reading(array: VirtualArray) -> np.ndarray:
        return read(array, storage_options=storage_options)

    def combined(urls: Sequence[str], standing: Mapping[str, str], head: str
                 ) -> VirtualGroup:
        """One part's files combined, a slice of files at a time, with the files of others
        that stand in where it lacks values (``standing``: the part's name, by URL; they
        take the encoding of the part's ``head``, its first file by value)."""
        ordered = order(journal, [*urls, *standing])
        like = _load(journal, head, digests) if standing else None
        slices, labels = [], []
        for first in range(0, len(ordered), SLICE_FILES):
            part = ordered[first:first + SLICE_FILES]
            groups = [_load(journal, url, digests) if like is None or url not in standing
                      else stand_in(_load(journal, url, digests), like, spec.concat_dim,
                                    standing[url], reading)
                      for url in part]
            slices.append(concatenated(groups, part, spec, storage_options=storage_options,
                                       fingerprint=fingerprint))
            labels.append(part[0])
            advance(len(part))
        return slices[0] if len(slices) == 1 else concatenated(
            slices, labels, spec, storage_options=storage_options, fingerprint=fingerprint)

    parts: dict[str, dict[str, list[str]]] = {}
    for url in urls:
        header = journal.header(url)
        value = json.dumps(header.get("stack")) if spec.stack_dim is not None else ""
        key = json.dumps(header.get("set")) if spec.merge else ""
        parts.setdefault(value, {}).setdefault(key, []).append(url)
    listed = [(value, key, members) for value, sets in parts.items()
              for key, members in sets.items()]
    described = [Part(part_name(spec.stack_dim, from_json(json.loads(value)) if value else None,
                                members), members, key) for value, key, members in listed]
    join = outer_join(
        described, lambda p, k: _load(journal, listed[p][2][k], digests), spec.concat_dim,
        spec.missing == "fill", spec.others == "stack", reading)
    results: list[VirtualGroup] = []
    for value, sets in parts.items():
        held = [(members, {listed[q][2][k]: part.name for q, k in stand}, members[first])
                for (v, _, members), part, stand, first in zip(
                    listed, described, join.standing, join.firsts, strict=True) if v == value]
        joined = [combined(members, standing, first) for members, standing, first in held]
        firsts = [members[0] for members in sets.values()]
        results.append(joined[0] if len(joined) == 1 else
                       merged_sets(joined, firsts, storage_options, fingerprint))
    names = [f"{sum(len(members) for members in sets.values())} files"
             for sets in parts.values()]
    root = results[0] if spec.stack_dim is None else stack(
        results, [from_json(json.loads(v)) for v in parts], names, spec,
        storage_options=storage_options, fingerprint=fingerprint)
    return replace(root, report=(*join.report, *root.report))


def order(journal: Journal, urls: Sequence[str]) -> list[str]:
    """``urls`` in concat-coordinate order; files without a first value (an empty or no
    coordinate) last, in the given order, as the combine places them."""
    firsts = {url: journal.header(url).get("first") for url in urls}
    by_units: dict[tuple[JSON, JSON], list[str]] = {}
    for url, first in firsts.items():
        if first is not None:
            by_units.setdefault((first[1], first[2]), []).append(url)
    instants: dict[str, SupportsRichComparison] = {}
    for (units, calendar), members in by_units.items():
        # members have a first value: a number, string or date (see task._first)
        values = np.asarray([cast("list[JSONScalar]", firsts[url])[0] for url in members])
        if is_time_units(units):
            try:
                # is_time_units: a string; the calendar is passed on as the file wrote it
                values = decode_times(values, units, cast(str, calendar))
            except Exception as e:
                raise CombineError(f"cannot decode the times of {members[0]} ({units!r}, "
                                   f"{calendar!r}): {e}") from e
        instants.update(zip(members, values, strict=True))
    filled = [url for url in urls if url in instants]
    try:
        filled.sort(key=instants.__getitem__)
    except TypeError as e:
        raise CombineError(f"cannot order the files by their first {e}: their concat "
                           "coordinates are of kinds that do not compare (calendars or types "
                           "differ)") from e
    return filled + [url for url in urls if url not in instants]


def _load(journal: Journal, url: str, digests: dict[str, str]) -> VirtualGroup:
    group, recorded = loads(journal.record(url), f"{journal.path}: record of {url}")
    for path, digest in recorded.items():
        try:
            node = group[path]
        except KeyError:
            raise BatchError(f"{journal.path}: the record of {url} has a digest of {path!r}, "
                             "which it does not hold; delete the work directory to scan "
                             "again") from None
        if isinstance(node, VirtualArray):
            digests[_content_key(node)] = digest
    return group


def _content_key(array: VirtualArray) -> str:
    """What decides an array's values: its references, type, fill value, codecs and chunk
    grid (the digest of one file's array is found again for the same array in a slice's
    combined result, which keeps the first file's references)."""
    m, grid = array.manifest, array.grid
    h = hashlib.sha256(repr((array.name, array.dtype.str, repr(array.fill_value),
                             array.codecs, m.paths, grid.shape)).encode())
    axes = [grid.lengths(d) for d in range(grid.ndim)]
    axes += [grid.encoded_lengths(d) for d in range(grid.ndim)]
    for column in (m.path_id, m.offset, m.length, *axes):
        h.update(np.ascontiguousarray(column).tobytes())
    for coords in sorted(m.inline):
        h.update(repr(coords).encode() + m.inline[coords])
    return h.hexdigest()
