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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from refgrid.archive.journal import Journal
from refgrid.archive.record import loads
from refgrid.combining import combine
from refgrid.core.cf import decode_times, is_time_units
from refgrid.core.typed import JSON, JSONScalar
from refgrid.errors import BatchError, CombineError
from refgrid.model.virtual import VirtualArray, VirtualGroup

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

SLICE_FILES = 2000


def combine_records(journal: Journal, urls: Sequence[str], concat_dim: str, *,
             overlap: Literal["error", "allow"] = "error",
             codecs: Literal["error", "recode"] = "error",
             storage_options: dict[str, object] | None = None,
             advance: Callable[[int], None] = lambda n: None) -> VirtualGroup:
    """The combined dataset of the recorded ``urls``; ``advance(n)`` after n more files."""
    ordered = order(journal, urls)
    digests: dict[str, str] = {}

    def fingerprint(array: VirtualArray) -> str | None:
        return digests.get(_content_key(array))

    options = {"overlap": overlap, "codecs": codecs, "storage_options": storage_options,
               "fingerprint": fingerprint}
    slices, labels = [], []
    for first in range(0, len(ordered), SLICE_FILES):
        part = ordered[first:first + SLICE_FILES]
        groups = [_load(journal, url, digests) for url in part]
        slices.append(combine(groups, concat_dim, sources=part, **options))  # type: ignore[arg-type]
        labels.append(part[0])
        advance(len(part))
    if len(slices) == 1:
        return slices[0]
    return combine(slices, concat_dim, sources=labels, **options)  # type: ignore[arg-type]


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
