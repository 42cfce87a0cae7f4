"""Batch conversion of whole archives: :func:`batch`.

``batch(sources, output)`` lists the files (paths, globs, ``@list`` files), scans those not
yet recorded in the work directory on dask (:mod:`.runner`), records each as it finishes
(:mod:`.journal`), combines every recorded file (:mod:`.assemble`) and writes the
references atomically, with a report beside them. Run again, it scans only new and changed
files: that is how a killed batch resumes and how an archive that grows is appended to.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from refgrid.archive.assemble import combine_records
from refgrid.archive.deadline import GUARD, importing_script, note_unguarded
from refgrid.archive.extend import (
    WHOLE,
    Appended,
    IcechunkOutput,
    Output,
    ParquetOutput,
    Plan,
    after_last,
    changed,
    extend,
    plan,
    plan_added,
)
from refgrid.archive.journal import RECORDS, Journal
from refgrid.archive.runner import run
from refgrid.archive.task import Failed, ScanJob, Scanned
from refgrid.combining.shaping import FileShape
from refgrid.combining.spec import CombineSpec
from refgrid.core.bounds import current
from refgrid.core.inputs import Named, expand, source_names
from refgrid.core.keys import REPORT_SUFFIX
from refgrid.core.sources import SourceIdentity, identity_difference
from refgrid.core.tasks import progress_bar, showing
from refgrid.core.typed import StorageOptions, Untyped
from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError, BatchError, RefgridError, ScanError
from refgrid.refs.growth import NotAppendable
from refgrid.scanners.source import Source
from refgrid.writers import (
    DEFAULT_PADDED,
    PADDED_CHOICES,
    Padded,
    check_icechunk_options,
    save,
    write,
)
from refgrid.writers.atomic import clean_leftovers, write_file
from refgrid.writers.references import FORMATS, Format

if TYPE_CHECKING:
    from icechunk import Repository

    from refgrid.model.virtual import VirtualGroup

TIMED_OUT = "timed-out"
"""The work directory's folder where workers note the files whose scans timed out."""


@dataclass(frozen=True)
class FailedFile:
    url: str
    error: str
    message: str


@dataclass(frozen=True)
class BatchResult:
    """What a batch did (also saved as JSON in :attr:`report_path`)."""

    output: Path
    report_path: Path
    work_dir: Path
    files: int
    """Files the sources name now."""
    scanned: int
    """Files scanned and recorded by this run (new, changed, or failed before); the files
    that failed are in :attr:`failed`."""
    reused: int
    """Files whose records from an earlier run were used."""
    changed: list[str] = field(default_factory=list)
    """Recorded files that changed since (rescanned), with what changed."""
    failed: list[FailedFile] = field(default_factory=list)
    dropped: int = 0
    """Recorded files the sources no longer name (left out of the output)."""
    notes: list[str] = field(default_factory=list)
    """Scan and combine notes (inlined variables, attribute conflicts...)."""
    error: str | None = None
    """Why the recorded files could not be combined (then there is no output)."""
    rewritten: str | None = None
    """What ``padded="rewrite"`` copied."""
    snapshot: str | None = None
    """The Icechunk snapshot committed (Icechunk output)."""
    settings: dict[str, str] = field(default_factory=dict)
    """What decides the output's form (concat dimension, format, padded chunks, overlap and
    codecs policies): a later run appends to the output only with the same."""
    update: str | None = None
    """How the output was brought up to date (:class:`~refgrid.archive.extend.Plan`):
    ``"new: ..."``, ``"unchanged: ..."``, ``"append: ..."`` (the new files only, written in
    time and memory that grow with them) or ``"rebuild: <why>"`` (the whole output written
    again: backfill, changed or removed files, JSON output...)."""

    @property
    def ok(self) -> bool:
        return not self.failed

    def __repr__(self) -> str:
        """One line (a notebook shows it): where the output went and what the batch did;
        the details are in the fields and the report."""
        where = (self.snapshot and f"snapshot {self.snapshot}") or _shown(self.output)
        extra = "".join(f", {n} {what}" for n, what in (
            (len(self.changed), "changed"), (self.dropped, "dropped"),
            (len(self.notes), "notes")) if n)
        error = f", error: {self.error[:60]}" if self.error else ""
        report = self.report_path.name + " beside it" \
            if self.report_path.parent == self.output.parent else _shown(self.report_path)
        return (f"BatchResult({where}: {self.files} files, {self.scanned} scanned, "
                f"{self.reused} reused, {len(self.failed)} failed{extra}{error}; report "
                f"{report})")


