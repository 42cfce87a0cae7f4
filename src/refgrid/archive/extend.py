"""An append that costs what it adds: new files after the end of a parquet archive or of an
Icechunk repository's branch.

A batch over a grown archive would combine every recorded file and write the whole output
again — minutes and gigabytes for 10^5 files. When the files new since the output was written
all come after its last file along the concat dimension (the usual growth: a file a day),
and nothing recorded changed or went away, :func:`extend` combines only the archive's first
file (whose units, calendar and attributes every file is re-encoded to and checked against),
its last file (continuity: no overlap, the padded last chunk that becomes interior) and the
new files, and writes the new extent: for parquet
(:func:`refgrid.writers.parquet.append_parquet`) what the layout says an append of those
chunks rewrites (:func:`refgrid.refs.parquet.appended_files`: the record files from the last
file's first chunk on, the source pages from where the new files sort, and ``.zmetadata``);
for Icechunk (:func:`refgrid.writers.icechunk.append_icechunk`) one commit of the changed
documents and the chunks from the last file's first on. Time and memory then grow with the
new files, not with the archive. :class:`Output` is what differs between the two.

The result equals a from-scratch batch of the same files, or the append is not taken: every
document of the combined first/last/new files, but for its shape and chunk grid, must equal
the archive's, and so must refgrid's bookkeeping; otherwise (and for backfill, replaced,
removed or failed files, JSON output, an array whose first dimension is not the concat
dimension) the batch rebuilds the output and says why (:class:`Plan`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pyarrow import ArrowException

from refgrid.archive.assemble import combine_records, order
from refgrid.archive.journal import Journal
from refgrid.archive.record import loads
from refgrid.combining.spec import CombineSpec
from refgrid.core.dtypes import ENCODING_ATTR
from refgrid.core.keys import REPORT_SUFFIX, KeyEncoding, chunk_key, document_key
from refgrid.core.sources import SourceIdentity, identity_difference
from refgrid.core.typed import StorageOptions
from refgrid.errors import BatchError, RefgridError, ScanError, WriteError
from refgrid.grid.json_forms import (
    ChunkGridJSON,
    emit_chunk_grid,
    grown_chunk_grid,
    parse_chunk_grid,
)
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import VirtualArray, VirtualGroup, in_pieces, piece_length
from refgrid.model.zarr_json import bookkeeping, documents
from refgrid.read.cropped import portable_documents_group, portable_grid
from refgrid.refs.parquet import ZMetadata, local_sources, read_zmetadata, stored_piece
from refgrid.refs.section import ATTRIBUTES_KEY, SOURCES_KEY, Section
from refgrid.scanners.source import Source
from refgrid.writers import sized
from refgrid.writers.atomic import write_file
from refgrid.writers.icechunk import append_icechunk
from refgrid.writers.padded import Padded, needs_rewrite, rewrite_padded, sidecar_for
from refgrid.writers.parquet import append_parquet

if TYPE_CHECKING:  # the icechunk extra
    from icechunk import Repository

GRID_KEYS = ("shape", "chunk_grid")
"""What an append changes in an array's document."""


@dataclass(frozen=True)
class IcechunkState:
    """What an Icechunk output's append is planned on: the snapshot this batch committed
    last, its documents (read from it) and refgrid's section of it — the sources and
    bookkeeping, which a commit does not carry: kept in the work directory
    (:attr:`IcechunkOutput.state`)."""

    section: Section
    metadata: Mapping[str, Mapping[str, Any]]
    snapshot: str


Earlier = ZMetadata | IcechunkState
"""The archive as its output read it: its documents (``metadata``) and refgrid's section."""


