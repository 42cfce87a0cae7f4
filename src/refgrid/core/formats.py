"""The input formats refgrid reads, as one table (:data:`FORMATS`): each one's names, how its
files are recognised, where its scanner is, and what the rest of refgrid must know of it.

Adding a format is its scanner and one row here: the dispatcher
(:func:`refgrid.scanners.detect_format`, :func:`refgrid.scanners.scanner`) recognises it and
imports its scanner when it is first met; the service's catalog finds, names and serves its
datasets; a directory of its files given to ``combine`` or ``batch`` is told the pattern
naming them (:mod:`refgrid.core.inputs`); the command line declares its options and lists
it in its help — each by reading this table, as :mod:`refgrid.codecs.filters` holds HDF5's
filters and zarr-python its registries. No other module names a format's suffix or signature
(``tests/test_architecture.py``).

The table lies in ``core/``, below everything that reads it (``core/inputs`` is under the
scanners), and imports nothing but the standard library: the command line declares its
options from it and stays quick to start. The rows name their scanners by ``"module:function"``;
only the dispatcher imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol


class Readable(Protocol):
    """What a :data:`Probe` reads (:class:`refgrid.scanners.source.Source`)."""

    def read_at(self, offset: int, nbytes: int) -> bytes: ...


Sniff = Callable[[bytes], bool]
"""Whether a file whose first bytes (4 KiB, fewer for a shorter file) these are is the
format's."""
Probe = Callable[[Readable], bool]
"""Whether a file is the format's, reading further than its first bytes: asked only once no
format's sniff knew them."""
SNIFFED_BYTES = 4096
"""The bytes a :data:`Sniff` is given."""


@dataclass(frozen=True)
class FormatOption:
    """An option one format takes: a keyword of :func:`refgrid.scan`, :func:`refgrid.batch`
    and a field of :class:`~refgrid.scanners.options.ScanOptions`, and its flag on the
    command line (``refgrid scan``, ``refgrid batch``), declared from here. Not given, it is
    None, and the keyword's default applies."""

    keyword: str
    flag: str
    metavar: str
    help: str


@dataclass(frozen=True)
class InputFormat:
    """One input format: a row of :data:`FORMATS`."""

    name: str
    """What the dispatcher calls it (:func:`refgrid.scanners.detect_format`), and the kind
    of a served dataset."""
    title: str
    """What an input of it is, as messages and help texts say it ("a Zarr v3 store")."""
    scanner: str
    """``"module:function"``: its scanner, a ``(Source, ScanOptions) -> VirtualGroup``,
    imported when the format is first met (reading references needs neither h5py nor, for
    JSON, pyarrow)."""
    suffixes: tuple[str, ...] = ()
    """The names its files (or directories) are given: a served dataset's name is its path
    without one, and a directory of data files is named by a pattern of one."""
    by_name: Literal["first", "in turn"] | None = None
    """Whether a suffix decides the format: ``"first"``, before anything is read (a parquet
    directory costs no request to tell); ``"in turn"``, as its sniff would (JSON so named
    whatever it starts with, unless an earlier format's sniff knows its bytes); None: the
    name decides nothing (a ``.nc`` file may be HDF5 or NetCDF3)."""
    sniff: Sniff | None = None
    """The test of its first bytes (formats are tried in the table's order)."""
    probe: Probe | None = None
    """A test reading further (an HDF5 superblock after a large user block)."""
    members: tuple[str, ...] = ()
    """Files that make a directory (or a remote prefix) an input of this format, tried in
    the table's order."""
    references: bool = False
    """Its chunks may lie in any file it names: the allow-list applies to it."""
    asks_sources: bool = False
    """Its scanner asks the files it names anything (their identity) as it scans, so the
    allow-list must reach the scan, not only check its result (the service's catalog
    passes it on)."""
    served: bool = False
    """``refgrid serve`` serves it where it finds one under its root: a file named with one
    of its suffixes or, for a format with members, a directory holding one."""
    stamped: bool = True
    """Whether its stamp (the mtime, size and inode of its file, or of the member that makes
    its directory an input) changes whenever what it holds does. A Zarr store's chunk
    files are rewritten without its ``zarr.json``: no validator can tell, so the service's
    responses of one are not cached."""
    data: bool = False
    """A file of one dataset, of the kind combine and batch join: a directory of them given
    as an input is answered with the pattern naming them."""
    options: tuple[FormatOption, ...] = ()
    """The options only it takes."""


HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
HDF5_OFFSETS = (0, 512, 1024, 2048)
"""Where an HDF5 superblock may start within the first bytes (after a user block)."""
USER_BLOCK_LIMIT = 2**40
"""The largest user block looked past (HDF5 places the superblock at 0 or 512·2^k)."""
NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")
DMRPP_MARK = b"xml.opendap.org/dap/dmrpp"
"""The DMR++ namespace, which the first bytes of a DMR++ document hold."""


def _hdf5(head: bytes) -> bool:
    return any(head[k:k + len(HDF5_MAGIC)] == HDF5_MAGIC for k in HDF5_OFFSETS)