def _shown(path: Path) -> str:
    """A path as a user gave it: relative to the working directory where it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def batch(
    sources: Named | Iterable[Named],
    output: str | os.PathLike[str] | Repository,
    *,
    concat_dim: str = "time",
    scheduler: str | Untyped | None = None,
    workers: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    on_error: Literal["raise", "report"] = "report",
    progress: bool | None = None,
    overlap: Literal["error", "allow"] = "error",
    codecs: Literal["segments", "recode", "error"] = "segments",
    format: Format | None = None,
    padded: Padded = DEFAULT_PADDED,
    message: str | None = None,
    allowed_sources: list[str] | None = None,
    storage_options: StorageOptions | None = None,
    file_timeout: float | None = None,
    append: bool = False,
    missing: Literal["error", "fill"] = "error",
    variables: Sequence[str] | str | None = None,
    drop_variables: Sequence[str] | str | None = None,
    merge: bool = False,
    stack_dim: str | None = None,
    stack_by: str | None = None,
    time_from: str | None = None,
    time_units: str | None = None,
    calendar: str | None = None,
    data_url: str | None = None,
) -> BatchResult:
    """Convert an archive: scan every file ``sources`` name, combine along ``concat_dim``,
    write references at ``output``.

    ``file_timeout``: seconds one file's scan may take (default: the ``scan_timeout`` limit,
    10 minutes); a scan that passes it — a stalled server, libhdf5 hung on a damaged file — is
    stopped with its worker process, recorded as failed, and the batch goes on (with
    ``scheduler="synchronous"``, which runs in this process, its thread is left behind).

    ``sources``: paths (text or path objects), URLs, glob patterns (local or remote, e.g.
    ``s3://b/era5/*.nc``) and ``@FILE`` lists (one source per line). ``output``: parquet
    references, or JSON when the name ends in ``.json`` (``format`` overrides). Scans run on
    dask: by default in one process per core (``workers``) on this machine; ``scheduler`` may
    be a scheduler address (``"tcp://HOST:8786"``) or a ``distributed.Client`` — the
    workers then open the sources.

    Each scanned file is recorded in ``work_dir`` (default ``OUTPUT.parts``) as soon as its
    scan ends, keyed by URL and identity (size and mtime, or ETag). A later run scans only
    files not recorded or changed since, so a killed batch resumes where it stopped and a
    grown archive is appended to; the output is the same as a run from scratch.

    ``on_error="report"`` (default): files that cannot be scanned are listed in the result
    and the report, and the others are combined; ``"raise"``: the first such file raises.
    ``progress``: a progress bar on stderr (default: when stderr is a terminal).
    ``overlap``, ``codecs``: as in :func:`refgrid.combine`; ``format``, ``padded``: as in
    :func:`refgrid.write`. ``output`` may also be an Icechunk ``Repository`` (``work_dir``
    then required): the archive is committed to it with ``message``, so a run over a grown
    archive appends its new files as a new commit and earlier snapshots keep their extent.

    ``missing``, ``variables``, ``drop_variables``, ``merge``, ``stack_dim``/``stack_by``,
    ``time_from``/``time_units``/``calendar``: as in :func:`refgrid.combine` — each file is
    shaped on its worker, and files are partitioned from what the workers recorded. A merged
    or stacked archive is written whole when it grows (``append=True`` refuses it), and so
    is one whose variables come and go where the new files' variables differ.

    ``data_url``: for DMR++ documents (``'granules/*.dmrpp'``), where their granules are
    when the documents name them by a relative path or Hyrax's placeholder: a URL template
    whose ``{name}`` is a document's name without ``.dmrpp`` (default: beside each
    document). Each document is one request and each granule one ``HEAD``, for its
    identity; no granule is read.

    ``append=True``: ``sources`` name files to *add* to the existing output, after its last
    file along ``concat_dim`` (a file that just landed: an S3 event, a cron job that knows
    it). The archive's other files are neither listed nor checked again, so the run costs
    what it adds, whatever the archive's size. Anything only a whole batch can do — no
    output yet, other settings, a named file inside the archive's range (backfill) or
    already in it but changed, new files that do not combine with the archive's — is a
    :class:`~refgrid.BatchError` that says so, and the output is left as it was.
    """
    spec = CombineSpec.of(concat_dim, overlap=overlap, codecs=codecs, missing=missing,
                          merge=merge, variables=variables, drop_variables=drop_variables,
                          stack_dim=stack_dim, stack_by=stack_by, time_from=time_from,
                          time_units=time_units, calendar=calendar)
    how = BatchRun(scheduler, workers, work_dir, on_error, progress, format, padded, message,
                   allowed_sources, dict(storage_options or {}), file_timeout, append,
                   data_url)
    return convert(sources, output, spec, how)


@dataclass(frozen=True)
class BatchRun:
    """How a batch runs and writes: everything :func:`batch` takes but what it combines
    (a :class:`~refgrid.combining.spec.CombineSpec`) — what the CLI and ``serve --follow``
    pass on as one object."""

    scheduler: str | Untyped | None = None
    workers: int | None = None
    work_dir: str | os.PathLike[str] | None = None
    on_error: Literal["raise", "report"] = "report"
    progress: bool | None = None
    format: Format | None = None
    padded: Padded = DEFAULT_PADDED
    message: str | None = None
    allowed_sources: list[str] | None = None
    storage_options: dict[str, object] = field(default_factory=dict)
    file_timeout: float | None = None
    append: bool = False
    data_url: str | None = None

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "report"):
            raise ArgumentError(f"on_error must be 'raise' or 'report', not {self.on_error!r}")
        if self.padded not in PADDED_CHOICES:
            raise ArgumentError(f"padded must be one of {', '.join(PADDED_CHOICES)}, not "
                                f"{self.padded!r}")
        if self.file_timeout is not None and not self.file_timeout > 0:
            raise ArgumentError(f"file_timeout must be a positive number of seconds, not "
                                f"{self.file_timeout!r}")


def convert(sources: Named | Iterable[Named], output: str | os.PathLike[str] | Repository,
            spec: CombineSpec, how: BatchRun) -> BatchResult:
    """:func:`batch`, its settings as objects, in its steps: :func:`plan_batch` →
    :func:`scan_planned` → :func:`extend_planned` or :func:`combine_planned` → the output
    written → the report (:func:`save_report`)."""
    if importing_script():
        _unguarded(output, how.work_dir)
    place = Place.of(output, how)
    listed = expand(source_names(sources), how.storage_options)
    if not listed:
        raise ArgumentError("no sources given")
    settings = {"concat_dim": spec.concat_dim, "format": place.format, "padded": how.padded,
                **spec.to_dict(),  # (in the order reports had before the spec)
                **({"data_url": how.data_url} if how.data_url is not None else {})}
    if how.append:
        _appendable(spec, place)
    with place.journal(how.append) as journal:
        planned = plan_batch(listed, journal, spec, how, place, settings)
        failed = scan_planned(planned, journal, spec, how, place)
        if planned.added is not None:  # (append=True: the files named are added, or not)
            return extend_planned(planned, failed, journal, spec, how, place)
        outcome = combine_planned(planned, failed, journal, spec, how, place)
    return outcome if isinstance(outcome, BatchResult) else written(outcome, place, how)


@dataclass(frozen=True)
class Place:
    """Where a batch writes: its output (references at ``target``, or an Icechunk
    ``repository``), their format, the work directory of its records."""

    target: Path
    repository: Repository | None
    format: Format
    work: Path

    @classmethod
    def of(cls, output: str | os.PathLike[str] | Repository, how: BatchRun) -> Place:
        repository = None if isinstance(output, str | os.PathLike) else output
        if repository is not None:
            if how.work_dir is None:
                raise ArgumentError("an Icechunk output needs work_dir= (where the scanned "
                                    "files are recorded)")
            check_icechunk_options(how.format, how.padded)
            target = Path(how.work_dir) / "icechunk"
        elif "://" in os.fspath(cast("str | os.PathLike[str]", output)):
            raise ArgumentError(f"the output {os.fspath(cast('str', output))} must be a local "
                                "path (the sources may be remote)")
        else:
            target = Path(cast("str | os.PathLike[str]", output))
        chosen = how.format or ("json" if target.name.endswith(".json") else "parquet")
        if chosen not in FORMATS:
            raise ArgumentError(f"format must be one of {', '.join(FORMATS)}, not {chosen!r}")
        return cls(target, repository, chosen, cls.work_of(target, how.work_dir))

    @staticmethod
    def work_of(target: Path, work_dir: str | os.PathLike[str] | None) -> Path:
        """Where the scans are recorded: ``work_dir``, by default beside the output."""
        return Path(work_dir) if work_dir is not None else \
            target.with_name(target.name + ".parts")

    @property
    def report(self) -> Path:
        return self.target.with_name(self.target.name + REPORT_SUFFIX)

    @contextlib.contextmanager
    def journal(self, named: bool) -> Iterator[Journal]:
        """The work directory's records: read as needed where the new files are named (an
        append costs what it adds), else whole — and a batch that fails before recording
        any file removes the work directory it made."""
        if named:
            with Journal(self.work, lazy=True) as journal:
                yield journal
            return
        with _leaving_no_empty(self.work), Journal(self.work) as journal:
            yield journal

    def output(self, how: BatchRun, commit: str) -> Output | None:
        """The output as an append sees it (None: an Icechunk session, written whole)."""
        if self.repository is None:
            return ParquetOutput(self.target, self.format, how.padded, how.storage_options)
        if not _is_repository(self.repository):
            return None
        return IcechunkOutput(self.target, self.repository, commit, how.storage_options)


def _commit(spec: CombineSpec, how: BatchRun, files: int | None) -> str:
    """An Icechunk commit's message: the one given, else what it adds."""
    return how.message or (f"refgrid batch: files along {spec.concat_dim!r}" if files is None
                           else f"refgrid batch: {files} files along {spec.concat_dim!r}")