@dataclass(frozen=True)
class Plan:
    """How a batch brings its output up to date: ``"new"`` (no earlier output),
    ``"unchanged"`` (nothing to add), ``"append"`` (:func:`extend`) or ``"rebuild"`` (the
    whole output written again), and why."""

    path: Literal["new", "unchanged", "append", "rebuild"]
    reason: str
    old: tuple[str, ...] = ()
    """The archive's files, its first and last along the concat dimension first and last
    (for an append)."""
    new: tuple[str, ...] = ()
    """The files to add, in order (for an append)."""
    meta: Earlier | None = field(default=None, repr=False, compare=False)
    """The output as read (for an append)."""
    sources: Mapping[str, SourceIdentity] = field(default_factory=dict, repr=False,
                                                  compare=False)
    """The output's sources, its rewritten chunk files among them (for an append)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def plan(journal: Journal, output: Output, good: Sequence[str],
         settings: Mapping[str, str]) -> Plan:
    """Whether the files ``good`` (recorded, scanned without failure) can be appended to
    ``output``, written by an earlier batch from the same work directory with the same
    ``settings`` (which its report beside the output holds)."""
    earlier = _earlier(output, settings)
    if isinstance(earlier, Plan):
        return earlier
    meta, sources = earlier
    try:
        old = source_files(sources)
    except (RefgridError, AttributeError, KeyError, TypeError) as e:  # (a damaged section)
        return Plan("rebuild", f"the earlier output cannot be read ({type(e).__name__}: {e})")
    if not old:
        return Plan("rebuild", "the earlier output names no source file")
    gone = old.keys() - set(good)
    if gone:
        return Plan("rebuild", f"{len(gone)} file(s) of the output are gone or failed (e.g. "
                    f"{next(url for url in old if url in gone)})")
    entries = journal.entries
    changed = [url for url, identity in old.items()
               if identity != entries[url].header["identity"] and identity_difference(
                   identity, entries[url].header["identity"])]
    if changed:
        return Plan("rebuild", f"{len(changed)} file(s) of the output changed since it was "
                    f"written (e.g. {changed[0]})")
    new = [url for url in good if url not in old]
    if not new:
        return Plan("unchanged", "no new file")
    first, last = output.ends(meta) or (next(iter(old)), list(old)[-1])
    if first not in old or last not in old:
        return Plan("rebuild", "the earlier output's first and last files are not among "
                    "its sources")
    ordered = after_last(journal, last, new)
    if isinstance(ordered, str):
        return Plan("rebuild", ordered)
    return Plan("append", f"{len(new)} file(s) after the archive's last",
                (first, *(url for url in old if url not in (first, last)), last)
                if first != last else (first,), tuple(ordered[1:]), meta, sources)


def _earlier(output: Output, settings: Mapping[str, str]
             ) -> tuple[Earlier, Mapping[str, SourceIdentity]] | Plan:
    """The earlier output as read and its sources, if a batch with the same ``settings``
    wrote it; else the plan."""
    meta = output.earlier()
    if isinstance(meta, Plan):
        return meta
    try:
        before = json.loads(output.report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return Plan("rebuild", f"the earlier run's report cannot be read ({e})")
    if not isinstance(before, dict) or before.get("settings") != dict(settings) or \
            before.get("error"):
        return Plan("rebuild", "the earlier output was written with other settings (or "
                    "failed)")
    try:
        return meta, output.sources(meta)
    except (RefgridError, AttributeError, KeyError, TypeError) as e:  # (a damaged section)
        return Plan("rebuild", f"the earlier output cannot be read ({type(e).__name__}: {e})")


def plan_added(output: Output, listed: Mapping[str, SourceIdentity | None],
               settings: Mapping[str, str], storage_options: StorageOptions) -> Plan:
    """How the files ``listed``, named as files to add to ``output`` (a batch told which
    files are new: ``append=True``), are added: ``"unchanged"`` (the archive holds them
    all, as they are) or ``"append"``, with the archive's first and last files (``old``)
    and the files to scan (``new``, ordered once scanned). No other file of the archive is
    listed or compared, so this costs what is added. What only a whole batch can do is a
    :class:`BatchError` saying so: no earlier output, other settings, or a named file the
    archive holds that changed since."""
    earlier = _earlier(output, settings)
    if isinstance(earlier, Plan):
        raise BatchError(f"cannot append to {output.target}: {earlier.reason}; {WHOLE}")
    meta, sources = earlier
    new = []
    for url, known in listed.items():
        try:
            held = sources.get(url)
        except (RefgridError, AttributeError, KeyError, TypeError) as e:
            raise BatchError(f"cannot append to {output.target}: its sources cannot be read "
                             f"({type(e).__name__}: {e}); {WHOLE}") from e
        if held is None:
            new.append(url)
            continue
        try:
            now = known if known is not None else Source.of(url, storage_options).identity
        except ScanError as e:
            raise BatchError(f"{url} is in the archive {output.target} and cannot be read "
                             f"({e}); {WHOLE}") from e
        difference = changed(held, now)
        if difference:
            raise BatchError(f"{url} is in the archive {output.target} and changed since it "
                             f"was written ({difference}); {WHOLE}")
    if not new:
        return Plan("unchanged", "every file named is in the archive")
    ends = output.ends(meta)
    if ends is None:  # (no table to say: the sources in time order, as plan() takes them)
        urls = list(source_files(sources))
        ends = (urls[0], urls[-1]) if urls else None
    if ends is None:
        raise BatchError(f"the archive {output.target} names no source file; {WHOLE}")
    first, last = ends
    return Plan("append", f"{len(new)} file(s) named as new", (first, last) if first != last
                else (first,), tuple(new), meta, sources)


def source_files(sources: Mapping[str, SourceIdentity]) -> dict[str, SourceIdentity]:
    """The archive's source files, in its order: its rewritten chunk files left out."""
    return {url: identity for url, identity in sources.items()
            if isinstance(identity, dict) and not identity.get("rewritten")}


