"""``scan(x)``: any input → :class:`~refgrid.model.virtual.VirtualGroup`, the one place that decides
what an input is.

Every reader goes through here — :func:`refgrid.get_mapper`, the xarray engine, the CLI — so
``refgrid.scan(x)`` and ``xr.open_dataset(x, engine="refgrid")`` accept exactly the same
inputs. The formats are the rows of :data:`refgrid.core.formats.FORMATS`: how each is
recognised (its name, its first bytes, the members of a directory), its scanner — one
signature, ``(Source, ScanOptions) -> VirtualGroup``, imported when the format is first met
— and whether the allow-list applies to it. A dict is a loaded reference set.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn, cast

from refgrid.core import formats
from refgrid.core.formats import SNIFFED_BYTES
from refgrid.core.inputs import is_pattern
from refgrid.core.sources import filesystem
from refgrid.core.typed import StorageOptions
from refgrid.errors import (
    NO_SUCH_FILE,
    ArgumentError,
    FormatError,
    GridError,
    ModelError,
    NotFoundError,
    RefgridError,
    ScanError,
)
from refgrid.model.choose import choose, chosen_names
from refgrid.model.virtual import VirtualGroup
from refgrid.scanners.allowed import check_sources, default_allowed
from refgrid.scanners.options import OnError, ScanOptions
from refgrid.scanners.source import Source

Format = str
"""An input format's name: a row of :data:`refgrid.core.formats.FORMATS`."""
Scanner = Callable[[Source, ScanOptions], VirtualGroup]
Input = str | os.PathLike[str] | Mapping[str, object]
"""What :func:`scan` accepts: a path or URL, or a loaded reference dict."""


def scanner(kind: Format) -> Scanner:
    """The scanner of ``kind``, imported when first asked for: reading references needs
    neither h5py nor, for JSON, pyarrow."""
    module, _, function = formats.input_format(kind).scanner.partition(":")
    return cast(Scanner, getattr(importlib.import_module(module), function))


def scan(
    source: Input,
    *,
    on_error: OnError = "raise",
    inline_threshold: int = ScanOptions.inline_threshold,
    fallback_inline_limit: int = ScanOptions.fallback_inline_limit,
    contiguous_chunk_bytes: int = ScanOptions.contiguous_chunk_bytes,
    allowed_sources: Sequence[str] | None = None,
    data_url: str | None = None,
    variables: Sequence[str] | str | None = None,
    drop_variables: Sequence[str] | str | None = None,
    **storage_options: object,
) -> VirtualGroup:
    """Scan one HDF5 / NetCDF4 / NetCDF3 file, a reference set (kerchunk or refgrid JSON,
    parquet directory, or a loaded dict) or a Zarr v3 store, local or remote (any fsspec URL).

    ``on_error="raise"`` (default) stops at the first variable that cannot be scanned, naming
    the file, the variable and the reason; ``"report"`` records it in ``VirtualGroup.report``
    and goes on. Variables served another way than byte-range references (inlined, decoded,
    specially encoded) are always listed in the report. ``storage_options`` go to fsspec, for
    the input and for the files its references name.

    ``allowed_sources``: URL or path prefixes the files named by references must lie under
    (:class:`refgrid.AccessError` otherwise). Default: for references loaded from a remote
    URL, that URL's scheme and host or bucket; otherwise no restriction.

    ``data_url``: for a DMR++ document, where its granule is when the document names it by
    a relative path or Hyrax's placeholder (a URL, or a template whose ``{name}`` is the
    document's name without ``.dmrpp``); default: the file beside the document.

    ``variables``: keep only these variables (paths such as ``"sub/tas"``) and what they are
    read with (their dimensions' coordinates, bounds, auxiliary coordinates, grid mappings);
    ``drop_variables``: leave these out — unscanned, so a variable refgrid cannot read is no
    error once dropped. A name the input does not hold is an error.
    """
    kept = chosen_names(variables, "variables", keeping=True)
    dropped = chosen_names(drop_variables, "drop_variables", keeping=False) or ()
    options = ScanOptions(on_error, inline_threshold, fallback_inline_limit,
                          contiguous_chunk_bytes, None, data_url, dropped)
    group = scan_with(source, options, allowed_sources, storage_options)
    where = "<references>" if isinstance(source, Mapping) else os.fspath(source)
    return choose(group, kept, dropped, where)


