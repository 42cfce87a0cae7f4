"""The ``refgrid`` command line."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from refgrid.errors import ArgumentError, DirectoryError, RefgridError, ScanError

if TYPE_CHECKING:
    from icechunk import Repository

    from refgrid.combining.spec import CombineSpec
    from refgrid.core.formats import InputFormat
    from refgrid.model.virtual import VirtualGroup
    from refgrid.scanners import OnError
    from refgrid.writers import Padded, Saved
    from refgrid.writers.references import Format


def _storage_options(pairs: tuple[str, ...]) -> dict[str, object]:
    """``KEY=VALUE`` pairs: each value parsed as JSON where it is JSON, else the text."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--storage-option")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


allow_source = click.option(
    "--allow-source", "allowed", multiple=True, metavar="PREFIX",
    help="Path or URL prefix the files named by input references must lie under "
         "(repeatable; default for remote references: their own host or bucket).")
timeout_option = click.option(
    "--timeout", type=float, default=None, metavar="SECONDS",
    help="Give up on a file whose scan takes longer (run in a child process; default: "
         "REFGRID_SCAN_TIMEOUT or 600).")
storage_option = click.option(
    "--storage-option", "-s", "storage", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option for remote URLs (repeatable; values parsed as JSON when they "
         "are JSON), e.g. -s anon=true -s endpoint_url=http://127.0.0.1:9000")


CLI_WORDS = (
    (re.compile(r"pass overlap='allow'"), "pass --allow-overlap"),
    (re.compile(r"pass others='stack'"), "pass --stack-others"),
    (re.compile(r"pass codecs='recode'"), "pass --recode"),
    (re.compile(r"pass allowed_sources=\[\.\.\.\], or --allow-source PREFIX on the command line"),
     "pass --allow-source PREFIX"),
    (re.compile(r"refgrid\.set_limits\((\w+)=\.\.\.\)"),
     lambda m: f"REFGRID_{m.group(1).upper()}=... in the environment"),
)
"""What the Python API's messages say, as the command line says it (one table: each
message is written once, for Python, and translated here)."""


def cli_words(message: str) -> str:
    for pattern, words in CLI_WORDS:
        message = pattern.sub(words, message)
    return message


class _Commands(click.Group):
    """Every failure is one line on stderr and exit status 1 (``--debug``: the traceback)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:
            if ctx.params.get("debug"):
                raise
            if isinstance(e, RefgridError):
                raise click.ClickException(cli_words(str(e))) from e
            raise click.ClickException(f"{type(e).__name__}: {e} (run with --debug for the "
                                       "traceback)") from e


def _directory_hint(error: DirectoryError, command: str, output: Path) -> click.ClickException:
    """A directory given as a source: the same command, with the pattern of its files."""
    return click.ClickException(f"{error.directory} is a directory of {error.what}: to "
                                f"{command} its files, name them with a pattern: refgrid "
                                f"{command} '{error.pattern}' -o {output}")


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.version_option(package_name="refgrid")
def main(debug: bool) -> None:
    """Virtual Zarr datasets over HDF5 / NetCDF archives, irregular lengths included."""


format_option = click.option(
    "--format", "format_", type=click.Choice(["json", "parquet", "kerchunk-v2"]), default=None,
    help="json: kerchunk JSON with Zarr v3 documents; parquet: columnar records for large "
         "archives (default for names ending in .parq); kerchunk-v2: classic kerchunk with "
         "Zarr v2 keys, for readers without Zarr v3 (regular grids only; parquet for .parq).")
padded_option = click.option(
    "--padded", type=click.Choice(["rewrite", "encoded"]), default="rewrite", show_default=True,
    help="rewrite: copy the chunks padded inside the array cropped, inline or into "
         "OUTPUT.chunks/, so every rectilinear Zarr reader (zarr >= 3.2, Icechunk) reads "
         "them; encoded: copy nothing and describe them with encoded_chunk_shapes, which "
         "only refgrid reads.")


def _names(values: tuple[str, ...]) -> list[str] | None:
    """``--variables a,b --variables c`` → ``["a", "b", "c"]`` (None: not given)."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return names or None


NAME_OPTIONS = [
    click.option("--variables", multiple=True, metavar="NAME[,NAME...]",
                 help="Keep only these variables (paths such as sub/tas), with their "
                      "coordinates, bounds and grid mappings."),
    click.option("--drop-variables", multiple=True, metavar="NAME[,NAME...]",
                 help="Leave these variables (or groups) out, unscanned, before files are "
                      "compared."),
]
"""The variables chosen, as ``scan`` and the combine options take them."""


def choosing_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--variables`` / ``--drop-variables``, passed on as ``choice`` (``scan``)."""

    @functools.wraps(command)
    def run(variables: tuple[str, ...], drop_variables: tuple[str, ...],
            **kwargs: Any) -> None:
        command(choice={"variables": _names(variables),
                        "drop_variables": _names(drop_variables)}, **kwargs)

    for option in reversed(NAME_OPTIONS):
        run = option(run)
    return run


def combine_options(others: bool = False) -> Callable[[Callable[..., None]],
                                                      Callable[..., None]]:
    """How files are combined — ``--concat-dim``, the policies, merging, stacking, filling,
    times from names and the variables chosen — passed on as one
    :class:`~refgrid.combining.spec.CombineSpec` (``spec``): what ``combine``, ``batch`` and
    ``serve --follow`` take alike (``others``: ``--stack-others``, which a combine has)."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def run(concat_dim: str, allow_overlap: bool, recode: bool, strict_storage: bool,
                missing: str,
                merge: bool, stack_dim: str | None, stack_by: str | None,
                time_from: str | None, time_units: str | None, calendar: str | None,
                variables: tuple[str, ...], drop_variables: tuple[str, ...],
                stack_others: bool = False, **kwargs: Any) -> None:
            from refgrid.combining.spec import CombineSpec

            if recode and strict_storage:
                raise click.UsageError("--recode and --strict-storage exclude each other")
            spec = CombineSpec.of(
                concat_dim, overlap="allow" if allow_overlap else "error",
                others="stack" if stack_others else "identical",
                codecs="recode" if recode else "error" if strict_storage else "segments",
                missing=missing, merge=merge,
                variables=_names(variables), drop_variables=_names(drop_variables),
                stack_dim=stack_dim, stack_by=stack_by, time_from=time_from,
                time_units=time_units, calendar=calendar)
            command(spec=spec, **kwargs)

        options = [
            click.option("--concat-dim", default="time", show_default=True,
                         help="Dimension to concatenate along."),
            click.option("--allow-overlap", is_flag=True,
                         help="Keep files whose concat coordinates overlap instead of "
                              "failing."),
            *([click.option("--stack-others", is_flag=True,
                            help="Keep variables without the concat dimension per file (new "
                                 "dimension 'file') instead of requiring them identical.")]
              if others else []),
            click.option("--recode", is_flag=True,
                         help="Re-encode (and inline) the chunks of files whose codecs differ "
                              "from the first file's: a uniform copy, instead of segments. "
                              "Copies their data."),
            click.option("--strict-storage", is_flag=True,
                         help="Refuse files that store a variable in other ways (type, "
                              "codecs, packing) instead of joining them in segments, each "
                              "read by its own encoding."),
            click.option("--missing", type=click.Choice(["error", "fill"]), default="error",
                         show_default=True,
                         help="A variable absent from some files, or a member or file set "
                              "without files for some times: an error, or read as its fill "
                              "value there, as xarray's outer join (no data copied; the "
                              "report names them)."),
            click.option("--merge", is_flag=True,
                         help="Files hold different variables (tas_*.nc, pr_*.nc): combine "
                              "each file set with its own chunks, then merge the sets."),
            click.option("--stack-dim", default=None, metavar="NAME",
                         help="Stack the files along this new dimension (with --stack-by)."),
            click.option("--stack-by", default=None, metavar="PATTERN|attribute:NAME",
                         help="Each file's value along --stack-dim: a file-name pattern "
                              "('{member}/tas_*.nc', 'run{n:d}.nc', 'exp_%Y%m.nc') or a global "
                              "attribute ('attribute:realization')."),
            click.option("--time-from", default=None, metavar="PATTERN",
                         help="Files without a time coordinate take it from their name "
                              "('sst_%Y%m%d.nc'); a file's own time is kept, and must fall in "
                              "the period its name gives (sst_20030102.nc: that day)."),
            click.option("--time-units", default=None, metavar="UNITS",
                         help="Units of times from names (default: days since 1970-01-01)."),
            click.option("--calendar", default=None,
                         help="Calendar of times from names (default: standard)."),
            *NAME_OPTIONS,
        ]
        for option in reversed(options):
            run = option(run)
        return run

    return decorate