def after_last(journal: Journal, last: str, new: Sequence[str]) -> list[str] | str:
    """``[last, *new]`` in concat-coordinate order if every file of ``new`` comes after the
    archive's ``last``; else why not."""
    unplaced = [url for url in (last, *new) if "first" not in journal.header(url)]
    if unplaced:
        return f"{unplaced[0]} has no value of the concat coordinate to order it by"
    ordered = order(journal, [last, *new])
    if ordered[0] != last:
        early = next(url for url in ordered if url != last)
        return f"{early} lies inside the archive's range (backfill)"
    return ordered


def changed(recorded: object, now: SourceIdentity) -> str:
    """What differs between a file's recorded identity and ``now`` (empty: nothing); one
    damaged in the record differs."""
    if not isinstance(recorded, Mapping):
        return f"its recorded identity {recorded!r:.60} is damaged"
    try:
        return identity_difference(cast("SourceIdentity", recorded), now)
    except (TypeError, ValueError) as e:
        return f"its recorded identity is damaged ({e})"


WHOLE = "run the batch over every file of the archive (without append) to rebuild it"
"""What a batch told which files are new says when only a whole batch can do it."""


@dataclass(frozen=True)
class Appended:
    group: VirtualGroup
    """The first, last and new files combined (its report: the combine's notes)."""
    records: int
    """Record files (or commits) written."""
    snapshot: str | None = None
    """The Icechunk snapshot committed."""


class NotAppendable(Exception):
    """The new files combine, but the result would differ from the archive's documents
    beyond its extent: the output is rebuilt instead (the message says why)."""


