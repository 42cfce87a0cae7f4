"""What a batch worker does with one file: scan it and make its record.

Everything that needs the source is done here, on the worker, so the client never opens a
source: the concat coordinate is read and inlined (as the combine stores it), and each
variable without the concat dimension is read once to a digest, which the combine compares
instead of reading that variable from every file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np

from refgrid.archive.deadline import deadline
from refgrid.archive.journal import Header
from refgrid.archive.record import dumps
from refgrid.combining import with_inline_coordinates
from refgrid.combining.shaping import data_variables
from refgrid.combining.spec import CombineSpec
from refgrid.core.bounds import Limits, current, limits
from refgrid.core.names import to_json
from refgrid.core.sources import SourceIdentity, is_local
from refgrid.core.typed import JSON
from refgrid.errors import RefgridError, ScanError
from refgrid.model.virtual import VirtualArray, VirtualGroup


@dataclass(frozen=True)
class ScanJob:
    """How every file of a batch is scanned (sent to the workers once per task)."""

    spec: CombineSpec
    """How the files are combined: what a worker does to each (variables chosen, its time,
    its stack value and file set) before recording it."""
    storage_options: dict[str, object]
    allowed_sources: list[str] | None = None
    file_timeout: float | None = None
    """Seconds one file's scan may take in a worker process (None: no deadline)."""
    notes: str | None = None
    """Where a worker notes the file whose scan passed the deadline (the work directory)."""
    data_url: str | None = None
    """DMR++ sources: where their granules are (``refgrid.scan``'s ``data_url``)."""
    limits: Limits = field(default_factory=current)
    """The caller's limits (timeouts, attempts, sizes), in force in the workers: a worker
    process knows only the environment's, not ``set_limits`` or a ``with limits(...)``."""


@dataclass(frozen=True)
class Scanned:
    header: Header
    record: bytes


@dataclass(frozen=True)
class Failed:
    url: str
    error: str
    """The error's type name."""
    message: str


def scan_files(files: Sequence[tuple[str, SourceIdentity | None]], job: ScanJob
               ) -> list[Scanned | Failed]:
    """Scan each file; a file that fails is a :class:`Failed`, not an exception, so one
    damaged file does not lose the records of the others in its task."""
    with limits(**asdict(job.limits)):
        return [_scan_one(url, known, job) for url, known in files]


def _scan_one(url: str, known: SourceIdentity | None, job: ScanJob) -> Scanned | Failed:
    try:
        with deadline(url, job.file_timeout, job.notes):
            return _scanned(url, known, job)
    except RefgridError as e:
        return Failed(url, type(e).__name__, str(e))
    except Exception as e:
        return Failed(url, type(e).__name__, f"{url}: {e}")


def _scanned(url: str, known: SourceIdentity | None, job: ScanJob) -> Scanned:
    from refgrid.scanners import ScanOptions, scan_with
    from refgrid.scanners.source import Source

    recorded = known if known is not None else Source.of(url, job.storage_options).identity
    with _fetched_whole(url, recorded, job):
        spec, shape = job.spec, job.spec.shape
        options = ScanOptions(data_url=job.data_url, dropped=shape.drop_variables)
        group = scan_with(url, options, job.allowed_sources, job.storage_options)
        named = shape.named(group)  # (those dropped unscanned among them)
        group = shape.shaped(group, url, spec.concat_dim, job.storage_options)
        group = with_inline_coordinates(group, spec.concat_dim, job.storage_options)
        record = dumps(group, _digests(group, job))
        first = _first(group, spec.concat_dim)
    header: Header = {"url": url, "identity": recorded}
    if first is not None:
        header["first"] = first
    shaped = shape.key(spec.merge)
    if shaped:
        header["shape"] = shaped
        header["named"] = named
    if shape.stack_dim is not None:
        header["stack"] = to_json(shape.stack_value(group, url))
    if spec.merge:
        header["set"] = sorted(data_variables(group, spec.concat_dim))
    return Scanned(header, record)


def _fetched_whole(url: str, recorded: SourceIdentity, job: ScanJob
                   ) -> AbstractContextManager[None]:
    """A small remote file fetched in one request and held while the worker scans and reads
    it (the scan alone would make three or four, and each read of a variable one more)."""
    from refgrid.core.sources import held_file
    from refgrid.scanners.source import WHOLE_FILE_LIMIT, Source

    if is_local(url) or recorded["size"] > WHOLE_FILE_LIMIT:
        return nullcontext()
    data = Source.of(url, job.storage_options).read_at(0, recorded["size"])
    if len(data) != recorded["size"]:
        raise ScanError(url, None, f"{len(data)} bytes read where its listing said "
                        f"{recorded['size']}: it changed while the batch ran")
    return held_file(url, data, recorded)


def _digests(group: VirtualGroup, job: ScanJob) -> dict[str, str]:
    """A digest of the values of every array without the concat dimension, by path."""
    from refgrid.read.array import read

    out = {}
    for path, node in group.walk():
        if isinstance(node, VirtualArray) and job.spec.concat_dim not in node.dims:
            out[path] = values_digest(read(node, storage_options=job.storage_options))
    return out


def values_digest(values: np.ndarray) -> str:
    h = hashlib.sha256(f"{values.dtype.str}{values.shape}".encode())
    if values.dtype.kind == "O":
        h.update(repr(values.tolist()).encode())
    else:
        h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


def _first(group: VirtualGroup, dim: str) -> list[JSON] | None:
    """``[first value, units, calendar]`` of the file's outermost concat coordinate."""
    from refgrid.read.array import read

    for _, node in group.walk():
        if isinstance(node, VirtualArray) and node.dims == (dim,) and node.name == dim:
            if not node.shape[0]:
                return None
            value = read(node, slice(0, 1))[0]
            return [value.item() if isinstance(value, np.generic) else value,
                    node.attrs.get("units"), node.attrs.get("calendar", "standard")]
    return None