@dataclass(frozen=True)
class BatchPlan:
    """What a batch does, either way it is told its files: the files to scan, what the
    work directory already holds, and — where ``append=True`` names the new files — the
    archive's plan for them (:func:`~refgrid.archive.extend.plan_added`)."""

    listed: dict[str, SourceIdentity | None]
    todo: list[tuple[str, SourceIdentity | None]]
    reused: int
    changed: list[str]
    failed: list[FailedFile]
    """Files whose identity could not be had (they are not scanned)."""
    settings: dict[str, str]
    added: Plan | None = None
    """``append=True``: how the named files join the archive."""
    output: Output | None = None
    """``append=True``: the archive they join."""


def plan_batch(listed: dict[str, SourceIdentity | None], journal: Journal, spec: CombineSpec,
               how: BatchRun, place: Place, settings: dict[str, str]) -> BatchPlan:
    """The first step: which files to scan. Told the new files (``append=True``), the
    archive is asked where they go, and nothing else is listed or checked; else every
    listed file not recorded, recorded otherwise or changed since is scanned again."""
    if not how.append:
        todo, reused, changed, failed = _plan(listed, journal, how.storage_options,
                                              spec.shape.key(spec.merge))
        return BatchPlan(listed, todo, reused, changed, failed, settings)
    output = place.output(how, _commit(spec, how, None))
    assert output is not None  # (a repository or references)
    chosen = plan_added(output, listed, settings, how.storage_options)
    todo = [(url, listed[url]) for url in chosen.new] if chosen.path != "unchanged" else []
    return BatchPlan(listed, todo, len(listed) - len(chosen.new), [], [], settings, chosen,
                     output)