class Output:
    """Where an append writes: what differs between parquet references and an Icechunk
    repository (the rest of :func:`plan` and :func:`extend` is the same for both)."""

    target: Path
    """The output (an Icechunk output: its name in the work directory), whose report lies
    beside it."""

    @property
    def report(self) -> Path:
        return self.target.with_name(self.target.name + REPORT_SUFFIX)

    def earlier(self) -> Earlier | Plan:
        """The earlier output's documents and refgrid section, or the plan when it has none
        to extend."""
        raise NotImplementedError

    def sources(self, meta: Earlier) -> Mapping[str, SourceIdentity]:
        """The archive's sources by URL, as its section names them (``meta``: as
        :meth:`earlier` read it)."""
        return meta.section.identities()

    def ends(self, meta: Earlier) -> tuple[str, str] | None:
        """The archive's first and last files along its concat dimension, where its sources'
        order does not say (None: the first and last of them)."""
        return None

    def inline(self, meta: Earlier, path: str, piece: int) -> bytes:
        """The stored bytes of piece ``piece`` (along the first dimension) of the archive's
        inline array ``path`` (:attr:`~refgrid.model.virtual.VirtualArray.inline_pieces`)."""
        raise NotImplementedError

    def prepared(self, tail: VirtualGroup) -> VirtualGroup:
        """``tail`` as this output stores it (padded chunks rewritten, say)."""
        return tail

    def grid(self, array: VirtualArray) -> RectilinearGrid:
        """The grid this output declares for ``array``."""
        return array.grid

    def documents(self, tail: VirtualGroup) -> dict[str, Mapping[str, object]]:
        return dict(documents(tail))

    def write(self, meta: Earlier, tail: VirtualGroup,
              appended: Mapping[str, tuple[int, int, ChunkManifest]],
              docs: Mapping[str, Mapping[str, Any]],
              sources: Mapping[str, SourceIdentity],
              known: Container[str], pieced: Iterable[str]) -> tuple[int, str | None]:
        """Write the new extent: per array, its chunks from ``(row, first chunk along the
        concat dimension)`` on, and ``sources`` but those the archive names (``known``, as
        it names them: the last file's rewritten chunks, say); ``pieced``: the arrays
        stored inline in pieces; returns the files (or commits) written and the snapshot
        committed (None: none)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ParquetOutput(Output):
    target: Path
    format: str
    padded: Padded
    storage_options: StorageOptions

    def earlier(self) -> Earlier | Plan:
        if not self.target.exists():
            return Plan("new", "no earlier output")
        if self.format != "parquet":
            return Plan("rebuild", f"{self.format} references are written whole (parquet "
                        "output appends what it adds)")
        try:
            return read_zmetadata(self.target)
        except (OSError, RefgridError) as e:
            return Plan("rebuild", f"the earlier output cannot be read ({type(e).__name__}: "
                        f"{e})")

    def sources(self, meta: Earlier) -> Mapping[str, SourceIdentity]:
        return local_sources(self.target, _zmetadata(meta))

    def ends(self, meta: Earlier) -> tuple[str, str] | None:
        return _zmetadata(meta).ends()

    def inline(self, meta: Earlier, path: str, piece: int) -> bytes:
        stored = stored_piece(self.target, _zmetadata(meta), path, piece)
        if stored is None:
            raise NotAppendable(f"the archive's {path!r} is not stored inline")
        return stored

    def prepared(self, tail: VirtualGroup) -> VirtualGroup:
        if self.padded == "rewrite" and needs_rewrite(tail):
            tail, _ = rewrite_padded(tail, sidecar_for(self.target),
                                     storage_options=self.storage_options)
        return tail

    def write(self, meta: Earlier, tail: VirtualGroup,
              appended: Mapping[str, tuple[int, int, ChunkManifest]],
              docs: Mapping[str, Mapping[str, Any]],
              sources: Mapping[str, SourceIdentity],
              known: Container[str], pieced: Iterable[str]) -> tuple[int, str | None]:
        sidecar = sidecar_for(self.target)
        return append_parquet(self.target, _zmetadata(meta), {
            p: (row, manifest) for p, (row, _, manifest) in appended.items()}, docs, sources,
            sidecar if sidecar.is_dir() else None, known, pieced), None


def _zmetadata(meta: Earlier) -> ZMetadata:
    """A parquet output's archive as read (its plan holds nothing else)."""
    if not isinstance(meta, ZMetadata):
        raise TypeError(f"parquet references are read as their .zmetadata, not as "
                        f"{type(meta).__name__}")
    return meta