def scan_with(source: Input, options: ScanOptions, allowed_sources: Sequence[str] | None,
              storage_options: Mapping[str, object]) -> VirtualGroup:
    """What :func:`scan` does before it chooses variables: ``source`` scanned with
    ``options``, the variables it drops (:attr:`ScanOptions.dropped`) noted in the report as
    ``dropped`` and never scanned — so a variable refgrid cannot read stops nothing once
    dropped —, for the caller's :func:`~refgrid.model.choose.choose` to check against the
    names it was given (each file, or all of a combine's) and take off."""
    if options.on_error not in ("raise", "report"):
        raise ArgumentError(f"on_error must be 'raise' or 'report', not {options.on_error!r}")
    if not isinstance(source, Mapping | str | os.PathLike):
        raise ArgumentError(f"refgrid reads a path, a URL or a dict of references, not a "
                            f"{type(source).__name__}")
    where = "<references>" if isinstance(source, Mapping) else os.fspath(source)
    if isinstance(source, str) and is_pattern(source) and not _exists(source, storage_options):
        raise ArgumentError(f"{source} is a glob pattern, and refgrid.scan reads one file: to "
                            f"join the files it matches along a dimension, use "
                            f"refgrid.combine({source!r}, 'time') (or refgrid combine / "
                            f"refgrid batch from the shell)")
    try:
        if isinstance(source, Mapping):
            from refgrid.scanners.json_refs import reference_dict_to_group

            group = reference_dict_to_group(source, where, storage_options)
            kind: Format = "json"
        else:
            resolved = Source.of(source, storage_options)
            kind = detect_format(resolved)
            prefixes = allowed_sources if allowed_sources is not None else default_allowed(
                where)
            group = scanner(kind)(resolved, replace(options, allowed=None if prefixes is None
                                                    else tuple(prefixes)))
        prefixes = allowed_sources if allowed_sources is not None else default_allowed(
            None if isinstance(source, Mapping) else where)
        if formats.input_format(kind).references and prefixes is not None:
            group = check_sources(group, prefixes, where)
        return group
    except (ModelError, GridError) as e:  # name the input they came from
        raise FormatError(where, None, str(e)) from e
    except RefgridError:
        raise
    except RecursionError:
        raise FormatError(where, None, "nested too deeply to read") from None
    except Exception as e:  # the contract: whatever a damaged input provokes is named
        if isinstance(e, OSError | TimeoutError) or type(e).__module__.split(".")[0] in (
                "botocore", "aiohttp", "aiobotocore", "requests", "urllib3"):
            raise ScanError(where, None, f"cannot read it ({type(e).__name__}: {e})") from e
        raise FormatError(where, None, f"unusable input ({type(e).__name__}: {e})") from e


def detect_format(source: Source) -> Format:
    """What ``source`` is, from its name where that is decisive, else from its bytes."""
    named = formats.named(source.url)
    if named is not None:
        return named.name
    if source.is_local and os.path.isdir(source.url):
        return _directory_format(source) or _not_an_input_directory(source)
    try:
        head = source.head(SNIFFED_BYTES)
    except ScanError as e:
        if source.is_local or e.reason != NO_SUCH_FILE:  # a failure, not an absence
            raise
        # a remote "directory" is a prefix: look inside
        return _directory_format(source) or _not_an_input_directory(source)
    sniffed = formats.sniffed(head, source.url)
    if sniffed is not None:
        return sniffed.name
    if head.lstrip()[:1] == b"<" and not source.is_local:  # a server's page for a directory
        found = _directory_format(source)
        if found is not None:
            return found
    probed = formats.probed(source)
    if probed is not None:
        return probed.name
    found = None if source.is_local else _directory_format(source)  # a server listing dirs
    if found is not None:
        return found
    raise FormatError(source.url, None,
                      f"not an HDF5/NetCDF4/NetCDF3 file (starts with {head[:8]!r})")


def _directory_format(source: Source) -> Format | None:
    """The format of a directory input, from the member file it holds (None: none); no
    scanner is imported to look."""
    found = formats.directory_format(source.has_member)
    return None if found is None else found[0].name


def _not_an_input_directory(source: Source) -> NoReturn:
    if not source.is_local and not source.is_directory():
        raise NotFoundError(source.url, None, NO_SUCH_FILE)
    hint = ""
    if source.is_local:
        root = Path(source.url.removeprefix("file://"))
        suffixes = formats.data_suffixes()
        data = sorted(p.name for p in root.iterdir() if p.suffix in suffixes)
        if data:
            pattern = str(root / f"*{Path(data[0]).suffix}")
            hint = (f"; it holds {len(data)} data file(s) ({', '.join(data[:3])}"
                    f"{', ...' if len(data) > 3 else ''}): to join them along a dimension use "
                    f"refgrid.combine({pattern!r}, 'time'), or refgrid batch '{pattern}' -o "
                    "out.parq from the shell; refgrid.scan reads one file")
    lacking = ", and ".join(f"no {member}: not {row.title}" for row in formats.FORMATS
                            for member in row.members)
    raise FormatError(source.url, None, f"a directory with {lacking}{hint}")


def _exists(url: str, storage_options: StorageOptions) -> bool:
    """Whether a path with glob characters names a file as it is (names may hold ``[``)."""
    try:
        fs, path = filesystem(url, storage_options)
        return bool(fs.exists(path))
    except Exception:  # an unreachable store: the scan itself says why
        return True


__all__ = ["Format", "Input", "OnError", "ScanOptions", "detect_format", "scan", "scan_with"]