def _appendable(spec: CombineSpec, place: Place) -> None:
    """What ``append=True`` needs before anything is read: an archive that may be appended
    to, its work directory, a repository (not a session)."""
    if spec.whole:
        raise BatchError(f"cannot append to {place.target}: {spec.whole}; {WHOLE}")
    if not place.work.is_dir():
        raise BatchError(f"cannot append to {place.target}: its work directory {place.work} "
                         f"is absent; {WHOLE}")
    if place.repository is not None and not _is_repository(place.repository):
        raise ArgumentError("append=True needs an Icechunk Repository (a Session is "
                            "written whole)")


def scan_planned(planned: BatchPlan, journal: Journal, spec: CombineSpec, how: BatchRun,
                 place: Place) -> list[FailedFile]:
    """The second step: the planned files scanned on dask (each recorded as it ends), and
    those that failed."""
    if not planned.todo:
        return []
    job = ScanJob(spec, how.storage_options, how.allowed_sources,
                  how.file_timeout or current().scan_timeout, str(place.work / TIMED_OUT),
                  how.data_url)
    return _scan(planned.todo, job, journal, Scanning(how.scheduler, how.workers,
                                                      how.on_error, showing(how.progress)))


def extend_planned(planned: BatchPlan, failed: list[FailedFile], journal: Journal,
                   spec: CombineSpec, how: BatchRun, place: Place) -> BatchResult:
    """The named files (``append=True``) appended after the archive's last, or a
    :class:`BatchError` saying why not (the archive left as it was)."""
    chosen, writing = planned.added, planned.output
    assert chosen is not None and writing is not None  # (an append's plan)
    result = BatchResult(writing.target, writing.report, journal.directory,
                         len(planned.listed), 0, planned.reused, settings=planned.settings)
    if chosen.path == "unchanged":
        return save_report(replace(result, update=str(chosen)))
    bad = {f.url for f in failed}
    new = [url for url in chosen.new if url not in bad]
    result = replace(result, scanned=len(new), failed=failed)
    if not new:
        raise BatchError(f"no new file could be scanned ({len(failed)} failed): "
                         f"{failed[0].message}; the archive {writing.target} is as it was")
    try:
        appended = _extend_named(journal, writing, chosen, new, spec, how.storage_options)
    except BatchError:
        raise
    except (RefgridError, NotAppendable) as e:  # (combine's, a scan's: named, with the way)
        raise BatchError(f"cannot append to {writing.target}: {e}; {WHOLE}") from e
    return save_report(replace(result, update=f"{chosen}: {_written(appended)}",
                               snapshot=appended.snapshot,
                               notes=[str(entry) for entry in appended.group.report]))