@dataclass(frozen=True)
class IcechunkOutput(Output):
    """An Icechunk repository's branch; the archive's sources and bookkeeping, and the
    snapshot they describe, kept in ``state`` (the work directory's ``icechunk.refgrid.json``:
    a commit need not carry them)."""

    target: Path
    repository: Repository
    message: str
    storage_options: StorageOptions
    branch: str = "main"

    @property
    def state(self) -> Path:
        return self.target.with_name(self.target.name + ".refgrid.json")

    def earlier(self) -> Earlier | Plan:
        if not self.state.exists():
            return Plan("new", "no earlier commit by this batch")
        try:
            kept = json.loads(self.state.read_text(encoding="utf-8"))
            head = self.repository.lookup_branch(self.branch)
        except (OSError, ValueError) as e:
            return Plan("rebuild", f"refgrid's record of the repository cannot be read ({e})")
        except Exception as e:  # icechunk's own errors: no such branch
            return Plan("rebuild", f"the branch {self.branch!r} cannot be read "
                        f"({type(e).__name__}: {e})")
        if not isinstance(kept, dict) or kept.get("snapshot") != head:
            return Plan("rebuild", f"the branch {self.branch!r} has commits this batch did not "
                        "make")
        store = self.repository.readonly_session(branch=self.branch).store
        try:
            docs = {key: json.loads(_get(store, key)) for key in kept["documents"]}
        except Exception as e:  # icechunk's and zarr's own errors
            return Plan("rebuild", f"the repository's documents cannot be read "
                        f"({type(e).__name__}: {e})")
        return IcechunkState(Section.from_dict(kept), docs, head)

    def inline(self, meta: Earlier, path: str, piece: int) -> bytes:
        doc = meta.metadata[document_key(path)]
        store = self.repository.readonly_session(branch=self.branch).store
        return _get(store, chunk_key(path, (piece,) + (0,) * (len(doc["shape"]) - 1),
                                     KeyEncoding.from_json(doc.get("chunk_key_encoding"))))

    def grid(self, array: VirtualArray) -> RectilinearGrid:
        return portable_grid(array.grid)

    def documents(self, tail: VirtualGroup) -> dict[str, Mapping[str, object]]:
        return dict(documents(portable_documents_group(tail)))

    def write(self, meta: Earlier, tail: VirtualGroup,
              appended: Mapping[str, tuple[int, int, ChunkManifest]],
              docs: Mapping[str, Mapping[str, Any]],
              sources: Mapping[str, SourceIdentity],
              known: Container[str], pieced: Iterable[str]) -> tuple[int, str | None]:
        assert isinstance(meta, IcechunkState)
        changed = {document_key(path): docs[document_key(path)] for path in appended}
        snapshot = append_icechunk(self.repository, tail, {
            path: start for path, (_, start, _) in appended.items()}, changed,
            message=self.message, parent=meta.snapshot, branch=self.branch,
            storage_options=self.storage_options)
        try:
            self.saved(snapshot, {**meta.section.identities(), **sources},
                       docs, meta.section.attributes)
        except OSError as e:
            raise WriteError(f"snapshot {snapshot} is committed, but {self.state} could not "
                             f"record it ({e}): the next run commits the whole archive") from e
        return 1, snapshot

    def saved_group(self, snapshot: str, group: VirtualGroup) -> None:
        """Record what ``snapshot``, a whole write of ``group``, holds."""
        self.saved(snapshot, group.sources, documents(group), bookkeeping(group))

    def saved(self, snapshot: str, sources: Mapping[str, object],
              docs: Iterable[str], attributes: object | None) -> None:
        """Record what ``snapshot`` holds, for the next append."""
        kept = {"snapshot": snapshot, SOURCES_KEY: dict(sources), "documents": list(docs),
                **({ATTRIBUTES_KEY: attributes} if attributes else {})}
        write_file(self.state, json.dumps(kept).encode())