def _echo_rewrite(saved: Saved) -> None:
    if saved.rewrite is not None:
        click.echo(f"  {saved.rewrite}")


def format_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options one input format takes (DMR++'s ``--data-url``), declared by its row of
    the formats' table and passed on as ``formats``: keywords of ``refgrid.scan`` and
    ``refgrid.batch``."""
    from refgrid.core.formats import format_options as declared

    options = declared()

    @functools.wraps(command)
    def run(**kwargs: Any) -> None:
        command(formats={o.keyword: kwargs.pop(o.keyword) for o in options}, **kwargs)

    for option in reversed(options):
        run = click.option(option.flag, option.keyword, default=None, metavar=option.metavar,
                           help=option.help)(run)
    return run


class ListingFormats(click.Command):
    """A command whose help names the input formats as the formats' table holds them when it
    is shown: ``{inputs}`` (every one), ``{served}`` (those ``refgrid serve`` serves) and
    ``{served_suffixes}``."""

    @property
    def help(self) -> str | None:
        from refgrid.core.formats import FORMATS, served, suffixes

        return None if self.template is None else self.template.format(
            inputs=_listed(FORMATS), served=_listed(served()),
            served_suffixes="/".join(suffixes(served())))

    @help.setter
    def help(self, text: str | None) -> None:
        self.template = text


def _listed(rows: Sequence[InputFormat]) -> str:
    titles = [row.title for row in rows]
    return ", ".join(titles[:-1]) + f" or {titles[-1]}" if len(titles) > 1 else titles[0]


@main.command(cls=ListingFormats)
@click.argument("source")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Where to write the references: kerchunk JSON, or a parquet directory when "
                   "the name ends in .parq (large archives: opens without parsing every key).")
@click.option("--report", "show_report", is_flag=True,
              help="Print what could not be expressed as plain references.")
@click.option("--on-error", type=click.Choice(["raise", "report"]), default="raise",
              show_default=True, help="Stop at a variable that cannot be scanned, or record it "
                                      "in the report and go on.")
@click.option("--inline-threshold", type=int, default=0, show_default=True,
              help="Inline chunks stored in fewer bytes than this.")
@format_option
@choosing_options
@format_options
@allow_source
@timeout_option
@storage_option
def scan(source: str, output: Path, show_report: bool, on_error: OnError, inline_threshold: int,
         format_: Format | None, choice: dict[str, list[str] | None], formats: dict[str, Any],
         allowed: tuple[str, ...], timeout: float | None, storage: tuple[str, ...]) -> None:
    """Scan one input (a local path or an fsspec URL) into references: {inputs}.

    \b
    Examples:
      refgrid scan data/tas_200101.nc -o tas.json
      refgrid scan s3://bucket/tas.nc -o tas.json -s anon=true --report
      refgrid scan data/tas_200101.nc -o tas_v2.json --format kerchunk-v2
      refgrid scan granule.h5 -o g.json --drop-variables Projection
      refgrid scan MOD021KM.hdf.dmrpp -o modis.json      # HDF4 through its DMR++
    """
    import refgrid

    [group] = _scan([source], timeout, on_error=on_error, inline_threshold=inline_threshold,
                    allowed_sources=list(allowed) or None, **formats, **choice,
                    **_storage_options(storage))
    refgrid.write(group, output, format=format_)
    arrays = sum(1 for _, node in group.walk() if isinstance(node, refgrid.VirtualArray))
    click.echo(f"wrote {output} ({arrays} arrays, {len(group.report)} report entries)")
    if show_report:
        from refgrid.core.reprs import report_lines

        for line in report_lines(group.report):
            click.echo(f"  {line}")


@main.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Where to write the references: kerchunk JSON, or a parquet directory when "
                   "the name ends in .parq (large archives: opens without parsing every key).")
@click.option("--report", "show_report", is_flag=True,
              help="Print scan notes and attribute conflicts.")
@format_option
@padded_option
@combine_options(others=True)
@allow_source
@timeout_option
@storage_option
def combine(sources: tuple[str, ...], output: Path, show_report: bool, format_: Format | None,
            padded: Padded, spec: CombineSpec, allowed: tuple[str, ...],
            timeout: float | None, storage: tuple[str, ...]) -> None:
    """Scan files (paths or URLs) and combine them along a dimension of irregular length —
    merging file sets of other variables, stacking along a new dimension, choosing
    variables, filling variables that come and go, taking times from file names.

    \b
    Examples:
      refgrid combine data/tas_2001*.nc --concat-dim time -o tas_2001.json
      refgrid combine 'data/tas_*.nc' -o tas.parq
      refgrid combine s3://bucket/tas_*.nc -o tas.json -s anon=true
      refgrid combine @files.txt -o tas.json        # one path or URL per line
      refgrid combine 'data/tas_*.nc' -o tas.json --padded encoded   # copy nothing
      refgrid combine 'cmip/*/tas_*.nc' 'cmip/*/pr_*.nc' -o cmip.json --merge \\
          --stack-dim member --stack-by '{member}/*.nc'
      refgrid combine 'sst/sst_*.nc' -o sst.json --time-from 'sst_%Y%m%d.nc' --missing fill
      refgrid combine 'granules/*.h5' -o g.json --drop-variables Projection
    """
    from refgrid.combining import combine_with
    from refgrid.core.inputs import expand_counting
    from refgrid.writers import save

    options = _storage_options(storage)
    try:
        found, twice = expand_counting(sources, options)
    except DirectoryError as e:
        raise _directory_hint(e, "combine", output) from e
    for url, times in twice.items():
        click.echo(f"note: {url} is named {times} times: combined once")
    groups = _scan(list(found), timeout, allowed_sources=list(allowed) or None,
                   dropped=spec.shape.drop_variables, **options)
    group = combine_with(groups, spec, sources=list(found), storage_options=options)
    saved = save(group, output, format=format_, padded=padded, storage_options=options)
    click.echo(f"combined {len(groups)} files along {spec.concat_dim!r} -> {output}")
    _echo_rewrite(saved)
    if show_report:
        from refgrid.core.reprs import report_lines

        for line in report_lines(group.report):
            click.echo(f"  {line}")


def _scan(sources: list[str], timeout: float | None, **kwargs: object) -> list[VirtualGroup]:
    """``refgrid.scan`` of each source in worker processes, each scan stopped after
    ``timeout`` seconds: a damaged HDF5 file can make libhdf5 loop forever, and only a
    process can be stopped. Files are scanned in parallel, results kept in order."""
    import multiprocessing

    from refgrid.core.bounds import current

    limit = current().scan_timeout if timeout is None else timeout
    workers = max(1, min(len(sources), os.cpu_count() or 1, 8))
    failures: list[RefgridError] = []
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending = [(s, pool.apply_async(_scan_here, (s, kwargs))) for s in sources]
        groups: list[VirtualGroup] = []
        for source, result in pending:
            try:
                outcome, value = result.get(limit)
            except multiprocessing.TimeoutError:
                outcome, value = "error", ScanError(
                    source, None, f"the scan took longer than {limit:g} s and was stopped "
                    "(--timeout raises the limit)")
            if outcome == "error":
                failures.append(cast(RefgridError, value))
            else:
                groups.append(cast("VirtualGroup", value))
    if len(failures) == 1 and len(sources) == 1:
        raise failures[0]
    if failures:  # every one, as batch lists them
        raise click.ClickException(
            f"{len(failures)} of {len(sources)} files cannot be scanned:\n  "
            + "\n  ".join(cli_words(str(e)) for e in failures))
    return groups


def _scan_here(source: str, kwargs: dict[str, object]
               ) -> tuple[str, VirtualGroup | RefgridError]:
    """One scan: ``refgrid.scan(source, **kwargs)`` — or, given ``dropped`` (a combine's
    ``--drop-variables``), those left unscanned and noted, for the combine to check the names
    against every file and take them off."""
    import refgrid
    from refgrid.scanners import ScanOptions, scan_with

    try:  # scan's keywords and storage options: checked by scan, not by mypy
        if "dropped" in kwargs:
            options = dict(kwargs)
            dropped = cast("tuple[str, ...]", options.pop("dropped"))
            allowed = cast("list[str] | None", options.pop("allowed_sources", None))
            return "ok", scan_with(source, ScanOptions(dropped=dropped), allowed, options)
        return "ok", refgrid.scan(source, **cast("dict[str, Any]", kwargs))
    except RefgridError as e:
        return "error", e


@main.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Where to write the references: parquet (default), or JSON when the name "
                   "ends in .json.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Run the scans on a dask.distributed cluster (e.g. tcp://10.0.0.5:8786); "
                   "default: one process per core on this machine.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Local worker processes (default: one per core).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where each scanned file is recorded, to resume and append "
                   "(default: OUTPUT.parts).")
@click.option("--on-error", type=click.Choice(["raise", "report"]), default="report",
              show_default=True, help="Stop at the first file that cannot be scanned, or list "
                                      "it in the report and combine the others.")
@click.option("--allow-failures", is_flag=True,
              help="Exit with status 0 even when some files could not be scanned.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--file-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Stop a file's scan after this long (a stalled server, "
                                      "a hung library) and record it as failed "
                                      "(default: 600, or REFGRID_SCAN_TIMEOUT).")
@format_option
@padded_option
@click.option("--icechunk", "to_icechunk", is_flag=True,
              help="OUTPUT is a local Icechunk repository (created when absent): commit the "
                   "archive to its main branch; rerun to append new files as a new commit.")
@click.option("-m", "--message", default=None, help="The Icechunk commit message.")
@click.option("--append", "append", is_flag=True,
              help="SOURCES name new files to add after the archive's last (a file that just "
                   "landed): the archive's other files are neither listed nor checked, so "
                   "the run costs what it adds. Backfill, changed files or an archive not "
                   "yet written are refused: run without --append.")
@combine_options()
@format_options
@allow_source
@storage_option
def batch(sources: tuple[str, ...], output: Path, scheduler: str | None,
          workers: int | None, work_dir: Path | None, on_error: str, allow_failures: bool,
          quiet: bool, file_timeout: float | None, format_: Format | None, padded: Padded,
          to_icechunk: bool, message: str | None, append: bool, spec: CombineSpec,
          formats: dict[str, Any], allowed: tuple[str, ...], storage: tuple[str, ...]) -> None:
    """Convert a whole archive: scan every file on dask, combine, write references.

    SOURCES are paths, URLs, glob patterns (quoted: expanded by refgrid, remote ones too)
    and @FILE lists (one source per line). Each scanned file is recorded in the work
    directory: run the same command again to resume a killed batch or to add new files;
    only files not yet recorded (or changed since) are scanned.

    \b
    Examples:
      refgrid batch 'data/tas_*.nc' -o tas.parq
      refgrid batch 's3://bucket/era5/*.nc' -o era5.parq -s anon=true
      refgrid batch @files.txt -o tas.json --scheduler tcp://10.0.0.5:8786
      refgrid batch 'data/tas_*.nc' -o tas.icechunk --icechunk -m "2001 added"
      refgrid batch data/tas_20261125.nc -o tas.parq --append
      refgrid batch 'cmip/*/*.nc' -o cmip.parq --merge --stack-dim member \\
          --stack-by '{member}/*.nc'
      refgrid batch 's3://docs/*.dmrpp' -o granules.parq \\
          --data-url 's3://granules/{name}'        # DMR++: no granule is read
    """
    from refgrid.archive import BatchRun, convert
    from refgrid.core.util import import_extra

    import_extra("dask", "batch", "refgrid batch")  # before any repository is created
    target: Path | Repository = output
    try:
        if to_icechunk:
            from refgrid.core.inputs import expand
            from refgrid.writers.icechunk import local_repository

            target = local_repository(output, expand(list(sources), _storage_options(storage)),
                                      echo=click.echo)
            work_dir = work_dir or output.with_name(output.name + ".parts")
        result = convert(list(sources), target, spec, BatchRun(
            scheduler, workers, work_dir, "raise" if on_error == "raise" else "report",
            False if quiet else None, format_, padded, message, list(allowed) or None,
            _storage_options(storage), file_timeout, append, **formats))
    except DirectoryError as e:
        raise _directory_hint(e, "batch", output) from e
    click.echo(f"{result.files} files: {result.scanned} scanned, {result.reused} reused, "
               f"{len(result.failed)} failed (records in {result.work_dir})")
    for change in result.changed:
        click.echo(f"  rescanned, changed since recorded: {change}")
    if result.dropped:
        click.echo(f"  {result.dropped} recorded files are no longer among the sources (left "
                   "out)")
    if result.snapshot is not None:
        click.echo(f"committed snapshot {result.snapshot} to {output} (report: "
                   f"{result.report_path})")
    else:
        click.echo(f"wrote {result.output} (report: {result.report_path})")
    if result.update:
        click.echo(f"  {result.update}")
    if result.rewritten:
        click.echo(f"  {result.rewritten}")
    if result.failed:
        for failure in result.failed:
            click.echo(f"  failed: {failure.message}", err=True)
        if not allow_failures:
            raise click.ClickException(f"{len(result.failed)} of {result.files} files could "
                                       "not be scanned (--allow-failures exits 0)")


@main.command()
@click.argument("source")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@allow_source
@storage_option
def inspect(source: str, as_json: bool, allowed: tuple[str, ...],
            storage: tuple[str, ...]) -> None:
    """Summarise references (or any input refgrid reads): arrays, dims, chunk grids, padded
    and missing chunks, bytes referenced and inlined, source files.

    \b
    Example:
      refgrid inspect demo-output/tas_2001.json
      refgrid inspect refs.parq --json | jq '.arrays.tas.chunks'
    """
    from refgrid.core.reprs import group_summary, group_text
    from refgrid.explore.axes import time_ranges
    from refgrid.scanners import scan as scan_input

    options = _storage_options(storage)
    group = scan_input(source, allowed_sources=allowed or None,
                       **cast("dict[str, Any]", options))  # checked by scan, not by mypy
    spans = time_ranges(group, options)
    if as_json:
        click.echo(json.dumps({**group_summary(group), "time_ranges": spans}, indent=1))
        return
    click.echo(group_text(group))
    for path, span in spans.items():
        click.echo(f"  {path}: {span['first']} to {span['last']} ({span['steps']:,} steps)")


@main.command()
@click.argument("source")
@click.option("--size", default="10MiB", show_default=True, help="Chunk size aimed at.")
@click.option("--access", multiple=True, metavar="DIM[,DIM...]=WEIGHT",
              help="An access pattern and its weight (repeatable), e.g. --access time=1 "
                   "--access lat,lon=2 (default: time series and maps, equally).")
@click.option("--variable", default=None, help="The array (default: the largest).")
@click.option("--method", type=click.Choice(["general", "balanced-3d"]), default="general",
              show_default=True)
@click.option("--partial-fraction", default=0.5, show_default=True, type=float,
              help="The smallest edge chunk allowed, as a fraction of a chunk.")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
def advise(source: str, size: str, access: tuple[str, ...], variable: str | None,
           method: str, partial_fraction: float, as_json: bool) -> None:
    """Advise a regular chunk shape for copying a dataset (see refgrid materialize).

    \b
    Example:
      refgrid advise demo-output/tas_2001.json --size 1MiB --access time=1 --access lat,lon=3
    """
    from refgrid.explore.advise import advise_chunks
    from refgrid.scanners import scan as scan_input

    patterns: dict[str | tuple[str, ...], float] = {}
    for item in access:
        dims, sep, weight = item.rpartition("=")
        try:
            patterns[tuple(dims.split(",")) if "," in dims else dims] = float(weight)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not DIM[,DIM...]=WEIGHT",
                                     param_hint="--access") from None
        if not sep or not dims:
            raise click.BadParameter(f"{item!r} is not DIM[,DIM...]=WEIGHT",
                                     param_hint="--access")
    advice = advise_chunks(scan_input(source), size, patterns or None,
                           method=method,  # type: ignore[arg-type]
                           partial_fraction=partial_fraction, variable=variable)
    if as_json:
        click.echo(json.dumps({"dims": advice.dims, "chunks": advice.chunks,
                               "chunk_bytes": advice.chunk_bytes,
                               "partial_fraction": advice.partial_fraction,
                               "copy_reads": advice.copy_reads,
                               "patterns": [vars(p) for p in advice.patterns]}, indent=1))
    else:
        click.echo(repr(advice))
        click.echo(f"refgrid materialize {source} OUT --chunks "
                   + ",".join(f"{d}:{n}" for d, n in advice.encoding.items()))


@main.command()
@click.argument("source")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--chunks", default="auto", show_default=True, metavar="auto|DIM:N[,DIM:N...]",
              help="The store's chunks: the advisor's per array, or lengths by dimension "
                   "(others keep their native length).")
@click.option("--codec", type=click.Choice(["zstd", "zlib", "blosc", "none"]), default="zstd",
              show_default=True)
@click.option("--level", default=3, show_default=True, type=int, help="Compression level.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="A dask.distributed scheduler (default: threads of this process).")
@click.option("--workers", default=None, type=click.IntRange(1), help="Local threads.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--progress/--no-progress", default=None,
              help="The progress bar (default: only when stderr is a terminal).")
@storage_option
def materialize(source: str, out: Path, chunks: str, codec: str, level: int,
                scheduler: str | None, workers: int | None, overwrite: bool,
                progress: bool | None,
                storage: tuple[str, ...]) -> None:
    """Copy a virtual dataset into a real, regular Zarr v3 store (resumable: run it again
    after an interruption and it continues where it stopped).

    \b
    Example:
      refgrid materialize demo-output/tas_2001.json tas.zarr --chunks time:30
      python -c "import xarray as xr; print(xr.open_zarr('tas.zarr'))"
    """
    from refgrid.materializing import materialize as copy

    lengths: str | dict[str, int] = chunks
    if chunks != "auto":
        try:
            lengths = {d: int(n) for d, n in (item.split(":") for item in chunks.split(","))}
        except ValueError:
            raise click.BadParameter(f"{chunks!r} is not auto or DIM:N[,DIM:N...]",
                                     param_hint="--chunks") from None
    result = copy(source, out, lengths, codec=codec, level=level, scheduler=scheduler,
                  workers=workers, progress=progress, overwrite=overwrite,
                  storage_options=_storage_options(storage))
    click.echo(f"{result.store}: {result.blocks} blocks ({result.written} written, "
               f"{result.skipped} done before); chunks "
               + ", ".join(f"{k} {v}" for k, v in result.chunks.items()), err=True)


@main.command(cls=ListingFormats)
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--allow-source", "allowed", multiple=True, metavar="PREFIX",
              help="Path or URL prefix source files may lie under, besides ROOT (repeatable). "
                   "A dataset naming a file elsewhere is refused (403).")
@click.option("--workers", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Threads that open datasets and fetch, decode and assemble chunks.")
@click.option("--max-age", default=60, show_default=True, type=click.IntRange(0),
              help="Cache-Control max-age (seconds) of documents and chunks.")
@click.option("--request-timeout", default=60.0, show_default=True, type=float,
              help="Seconds one request may take (504 after).")
@click.option("--header-timeout", default=10.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="Seconds a client has to send a request's line and headers; a connection "
                   "that takes longer (half a request, then silence) is closed.")
@click.option("--access-log/--no-access-log", default=True, show_default=True,
              help="Log every request (a JSON line on stderr).")
@click.option("--follow", "follows", multiple=True, metavar="NAME=PATTERN",
              help="Keep a growing archive current and serve it as NAME: its files (a path, "
                   "s3:// or http(s):// pattern, as refgrid batch takes) are listed every "
                   "--every, and new ones scanned and appended (repeatable).")
@click.option("--every", default="30s", show_default=True, metavar="DURATION",
              help="How often followed archives are listed (30s, 5m, 1h).")
@click.option("--older-than", default="60s", show_default=True, metavar="DURATION",
              help="Leave files modified more recently than this (still being written).")
@click.option("--file-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Stop a followed file's scan after this long and report "
                                      "it as failed (default: 600).")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Scan followed files on a dask.distributed cluster (default: worker "
                   "processes on this machine).")
@click.option("--state", "state", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Where followed archives' references and records are kept "
                                 "(default: ROOT/.refgrid-follow); a restart resumes there.")
@click.option("--refresh-token", envvar="REFGRID_REFRESH_TOKEN", default=None,
              help="Token POST /NAME/refresh needs (Authorization: Bearer TOKEN); without "
                   "one, refresh is disabled. Also read from REFGRID_REFRESH_TOKEN.")
@click.option("--dap-max-bytes", default="1GiB", show_default=True, metavar="SIZE",
              help="Largest OPeNDAP data response, in bytes of values (e.g. 500MB, 2GiB); a "
                   "larger one is refused (413) with its size, so the client asks for a "
                   "hyperslab.")
@click.option("--memory-budget", default="512MiB", show_default=True, metavar="SIZE",
              help="Bytes of response buffers held at once, all requests together (Zarr "
                   "chunks, OPeNDAP blocks); a request that would exceed it is refused (503, "
                   "Retry-After) before it starts.")
@click.option("--strict-sources", is_flag=True, default=False,
              help="Also check each local source's change time (ctime) at every read: a "
                   "rewrite whose modification time was put back is refused too (as is a "
                   "chmod or a new hard link). Size, modification time and the file itself "
                   "are always checked.")
@combine_options()
@format_options
@storage_option
def serve(root: Path, host: str, port: int, allowed: tuple[str, ...], workers: int,
          max_age: int, request_timeout: float, header_timeout: float, access_log: bool,
          follows: tuple[str, ...], every: str, older_than: str,
          file_timeout: float | None, scheduler: str | None, state: Path | None,
          refresh_token: str | None, dap_max_bytes: str, memory_budget: str,
          strict_sources: bool, spec: CombineSpec, formats: dict[str, Any],
          storage: tuple[str, ...]) -> None:
    """Serve every dataset under ROOT as Zarr v3 over HTTP: {served}.

    Each dataset NAME (its path under ROOT, without {served_suffixes}) is served at
    /NAME/native/ (as it is: rectilinear grids, native chunks) and /NAME/regular/ (a
    regular grid that stock zarr 3.1 and xarray read; /NAME/regular;chunks=time:30/ for other
    chunks), and over OPeNDAP at /dap/NAME (DAP2: .dds .das .dods .ascii; DAP4: .dmr
    .dap), which netCDF-C's tools read (ncdump, NCO, MATLAB, R). / lists the datasets.
    Access logs are JSON lines on stderr; SIGINT or SIGTERM stops the server after the
    requests in flight.

    With --follow NAME=PATTERN the service keeps a growing archive current: new files are
    appended as they arrive (GET /NAME/status says how it stands; POST /NAME/refresh, with
    --refresh-token, lists at once).

    \b
    Example:
      refgrid serve refs/ --port 8000 --allow-source /data/archive
      python -c "import fsspec, xarray as xr; print(xr.open_dataset(fsspec.get_mapper(
          'http://127.0.0.1:8000/monthly/regular'), engine='zarr'))"
      ncdump -h http://127.0.0.1:8000/dap/monthly
    """
    import logging

    from refgrid.combining.spec import CombineSpec
    from refgrid.explore.advise import parse_size
    from refgrid.serve import run
    from refgrid.serve.follow import Follow, seconds

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if not follows and (spec != CombineSpec() or any(v is not None for v in formats.values())):
        raise click.UsageError("the combine and format options are for followed archives: "
                               "pass --follow NAME=PATTERN too")
    try:
        limit = parse_size(dap_max_bytes, "--dap-max-bytes")
        budget = parse_size(memory_budget, "--memory-budget")
        followed = [Follow.parse(text, spec=spec, every=seconds(every, "--every"),
                                 older_than=seconds(older_than, "--older-than"),
                                 file_timeout=file_timeout, scheduler=scheduler, **formats)
                    for text in follows]
    except ArgumentError as e:
        raise click.BadParameter(str(e)) from e
    run(str(root), host, port, allow_sources=allowed, workers=workers, max_age=max_age,
        follow=followed, state=state, refresh_token=refresh_token,
        request_timeout=request_timeout, storage_options=_storage_options(storage),
        access_log=access_log, header_timeout=header_timeout,
        dap_max_bytes=limit, memory_budget=budget, strict_sources=strict_sources,
        announce=lambda url: click.echo(f"refgrid serve: {url} (Ctrl-C stops)", err=True))


@main.command()
@click.argument("fixtures", type=click.Path(exists=True, file_okay=False, path_type=Path),
                required=False)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default="demo-output",
              show_default=True, help="Folder for the reference files.")
def demo(fixtures: Path | None, out: Path) -> None:
    """Scan a monthly archive, combine the year, write and verify references.

    FIXTURES is the repository's fixtures folder; without it, ./fixtures is used when there
    is one, else the demo writes a small monthly archive of its own into OUT/inputs.

    \b
    Examples:
      refgrid demo                       # anywhere
      refgrid demo fixtures --out demo-output
    """
    from refgrid.demo import inputs, run

    try:
        sources = inputs(fixtures, out, echo=click.echo)
        click.echo(f"Scanning {sources[0].parent} (daily data, monthly files):")
        written = run(sources, out, echo=click.echo)
    except (RefgridError, FileNotFoundError, AssertionError) as e:
        raise click.ClickException(str(e)) from e
    year = written[-1].resolve()
    click.echo(f"""
Wrote {len(written) - 1} per-file reference files to {out.resolve()}/monthly and the combined
year to {year}. Open them with xarray:

    import xarray as xr
    ds = xr.open_dataset("{year}", engine="refgrid")  # lazy
    # with dask installed, chunks={{}} gives dask chunks equal to the native ones: 10,10,10,1,...

    # with zarr: refgrid's store, read by refgrid's codec pipeline (the fast way)
    import refgrid, zarr
    zarr.config.set(refgrid.zarr_config())
    ds = xr.open_zarr(refgrid.open_store("{year}"))  # zarr >= 3.2 (rectilinear grids)
    ds = xr.open_zarr(refgrid.open_store("{year}", chunks="auto"))  # any zarr >= 3.1

    # or serve them: refgrid serve {out.resolve()} --port 8000
""")


if __name__ == "__main__":
    sys.exit(main())
