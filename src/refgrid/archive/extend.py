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
the archive's, and so must refgrid's bookkeeping (the layout's side, asked of
:mod:`refgrid.refs.growth`: the documents grown, and where each array's chunks go);
otherwise (and for backfill, replaced, removed or failed files, JSON output, an array whose
first dimension is not the concat dimension) the batch rebuilds the output and says why
(:class:`Plan`).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from pyarrow import ArrowException

from refgrid.archive.assemble import combine_records, order
from refgrid.archive.journal import Journal
from refgrid.archive.record import loads
from refgrid.combining.spec import CombineSpec
from refgrid.core.keys import REPORT_SUFFIX
from refgrid.core.sources import SourceIdentity, identity_difference
from refgrid.core.typed import StorageOptions
from refgrid.errors import BatchError, RefgridError, ScanError, WriteError
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.cropped import portable_documents_group
from refgrid.refs.growth import (
    Earlier,
    NotAppendable,
    Placed,
    grown,
    grown_documents,
    grown_pieces,
    piece_key,
)
from refgrid.refs.icechunk_state import IcechunkRecord, IcechunkState
from refgrid.refs.parquet import ZMetadata, local_sources, read_zmetadata, stored_piece
from refgrid.scanners.source import Source
from refgrid.writers import sized
from refgrid.writers.atomic import write_file
from refgrid.writers.icechunk import append_icechunk, stored
from refgrid.writers.padded import Padded, needs_rewrite, rewrite_padded, sidecar_for
from refgrid.writers.parquet import append_parquet

if TYPE_CHECKING:  # the icechunk extra
    from icechunk import Repository


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
    refused = _unlike(before, settings)
    if refused is not None:
        return Plan("rebuild", refused)
    try:
        return meta, output.sources(meta)
    except (RefgridError, AttributeError, KeyError, TypeError) as e:  # (a damaged section)
        return Plan("rebuild", f"the earlier output cannot be read ({type(e).__name__}: {e})")


def _unlike(report: object, settings: Mapping[str, str]) -> str | None:
    """Why the run that wrote ``report`` cannot be grown under ``settings`` (it failed, or
    other settings — each named, then and now, so a user sees which option to pass); None
    when it can."""
    if not isinstance(report, dict) or not isinstance(report.get("settings"), dict):
        return "the earlier run's report records no settings"
    if report.get("error"):
        return "the earlier run failed"
    then: dict[str, object] = report["settings"]
    differ = [f"{key} {then.get(key)!r} then, {settings.get(key)!r} now"
              for key in sorted(then.keys() | settings.keys())
              if then.get(key) != settings.get(key)]
    return f"the earlier output was written with other settings ({'; '.join(differ)})" \
        if differ else None


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

    def described(self, tail: VirtualGroup) -> VirtualGroup:
        """``tail`` on the grids this output's documents declare."""
        return tail

    def write(self, meta: Earlier, tail: VirtualGroup,
              appended: Mapping[str, Placed], docs: Mapping[str, Mapping[str, object]],
              sources: Mapping[str, SourceIdentity],
              known: Container[str], pieced: Iterable[str]) -> tuple[int, str | None]:
        """Write the new extent: per array, its chunks where they go (``appended``), the
        grown documents ``docs``, and ``sources`` but those the archive names (``known``, as
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
              appended: Mapping[str, Placed], docs: Mapping[str, Mapping[str, object]],
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
            kept = IcechunkRecord.from_bytes(self.state.read_bytes())
            head = self.repository.lookup_branch(self.branch)
        except (OSError, ValueError) as e:
            return Plan("rebuild", f"refgrid's record of the repository cannot be read ({e})")
        except Exception as e:  # icechunk's own errors: no such branch
            return Plan("rebuild", f"the branch {self.branch!r} cannot be read "
                        f"({type(e).__name__}: {e})")
        if kept.snapshot != head:
            return Plan("rebuild", f"the branch {self.branch!r} has commits this batch did not "
                        "make")
        try:
            docs = {key: json.loads(data) for key, data in self._get(kept.documents).items()}
        except Exception as e:  # icechunk's and zarr's own errors
            return Plan("rebuild", f"the repository's documents cannot be read "
                        f"({type(e).__name__}: {e})")
        return IcechunkState(kept.section, docs, head)

    def _get(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The bytes the branch holds at ``keys`` (read from one session)."""
        found = stored(self.repository, keys, self.branch)
        missing = [key for key, data in found.items() if data is None]
        if missing:
            raise NotAppendable(f"the repository has no {missing[0]}")
        return cast("dict[str, bytes]", found)

    def inline(self, meta: Earlier, path: str, piece: int) -> bytes:
        key = piece_key(meta, path, piece)
        return self._get([key])[key]

    def described(self, tail: VirtualGroup) -> VirtualGroup:
        return portable_documents_group(tail)

    def write(self, meta: Earlier, tail: VirtualGroup,
              appended: Mapping[str, Placed], docs: Mapping[str, Mapping[str, object]],
              sources: Mapping[str, SourceIdentity],
              known: Container[str], pieced: Iterable[str]) -> tuple[int, str | None]:
        assert isinstance(meta, IcechunkState)
        snapshot = append_icechunk(self.repository, tail, {
            path: start for path, (_, start, _) in appended.items()},
            grown_documents(docs, appended),
            message=self.message, parent=meta.snapshot, branch=self.branch,
            storage_options=self.storage_options)
        try:
            self.saved(meta.committed(snapshot, sources, docs))
        except OSError as e:
            raise WriteError(f"snapshot {snapshot} is committed, but {self.state} could not "
                             f"record it ({e}): the next run commits the whole archive") from e
        return 1, snapshot

    def saved_group(self, snapshot: str, group: VirtualGroup) -> None:
        """Record what ``snapshot``, a whole write of ``group``, holds."""
        self.saved(IcechunkRecord.of_group(snapshot, group))

    def saved(self, record: IcechunkRecord) -> None:
        """Record what a snapshot holds, for the next append."""
        write_file(self.state, record.to_bytes())


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
    last_length = _length(journal, last, concat_dim)
    tails: dict[str, VirtualArray] = {}
    whole: dict[str, tuple[VirtualArray, int, int]] = {}
    for path, node in group.walk():
        if isinstance(node, VirtualArray) and concat_dim in node.dims:
            if node.dims[0] != concat_dim:
                raise NotAppendable(f"{concat_dim!r} is not the first dimension of {path!r} "
                                    "(its chunks interleave in the record files)")
            if node.inline_pieces:
                whole[path] = grown_pieces(meta, path, node, skip + last_length,
                                           partial(output.inline, meta, path))
            else:
                tails[path] = node.slice(concat_dim, skip, node.shape[0])
    tail = output.prepared(sized(group.with_arrays(
        {**tails, **{path: array for path, (array, _, _) in whole.items()}}), storage_options))
    docs, appended = grown(meta, output.described(tail), last_length, list(tails),
                           {path: (length, piece) for path, (_, length, piece) in whole.items()})
    new_sources: dict[str, SourceIdentity] = {
        url: identity for url, identity in tail.sources.items() if url not in anchors}
    return Appended(group, *output.write(meta, tail, appended, docs, new_sources,
                                         chosen.sources, list(whole)))


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