def _get(store: object, key: str) -> bytes:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    found = sync(store.get(key, default_buffer_prototype()))  # type: ignore[attr-defined]
    if found is None:
        raise NotAppendable(f"the repository has no {key}")
    return bytes(found.to_bytes())


def extend(journal: Journal, output: Output, chosen: Plan, spec: CombineSpec, *,
           storage_options: StorageOptions) -> Appended:
    """Append ``chosen.new`` to ``output`` (see the module). The combined files must hold
    the archive's variables, no more, no fewer: with ``missing="fill"``, a new file without
    one of them reads as its fill value there, as a rebuild would read it, but a variable
    the new files bring (or one only the archive's middle files hold) means a rebuild."""
    first, last = chosen.old[0], chosen.old[-1]
    anchors = [first] if first == last else [first, last]
    group = combine_records(journal, [*anchors, *chosen.new], spec,
                            storage_options=dict(storage_options))
    try:
        return _extend(journal, output, chosen, group, anchors, spec.concat_dim,
                       storage_options)
    except (NotAppendable, WriteError):
        raise
    except (RefgridError, OSError, KeyError, IndexError, TypeError, ValueError,
            ArrowException) as e:  # the earlier output is not as this batch wrote it
        raise NotAppendable(f"the earlier output cannot be extended ({type(e).__name__}: "
                            f"{e})") from e


def _extend(journal: Journal, output: Output, chosen: Plan, group: VirtualGroup,
            anchors: list[str], concat_dim: str, storage_options: StorageOptions) -> Appended:
    first, last = anchors[0], anchors[-1]
    skip = _length(journal, first, concat_dim) if last != first else 0
    meta = chosen.meta
    assert meta is not None  # (an append's plan holds the archive as read)
    old_docs = meta.metadata
    last_length = _length(journal, last, concat_dim)
    tails: dict[str, VirtualArray] = {}
    whole: dict[str, tuple[VirtualArray, int, int]] = {}
    for path, node in group.walk():
        if isinstance(node, VirtualArray) and concat_dim in node.dims:
            if node.dims[0] != concat_dim:
                raise NotAppendable(f"{concat_dim!r} is not the first dimension of {path!r} "
                                    "(its chunks interleave in the record files)")
            if node.inline_pieces:
                whole[path] = _grown(node, output, meta, path, skip + last_length)
            else:
                tails[path] = node.slice(concat_dim, skip, node.shape[0])
    tail = output.prepared(sized(group.with_arrays(
        {**tails, **{path: array for path, (array, _, _) in whole.items()}}), storage_options))
    docs = output.documents(tail)
    appended: dict[str, tuple[int, int, ChunkManifest]] = {}
    for path, (_, length, piece) in whole.items():
        array = tail[path]
        assert isinstance(array, VirtualArray)
        key = document_key(path)
        docs[key] = {**docs[key], "shape": [length, *array.shape[1:]]}
        appended[path] = (piece, piece, array.manifest)
    for path in tails:
        array = tail[path]
        assert isinstance(array, VirtualArray)
        key = document_key(path)
        old = old_docs.get(key)
        if not isinstance(old, Mapping) or old["shape"][1:] != list(array.shape[1:]):
            raise NotAppendable(f"the archive's {path!r} is not shaped as the new files'")
        grid = output.grid(array)
        grown = grown_chunk_grid(old["chunk_grid"], old["shape"], last_length, grid) or \
            _grown_whole(old, last_length, grid, path)
        docs[key] = {**docs[key], "shape": [int(old["shape"][0]) - last_length + grid.shape[0],
                                            *old["shape"][1:]], "chunk_grid": grown[0]}
        appended[path] = (grown[1] * math.prod(grid.chunk_counts[1:]), grown[1],
                          array.manifest)
    _check_same(old_docs, docs, meta.section.attributes or {}, bookkeeping(tail))
    new_sources: dict[str, SourceIdentity] = {
        url: identity for url, identity in tail.sources.items() if url not in anchors}
    return Appended(group, *output.write(meta, tail, appended, docs, new_sources,
                                         chosen.sources, list(whole)))


