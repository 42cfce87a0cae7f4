"""``scan(x)``: any input → :class:`~refgrid.model.virtual.VirtualGroup`, the one place that decides
what an input is.

Every reader goes through here — :func:`refgrid.get_mapper`, the xarray engine, the CLI — so
``refgrid.scan(x)`` and ``xr.open_dataset(x, engine="refgrid")`` accept exactly the same
inputs. Each format has one scanner with one signature, ``(Source, ScanOptions) ->
VirtualGroup``:

=================  ==========================================================================
format             recognised by
=================  ==========================================================================
``hdf5``           HDF5 signature at offset 0 or 512·2^k (after a user block; NetCDF4 too)
``netcdf3``        ``CDF\\x01``, ``CDF\\x02`` or ``CDF\\x05``
``json``           a file starting with ``{`` (or named ``*.json``): kerchunk/refgrid refs
``parquet``        a directory with ``.zmetadata`` (or named ``*.parq``/``*.parquet``)
``zarr``           a directory with a root ``zarr.json``: a Zarr v3 store
``dmrpp``          XML in the DAP4 and DMR++ namespaces: OPeNDAP's chunk index of a granule
=================  ==========================================================================

A dict is a loaded reference set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal, NoReturn

from refgrid.core.inputs import DATA_SUFFIXES, is_pattern
from refgrid.core.keys import METADATA, ZMETADATA
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
from refgrid.model.choose import choose
from refgrid.model.virtual import VirtualGroup
from refgrid.scanners.allowed import check_sources, default_allowed
from refgrid.scanners.options import OnError, ScanOptions
from refgrid.scanners.source import Source

Format = Literal["hdf5", "netcdf3", "json", "parquet", "zarr", "dmrpp"]
Scanner = Callable[[Source, ScanOptions], VirtualGroup]
Input = str | os.PathLike[str] | Mapping[str, object]
"""What :func:`scan` accepts: a path or URL, or a loaded reference dict."""



def scanner(kind: Format) -> Scanner:
    """The scanner of ``kind``, imported when first asked for: reading references needs
    neither h5py nor, for JSON, pyarrow."""
    if kind == "hdf5":
        from refgrid.scanners.hdf5 import scan_hdf5
        return scan_hdf5
    if kind == "netcdf3":
        from refgrid.scanners.netcdf3 import scan_netcdf3
        return scan_netcdf3
    if kind == "json":
        from refgrid.scanners.json_refs import scan_json
        return scan_json
    if kind == "parquet":
        from refgrid.scanners.parquet import scan_parquet
        return scan_parquet
    if kind == "dmrpp":
        from refgrid.scanners.dmrpp import scan_dmrpp
        return scan_dmrpp
    from refgrid.scanners.zarr_store import scan_zarr_store
    return scan_zarr_store


REFERENCE_FORMATS = frozenset({"json", "parquet", "dmrpp"})
"""Inputs whose chunks may live anywhere: the ones the allow-list applies to."""
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")
DMRPP_MARK = b"xml.opendap.org/dap/dmrpp"
"""The DMR++ namespace, which the first bytes of a DMR++ document hold."""


def _names(value: Sequence[str] | str | None) -> Sequence[str] | None:
    return (value,) if isinstance(value, str) else value


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
    options = ScanOptions(on_error, inline_threshold, fallback_inline_limit,
                          contiguous_chunk_bytes, None, data_url, tuple(
                              _names(drop_variables) or ()))
    group = scan_with(source, options, allowed_sources, storage_options)
    where = "<references>" if isinstance(source, Mapping) else os.fspath(source)
    return choose(group, _names(variables), _names(drop_variables), where)


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
        if kind in REFERENCE_FORMATS and prefixes is not None:
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
    if source.url.endswith((".parq", ".parquet")):
        return "parquet"
    if source.is_local and os.path.isdir(source.url):
        return _directory_format(source) or _not_an_input_directory(source)
    try:
        head = source.head(4096)
    except ScanError as e:
        if source.is_local or e.reason != NO_SUCH_FILE:  # a failure, not an absence
            raise
        # a remote "directory" is a prefix: look inside
        return _directory_format(source) or _not_an_input_directory(source)
    if any(head[k:k + 8] == HDF5_MAGIC for k in (0, 512, 1024, 2048)):
        return "hdf5"
    if head[:4] in NETCDF3_MAGIC:
        return "netcdf3"
    if head.lstrip()[:1] in (b"{", b"[") or source.url.endswith(".json"):
        return "json"
    if DMRPP_MARK in head and b"Dataset" in head:  # (text before its declaration too)
        return "dmrpp"
    if head.lstrip()[:1] == b"<" and not source.is_local:  # a server's page for a directory
        found = _directory_format(source)
        if found is not None:
            return found
    if _hdf5_after_user_block(source):
        return "hdf5"
    found = None if source.is_local else _directory_format(source)  # a server listing dirs
    if found is not None:
        return found
    raise FormatError(source.url, None,
                      f"not an HDF5/NetCDF4/NetCDF3 file (starts with {head[:8]!r})")


USER_BLOCK_LIMIT = 2**40
"""The largest user block looked past (HDF5 places the superblock at 0 or 512·2^k)."""


def _hdf5_after_user_block(source: Source) -> bool:
    """Whether an HDF5 superblock follows a user block of 4 KiB or more (the first 4 KiB,
    which hold the smaller ones, were already looked at)."""
    offset = 4096
    while offset < USER_BLOCK_LIMIT:
        signature = source.read_at(offset, len(HDF5_MAGIC))
        if signature == HDF5_MAGIC:
            return True
        if len(signature) < len(HDF5_MAGIC):
            return False  # past the end of the file
        offset *= 2
    return False


def _directory_format(source: Source) -> Format | None:
    """The format of a directory input, from the marker file it holds (None: neither); no
    scanner is imported to look."""
    if source.has_member(METADATA):
        return "zarr"
    if source.has_member(ZMETADATA):
        return "parquet"
    return None


def _not_an_input_directory(source: Source) -> NoReturn:
    if not source.is_local and not source.is_directory():
        raise NotFoundError(source.url, None, NO_SUCH_FILE)
    hint = ""
    if source.is_local:
        root = Path(source.url.removeprefix("file://"))
        data = sorted(p.name for p in root.iterdir() if p.suffix in DATA_SUFFIXES)
        if data:
            pattern = str(root / f"*{Path(data[0]).suffix}")
            hint = (f"; it holds {len(data)} data file(s) ({', '.join(data[:3])}"
                    f"{', ...' if len(data) > 3 else ''}): to join them along a dimension use "
                    f"refgrid.combine({pattern!r}, 'time'), or refgrid batch '{pattern}' -o "
                    "out.parq from the shell; refgrid.scan reads one file")
    raise FormatError(source.url, None, f"a directory with no zarr.json (not a Zarr v3 store) "
                      f"and no {ZMETADATA}: not kerchunk parquet references{hint}")


def _exists(url: str, storage_options: StorageOptions) -> bool:
    """Whether a path with glob characters names a file as it is (names may hold ``[``)."""
    try:
        fs, path = filesystem(url, storage_options)
        return bool(fs.exists(path))
    except Exception:  # an unreachable store: the scan itself says why
        return True


__all__ = ["Format", "Input", "OnError", "ScanOptions", "detect_format", "scan", "scan_with"]