def combine_planned(planned: BatchPlan, failed: list[FailedFile], journal: Journal,
                    spec: CombineSpec, how: BatchRun, place: Place
                    ) -> BatchResult | Combined:
    """The recorded files brought into the output: appended where the output takes them
    (the result, its report saved), nothing where it holds them already, else combined
    whole (:class:`Combined`, for the output to be written)."""
    failed = [*planned.failed, *failed]
    bad = {f.url for f in failed}
    good = [url for url in planned.listed if url in journal.entries and url not in bad]
    _check_named(spec.shape, journal, good)
    result = BatchResult(place.target, place.report, place.work, len(planned.listed),
                         len(planned.todo) - (len(failed) - len(planned.failed)),
                         planned.reused, planned.changed, failed,
                         len(set(journal.entries) - set(planned.listed)))
    if not good:
        save_report(result)
        shown = "; ".join(f.message for f in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        raise BatchError(f"no file could be scanned ({len(failed)} failed): {shown}{more} "
                         f"(every failure is in {place.report})")
    result = replace(result, settings=planned.settings)
    commit = _commit(spec, how, len(good))
    writing = place.output(how, commit)
    how_now = plan(journal, writing, good, planned.settings) if writing is not None else \
        Plan("rebuild", "an Icechunk session is written whole (a repository is appended to)")
    if how_now.path == "append" and spec.whole:
        how_now = Plan("rebuild", spec.whole)
    try:
        if how_now.path == "append" and writing is not None:
            try:
                appended = extend(journal, writing, how_now, spec,
                                  storage_options=how.storage_options)
            except NotAppendable as e:
                how_now = Plan("rebuild", str(e))
            else:
                return save_report(replace(
                    result, update=f"{how_now}: {_written(appended)}",
                    notes=[str(entry) for entry in appended.group.report],
                    snapshot=appended.snapshot))
        if how_now.path == "unchanged":
            return save_report(replace(result, update=str(how_now)))
        group = _combine(journal, good, spec, how.storage_options, showing(how.progress))
    except RefgridError as e:
        save_report(replace(result, error=str(e)))
        raise
    return Combined(group, replace(result, notes=[str(entry) for entry in group.report],
                                   update=str(how_now)), writing, commit)


@dataclass(frozen=True)
class Combined:
    """The recorded files combined whole, for the output to be written."""

    group: VirtualGroup
    result: BatchResult
    output: Output | None
    commit: str
    """An Icechunk output's commit message."""


def written(combined: Combined, place: Place, how: BatchRun) -> BatchResult:
    """The last steps: the combined files written (references swapped in, or an Icechunk
    commit), and the report beside them."""
    result = combined.result
    if place.repository is not None:
        snapshot = write(combined.group, place.repository, message=combined.commit,
                         storage_options=how.storage_options)
        if isinstance(combined.output, IcechunkOutput):
            combined.output.saved_group(snapshot, combined.group)
        result = replace(result, snapshot=snapshot)
    else:
        saved = save(combined.group, place.target, format=place.format, padded=how.padded,
                     storage_options=how.storage_options)
        if saved.rewrite is not None:
            result = replace(result, rewritten=str(saved.rewrite))
    return save_report(result)


def _written(appended: Appended) -> str:
    return f"{appended.records} record file(s) written" if appended.snapshot is None \
        else "a commit of the new references"


def _check_named(shape: FileShape, journal: Journal, urls: list[str]) -> None:
    """A chosen name none of the files holds is a typo, not a choice (as in combine)."""
    named = [*(shape.variables or ()), *shape.drop_variables]
    if not named or not urls:
        return
    held = {n for url in urls for n in journal.header(url).get("named", [])}
    unknown = [n for n in named if n not in held]
    if unknown:
        raise ArgumentError(f"none of the {len(urls)} files holds "
                            f"{', '.join(map(repr, unknown))}")


def _is_repository(target: object) -> bool:
    """An Icechunk ``Repository`` (appended to), not a ``Session`` (written whole)."""
    icechunk = import_extra("icechunk", "icechunk", "Icechunk output")
    return isinstance(target, icechunk.Repository)


@contextlib.contextmanager
def _leaving_no_empty(work: Path) -> Iterator[None]:
    """A batch that fails before recording any file removes the work directory it made."""
    fresh = not work.exists()
    try:
        yield
    except BaseException:
        records = work / RECORDS
        if fresh and (not records.exists() or records.stat().st_size == 0):
            shutil.rmtree(work, ignore_errors=True)
        raise


def _unguarded(output: object, work_dir: str | os.PathLike[str] | None) -> None:
    """(In a worker importing the script.) Tell the batch why its worker ends, and end."""
    if isinstance(output, str | os.PathLike) and "://" not in os.fspath(output):
        note_unguarded(Place.work_of(Path(output), work_dir) / TIMED_OUT)
    raise BatchError(GUARD)


def _plan(listed: dict[str, SourceIdentity | None], journal: Journal,
          options: dict[str, object], shaped: str
          ) -> tuple[list[tuple[str, SourceIdentity | None]], int, list[str], list[FailedFile]]:
    """Which files to scan (those not recorded, those changed since they were, and those
    recorded with other variables, times or stacking: ``shaped``), how many records are
    reused, what changed, and the files whose identity cannot be had."""
    todo: list[tuple[str, SourceIdentity | None]] = []
    changed, failed = [], []
    reused = 0
    entries = journal.entries
    for url, known in listed.items():
        entry = entries.get(url)
        if entry is None:
            todo.append((url, known))
            continue
        if entry.header.get("shape", "") != shaped:
            changed.append(f"{url}: recorded with other variables, times or stacking")
            todo.append((url, known))
            continue
        if known is not None and known == entry.header["identity"]:
            reused += 1  # (the usual case, 10^5 times for a grown archive's listing)
            continue
        try:
            now = known if known is not None else Source.of(url, options).identity
        except ScanError as e:
            failed.append(FailedFile(url, type(e).__name__, str(e)))
            continue
        difference = identity_difference(entry.header["identity"], now)
        if difference:
            changed.append(f"{url}: {difference}")
            todo.append((url, now))
        else:
            reused += 1
    return todo, reused, changed, failed


@dataclass(frozen=True)
class Scanning:
    """How a batch scans: where (``scheduler``, ``workers``), what a failure does, and
    whether a progress bar shows."""

    scheduler: str | Untyped | None
    workers: int | None
    on_error: str
    show: bool


def _scan(todo: list[tuple[str, SourceIdentity | None]], job: ScanJob, journal: Journal,
          how: Scanning) -> list[FailedFile]:
    failed: list[FailedFile] = []
    on_error = how.on_error
    bar = progress_bar(len(todo), "scanning", "file", how.show)

    def on_result(outcomes: list[Scanned | Failed]) -> None:
        for outcome in outcomes:  # every scanned file of the task is recorded, then a raise
            if isinstance(outcome, Scanned):
                journal.append(outcome.header, outcome.record)
            else:
                failed.append(FailedFile(outcome.url, outcome.error, outcome.message))
        if on_error == "raise" and failed:
            raise ScanError(failed[0].url, None, f"{failed[0].error}: {failed[0].message}")
        bar.update(len(outcomes))
        if failed:
            bar.set_postfix(failed=len(failed), refresh=False)

    try:
        run(todo, job, on_result, scheduler=how.scheduler, workers=how.workers)
    finally:
        bar.close()
    return failed


def _extend_named(journal: Journal, writing: Output, chosen: Plan, new: list[str],
                  spec: CombineSpec, options: dict[str, object]) -> Appended:
    """Append the scanned files ``new`` after the archive's last, once its first and last
    files are as the archive and the work directory recorded them."""
    for url in chosen.old:  # (what the append re-reads: its first and last files)
        try:
            recorded = journal.header(url)["identity"]
        except KeyError:
            raise BatchError(f"the work directory {journal.directory} has no record of the "
                             f"archive's file {url}; {WHOLE}") from None
        now = Source.of(url, options).identity
        difference = changed(chosen.sources.get(url), now) or changed(recorded, now)
        if difference:
            raise BatchError(f"the archive's file {url} changed since it was written or "
                             f"recorded ({difference}); {WHOLE}")
    ordered = after_last(journal, chosen.old[-1], new)
    if isinstance(ordered, str):
        raise BatchError(f"{ordered}; {WHOLE}")
    return extend(journal, writing, replace(chosen, new=tuple(ordered[1:])), spec,
                  storage_options=options)


def _combine(journal: Journal, urls: list[str], spec: CombineSpec,
             options: dict[str, object], show: bool) -> VirtualGroup:
    bar = progress_bar(len(urls), "combining", "file", show)
    try:
        return combine_records(journal, urls, spec, storage_options=options,
                               advance=bar.update)
    finally:
        bar.close()


def save_report(result: BatchResult) -> BatchResult:
    """The report beside the output, written atomically (and the result, to return)."""
    path = result.report_path
    document = {**asdict(result), "output": str(result.output), "report_path": str(path),
                "work_dir": str(result.work_dir)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(path)
        write_file(path, json.dumps(document, indent=1).encode())
    except OSError as e:
        raise BatchError(f"cannot write the batch report {path}: {e}") from e
    return result


__all__ = ["BatchResult", "BatchRun", "FailedFile", "batch", "convert"]
