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
    NotAppendable,
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
from refgrid.combining import check_policies
from refgrid.combining.shaping import FileShape
from refgrid.core.bounds import current
from refgrid.core.inputs import expand
from refgrid.core.keys import REPORT_SUFFIX
from refgrid.core.sources import SourceIdentity, identity_difference
from refgrid.core.tasks import progress_bar, showing
from refgrid.core.typed import StorageOptions, Untyped
from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError, BatchError, RefgridError, ScanError
from refgrid.scanners.source import Source
from refgrid.writers import (
    DEFAULT_PADDED,
    PADDED_CHOICES,
    Padded,
    check_icechunk_options,
    save,
    write,
)
from refgrid.writers.atomic import clean_leftovers, replace_file, temporary_for
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
    sources: str | Iterable[str],
    output: str | os.PathLike[str] | Repository,
    *,
    concat_dim: str = "time",
    scheduler: str | Untyped | None = None,
    workers: int | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    on_error: Literal["raise", "report"] = "report",
    progress: bool | None = None,
    overlap: Literal["error", "allow"] = "error",
    codecs: Literal["error", "recode"] = "error",
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

    ``sources``: paths, URLs, glob patterns (local or remote, e.g. ``s3://b/era5/*.nc``) and
    ``@FILE`` lists (one source per line). ``output``: parquet references, or JSON when the
    name ends in ``.json`` (``format`` overrides). Scans run on dask: by default in one
    process per core (``workers``) on this machine; ``scheduler`` may be a scheduler address
    (``"tcp://HOST:8786"``) or a ``distributed.Client`` — the workers then open the sources.

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
    if on_error not in ("raise", "report"):
        raise ArgumentError(f"on_error must be 'raise' or 'report', not {on_error!r}")
    repository = None if isinstance(output, str | os.PathLike) else output
    path = cast("str | os.PathLike[str]", output)  # where repository is None
    if importing_script():
        _unguarded(output, work_dir)
    if repository is not None:
        if work_dir is None:
            raise ArgumentError("an Icechunk output needs work_dir= (where the scanned files "
                                "are recorded)")
        check_icechunk_options(format, padded)
        target = Path(work_dir) / "icechunk"
    elif "://" in os.fspath(path):
        raise ArgumentError(f"the output {os.fspath(path)} must be a local path (the "
                            "sources may be remote)")
    else:
        target = Path(path)
    chosen = format or ("json" if target.name.endswith(".json") else "parquet")
    if chosen not in FORMATS:
        raise ArgumentError(f"format must be one of {', '.join(FORMATS)}, not {chosen!r}")
    if padded not in PADDED_CHOICES:
        raise ArgumentError(f"padded must be one of {', '.join(PADDED_CHOICES)}, not "
                            f"{padded!r}")
    options = dict(storage_options or {})
    listed = expand([sources] if isinstance(sources, str) else list(sources), options)
    if not listed:
        raise ArgumentError("no sources given")
    if file_timeout is not None and not file_timeout > 0:
        raise ArgumentError(f"file_timeout must be a positive number of seconds, not "
                            f"{file_timeout!r}")
    show = showing(progress)
    work = Path(work_dir) if work_dir is not None else target.with_name(target.name + ".parts")
    check_policies({"overlap": overlap, "codecs": codecs, "missing": missing})
    shape = FileShape.of(variables, drop_variables, time_from, time_units, calendar,
                         stack_dim, stack_by)
    settings = {"concat_dim": concat_dim, "format": chosen, "padded": padded,
                "overlap": overlap, "codecs": codecs, "missing": missing,
                "merge": str(merge).lower(), **shape.settings,
                **({"data_url": data_url} if data_url is not None else {})}
    policies = Policies(concat_dim, overlap, codecs, missing, merge, stack_dim)
    job = ScanJob(concat_dim, options, allowed_sources, file_timeout or current().scan_timeout,
                  str(work / TIMED_OUT), shape, merge, data_url)
    if append:
        if policies.whole:
            raise BatchError(f"cannot append to {target}: {policies.whole}; {WHOLE}")
        commit = message or f"refgrid batch: files along {concat_dim!r}"
        if not work.is_dir():
            raise BatchError(f"cannot append to {target}: its work directory {work} is "
                             f"absent; {WHOLE}")
        if repository is not None and not _is_repository(repository):
            raise ArgumentError("append=True needs an Icechunk Repository (a Session is "
                                "written whole)")
        with Journal(work, lazy=True) as journal:
            added: Output = ParquetOutput(target, chosen, padded, options) if repository is None \
                else IcechunkOutput(target, repository, commit, options)
            return _append_named(listed, journal, added, job, settings, Scanning(
                scheduler, workers, on_error, show), policies, options)
    with _leaving_no_empty(work), Journal(work) as journal:
        todo, reused, changed, failed = _plan(listed, journal, options,
                                              shape.key(merge))
        failed_now = _scan(todo, job, journal, Scanning(scheduler, workers, on_error, show))
        failed += failed_now
        bad = {f.url for f in failed}
        good = [url for url in listed if url in journal.entries and url not in bad]
        _check_named(shape, journal, good)
        dropped = len(set(journal.entries) - set(listed))
        report = target.with_name(target.name + REPORT_SUFFIX)
        result = BatchResult(target, report, work, len(listed), len(todo) - len(failed_now),
                             reused, changed, failed, dropped)
        if not good:
            _save(result)
            shown = "; ".join(f.message for f in failed[:3])
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            raise BatchError(f"no file could be scanned ({len(failed)} failed): {shown}{more} "
                             f"(every failure is in {report})")
        result = replace(result, settings=settings)
        commit = message or f"refgrid batch: {len(good)} files along {concat_dim!r}"
        writing = ParquetOutput(target, chosen, padded, options) if repository is None else \
            IcechunkOutput(target, repository, commit, options) \
            if _is_repository(repository) else None
        how = plan(journal, writing, good, settings) if writing is not None else \
            Plan("rebuild", "an Icechunk session is written whole (a repository is appended "
                 "to)")
        if how.path == "append" and policies.whole:
            how = Plan("rebuild", policies.whole)
        try:
            if how.path == "append" and writing is not None:
                try:
                    appended = extend(journal, writing, how, concat_dim, overlap=overlap,
                                      codecs=codecs, missing=missing,
                                      storage_options=options)
                except NotAppendable as e:
                    how = Plan("rebuild", str(e))
                else:
                    written = f"{appended.records} record file(s) written" if \
                        appended.snapshot is None else "a commit of the new references"
                    result = replace(result, update=f"{how}: {written}", notes=[
                        str(entry) for entry in appended.group.report],
                        snapshot=appended.snapshot)
                    _save(result)
                    return result
            if how.path == "unchanged":
                result = replace(result, update=str(how))
                _save(result)
                return result
            group = _combine(journal, good, policies, options, show)
        except RefgridError as e:
            _save(replace(result, error=str(e)))
            raise
    result = replace(result, notes=[str(entry) for entry in group.report], update=str(how))
    if repository is not None:
        snapshot = write(group, repository, message=commit, storage_options=options)
        if isinstance(writing, IcechunkOutput):
            writing.saved_group(snapshot, group)
        result = replace(result, snapshot=snapshot)
    else:
        saved = save(group, target, format=chosen, padded=padded, storage_options=options)
        if saved.rewrite is not None:
            result = replace(result, rewritten=str(saved.rewrite))
    _save(result)
    return result


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
        target = Path(output)
        work = Path(work_dir) if work_dir is not None else \
            target.with_name(target.name + ".parts")
        note_unguarded(work / TIMED_OUT)
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
class Policies:
    """How a batch's recorded files are combined (:func:`refgrid.combine`'s policies)."""

    concat_dim: str
    overlap: Literal["error", "allow"]
    codecs: Literal["error", "recode"]
    missing: Literal["error", "fill"]
    merge: bool
    stack_dim: str | None

    @property
    def whole(self) -> str | None:
        """Why a grown archive is written whole (None: it may be appended to)."""
        if self.merge or self.stack_dim is not None:
            return "a merged or stacked archive is written whole when it grows (its file " \
                   "sets or members are combined apart, then joined)"
        return None


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


def _append_named(listed: dict[str, SourceIdentity | None], journal: Journal,
                  writing: Output, job: ScanJob, settings: dict[str, str], how: Scanning,
                  policies: Policies, options: dict[str, object]) -> BatchResult:
    """A batch told which files are new (``append=True``): see :func:`batch`."""
    chosen = plan_added(writing, listed, settings, options)
    report = writing.report
    result = BatchResult(writing.target, report, journal.directory, len(listed), 0,
                         len(listed) - len(chosen.new), settings=settings)
    if chosen.path == "unchanged":
        result = replace(result, update=str(chosen))
        _save(result)
        return result
    failed = _scan([(url, listed[url]) for url in chosen.new], job, journal, how)
    bad = {f.url for f in failed}
    new = [url for url in chosen.new if url not in bad]
    result = replace(result, scanned=len(new), failed=failed)
    if not new:
        raise BatchError(f"no new file could be scanned ({len(failed)} failed): "
                         f"{failed[0].message}; the archive {writing.target} is as it was")
    try:
        appended = _extend_named(journal, writing, chosen, new, policies, options)
    except BatchError:
        raise
    except (RefgridError, NotAppendable) as e:  # (combine's, a scan's: named, with the way)
        raise BatchError(f"cannot append to {writing.target}: {e}; {WHOLE}") from e
    written = f"{appended.records} record file(s) written" if appended.snapshot is None \
        else "a commit of the new references"
    result = replace(result, update=f"{chosen}: {written}", snapshot=appended.snapshot,
                     notes=[str(entry) for entry in appended.group.report])
    _save(result)
    return result


def _extend_named(journal: Journal, writing: Output, chosen: Plan, new: list[str],
                  policies: Policies, options: dict[str, object]) -> Appended:
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
    return extend(journal, writing, replace(chosen, new=tuple(ordered[1:])),
                  policies.concat_dim, overlap=policies.overlap, codecs=policies.codecs,
                  missing=policies.missing, storage_options=options)


def _combine(journal: Journal, urls: list[str], policies: Policies,
             options: dict[str, object], show: bool) -> VirtualGroup:
    bar = progress_bar(len(urls), "combining", "file", show)
    try:
        return combine_records(journal, urls, policies.concat_dim, overlap=policies.overlap,
                               codecs=policies.codecs, missing=policies.missing,
                               merge=policies.merge, stack_dim=policies.stack_dim,
                               storage_options=options, advance=bar.update)
    finally:
        bar.close()


def _save(result: BatchResult) -> None:
    """The report beside the output, written atomically."""
    path = result.report_path
    document = {**asdict(result), "output": str(result.output), "report_path": str(path),
                "work_dir": str(result.work_dir)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(path)
        temporary = temporary_for(path)
        try:
            temporary.write_text(json.dumps(document, indent=1), encoding="utf-8")
            replace_file(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    except OSError as e:
        raise BatchError(f"cannot write the batch report {path}: {e}") from e


__all__ = ["BatchResult", "FailedFile", "batch"]