def _hdf5_after_user_block(source: Readable) -> bool:
    """Whether an HDF5 superblock follows a user block of 4 KiB or more (the first 4 KiB,
    which hold the smaller ones, were sniffed)."""
    offset = SNIFFED_BYTES
    while offset < USER_BLOCK_LIMIT:
        signature = source.read_at(offset, len(HDF5_MAGIC))
        if signature == HDF5_MAGIC:
            return True
        if len(signature) < len(HDF5_MAGIC):
            return False  # past the end of the file
        offset *= 2
    return False


def _netcdf3(head: bytes) -> bool:
    return head[:4] in NETCDF3_MAGIC


def _json(head: bytes) -> bool:
    return head.lstrip()[:1] in (b"{", b"[")


def _dmrpp(head: bytes) -> bool:
    return DMRPP_MARK in head and b"Dataset" in head  # (text before its declaration too)


FORMATS: tuple[InputFormat, ...] = (
    InputFormat("hdf5", "an HDF5/NetCDF4 file", "refgrid.scanners.hdf5:scan_hdf5",
                suffixes=(".nc", ".nc4", ".h5", ".hdf5", ".he5", ".hdf"), sniff=_hdf5,
                probe=_hdf5_after_user_block, data=True),
    InputFormat("netcdf3", "a NetCDF3 file", "refgrid.scanners.netcdf3:scan_netcdf3",
                suffixes=(".nc",), sniff=_netcdf3, data=True),
    InputFormat("json", "kerchunk or refgrid JSON references",
                "refgrid.scanners.json_refs:scan_json", suffixes=(".json",),
                by_name="in turn", sniff=_json, references=True, served=True),
    InputFormat("zarr", "a Zarr v3 store", "refgrid.scanners.zarr_store:scan_zarr_store",
                suffixes=(".zarr",), members=("zarr.json",), served=True, stamped=False),
    InputFormat("parquet", "kerchunk parquet references",
                "refgrid.scanners.parquet:scan_parquet", suffixes=(".parq", ".parquet"),
                by_name="first", members=(".zmetadata",), references=True, served=True),
    InputFormat("dmrpp", "a DMR++ document (a granule's chunk index)",
                "refgrid.scanners.dmrpp:scan_dmrpp", suffixes=(".dmrpp",), sniff=_dmrpp,
                references=True, asks_sources=True, served=True, data=True,
                options=(FormatOption(
                    "data_url", "--data-url", "URL|TEMPLATE",
                    "DMR++ input: where the granules are when the documents name them by a "
                    "relative path or Hyrax's placeholder ({name}: a document's name without "
                    ".dmrpp; default: beside each document)."),)),
)
"""Every input format, in the order the dispatcher tries them (a directory holding both
``zarr.json`` and ``.zmetadata`` is a Zarr store)."""


def input_format(name: str) -> InputFormat:
    """The row of the format ``name``."""
    for row in FORMATS:
        if row.name == name:
            return row
    raise KeyError(f"no input format {name!r} (refgrid.core.formats.FORMATS has "
                   f"{', '.join(row.name for row in FORMATS)})")


def named(url: str) -> InputFormat | None:
    """The format ``url``'s name decides before anything is read, if any."""
    return next((row for row in FORMATS if row.by_name == "first"
                 and url.endswith(row.suffixes)), None)


def sniffed(head: bytes, url: str) -> InputFormat | None:
    """The first format whose sniff knows ``head`` (a file's first :data:`SNIFFED_BYTES`) or
    whose name, tried in turn, ``url`` has."""
    return next((row for row in FORMATS
                 if (row.sniff is not None and row.sniff(head))
                 or (row.by_name == "in turn" and url.endswith(row.suffixes))), None)


def probed(source: Readable) -> InputFormat | None:
    """The first format whose probe finds it in ``source`` (once no sniff did)."""
    return next((row for row in FORMATS if row.probe is not None and row.probe(source)), None)


def directory_format(holds: Callable[[str], bool],
                     rows: Iterable[InputFormat] | None = None) -> tuple[InputFormat, str] | None:
    """The format of a directory (or prefix) whose files ``holds`` tells, with the member
    that makes it one; None: no format's."""
    for row in FORMATS if rows is None else rows:
        for member in row.members:
            if holds(member):
                return row, member
    return None


def served() -> tuple[InputFormat, ...]:
    """The formats ``refgrid serve`` serves."""
    return tuple(row for row in FORMATS if row.served)


def served_file(name: str) -> InputFormat | None:
    """The served format a file named ``name`` is (a format with members is a directory)."""
    return next((row for row in served() if not row.members and name.endswith(row.suffixes)),
                None)


def suffixes(rows: Iterable[InputFormat]) -> tuple[str, ...]:
    """The suffixes of ``rows``, each once, in order."""
    return tuple(dict.fromkeys(s for row in rows for s in row.suffixes))


def stem(name: str, rows: Iterable[InputFormat]) -> str:
    """``name`` without the first of ``rows``' suffixes it ends with."""
    return next((name[:-len(s)] for s in suffixes(rows) if name.endswith(s)), name)


def data_suffixes() -> tuple[str, ...]:
    """The names data files are given (the first: where a directory holds none)."""
    return suffixes(row for row in FORMATS if row.data)


def format_options() -> tuple[FormatOption, ...]:
    """Every format's own options."""
    return tuple(option for row in FORMATS for option in row.options)