def _grown_whole(old: Mapping[str, Any], last_length: int, grid: RectilinearGrid,
                 path: str) -> tuple[ChunkGridJSON, int]:
    """The grown grid's document and the chunks kept along the concat dimension, from the
    archive's whole grid (where :func:`grown_chunk_grid` does not apply)."""
    before = parse_chunk_grid(old["chunk_grid"], old["shape"])
    cut = int(before.shape[0]) - last_length
    keep, kept = before.slice(0, 0, cut)
    if cut < 0 or int(before.bounds(0)[kept.stop]) != cut:
        raise NotAppendable(f"the archive's chunks of {path!r} do not end where its last "
                            "file begins")
    return emit_chunk_grid(RectilinearGrid.concat([keep, grid], 0)), kept.stop


def _grown(array: VirtualArray, output: Output, meta: Earlier, path: str,
           start: int) -> tuple[VirtualArray, int, int]:
    """The archive's inline array ``path`` (:func:`~refgrid.model.virtual.in_pieces`) with
    ``array``'s elements from ``start`` on after it (the concat coordinate, re-encoded to
    the first file's units): its pieces from the last stored one on (read, and written again
    with the new elements after it: a piece of 4,096 steps at most, whatever the archive's
    length), its new length and the index of its first piece written. An archive whose
    array is one chunk of another length (a short archive, or one written before arrays
    were pieced) is written again whole."""
    old = meta.metadata[document_key(path)]
    if old["shape"][1:] != list(array.shape[1:]):
        raise NotAppendable(f"the archive's {path!r} is not shaped as the new files'")
    before = parse_chunk_grid(old["chunk_grid"], old["shape"])
    length = int(before.shape[0])
    step = math.prod(array.shape[1:]) * array.dtype.itemsize
    added = b"".join(array.manifest.inline_chunk(k) for k in range(array.grid.nchunks))[
        start * step:array.shape[0] * step]
    total = length + len(added) // step
    piece = piece_length(total)
    kept = int(before.axes[0].logical[0]) if before.nchunks else 0
    if before.nchunks > 1 and (kept != piece or (before.chunk_shape or (0,))[0] != kept):
        raise NotAppendable(f"the archive's {path!r} is not stored in pieces of {piece} (its "
                            "files' own chunks, say)")
    first = before.chunk_counts[0] - 1 if kept == piece else 0
    stored = output.inline(meta, path, first) if before.nchunks else b""
    if before.nchunks and len(stored) != kept * step:
        raise NotAppendable(f"the archive's piece {first} of {path!r} holds {len(stored)} "
                            f"bytes, not {kept * step}")
    stored = stored[:(length - first * kept) * step]
    return (in_pieces(array, stored + added, (total - first * piece, *array.shape[1:]),
                      piece), total, first)


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
    if _without_source(json.loads(json.dumps(new_kept))) != _without_source(old_kept):
        raise NotAppendable("refgrid's bookkeeping of the new files differs from the "
                            "archive's")


def _without_source(kept: object) -> object:
    """Bookkeeping but the file each array's encoding came from (a variable some files lack
    takes it from the first file holding it among those combined): the archive keeps its
    own."""
    if not isinstance(kept, Mapping):
        return kept
    return {name: {k: ({e: v for e, v in value.items() if e != "source"}
                       if k == ENCODING_ATTR and isinstance(value, Mapping) else value)
                   for k, value in attrs.items()} if isinstance(attrs, Mapping) else attrs
            for name, attrs in kept.items()}


def _without_grid(doc: Mapping[str, object]) -> dict[str, object]:
    return json.loads(json.dumps({k: v for k, v in doc.items() if k not in GRID_KEYS}))
