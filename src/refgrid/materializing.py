"""Materialize: copy a virtual dataset into a real, regular Zarr v3 store — the literal
reference-to-Zarr conversion, for analysis-ready copies with better chunks.

xarray writes the store's metadata (``to_zarr(compute=False)`` on the engine's dataset, with
the source encodings kept — dtype, packing, fill value, time units — so ``xr.open_zarr(out)``
decodes as the references do). The data is then copied by refgrid, not by xarray: a variable
whose stored values the store keeps unchanged (numbers, the usual case) is copied as stored,
in blocks of whole target chunks, each read by refgrid's reader from the native chunks it
covers (decoded on its threads) and written with zarr; no decoding to floats and encoding
back. Other variables (characters, strings) are written by xarray.

Resumable: a block records itself in ``OUT/.refgrid-materialize/done/`` once written, so a
copy killed at any point continues where it stopped, skipping what is done; the store is
marked complete (``.refgrid-materialize/complete.json``) only at the end. Blocks run on dask:
threads of this process by default, or a ``dask.distributed`` scheduler.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from refgrid.core.sources import SourceCheck
from refgrid.core.tasks import cluster, progress_bar, scheduler_kind
from refgrid.core.typed import Untyped
from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError, RefgridError, WriteError
from refgrid.explore.advise import advise_chunks
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.array import ArrayReader, reader_of
from refgrid.scanners import Input, scan
from refgrid.writers.atomic import write_file

if TYPE_CHECKING:
    import xarray as xr
    from zarr import Array
    from zarr.abc.codec import BytesBytesCodec

JOURNAL = ".refgrid-materialize"
KEPT_ENCODING = ("dtype", "scale_factor", "add_offset", "_FillValue", "missing_value", "units",
                 "calendar")
"""Encodings the copy keeps: what decides how the stored values decode."""
BLOCK_BYTES = 64 * 2**20
"""A block (one task) is this many bytes of whole target chunks, or one chunk."""
Chunks = str | Mapping[str, int]


class Plan(TypedDict):
    """What a copy will do (``plan.json`` in the journal): a run continues a store only
    where the plan is the same."""

    chunks: dict[str, tuple[int, ...]]
    """The store's chunk shape of each array."""
    codec: list[str | int]
    """``[codec, level]``."""
    sources: str
    """A digest of the sources' identities."""


@dataclass(frozen=True)
class Block:
    """One task: a region of whole target chunks of one variable."""

    variable: str
    region: tuple[tuple[int, int], ...]

    @property
    def name(self) -> str:
        text = ",".join(f"{a}-{b}" for a, b in self.region)
        return hashlib.blake2b(f"{self.variable}\x00{text}".encode(),
                               digest_size=10).hexdigest()


@dataclass(frozen=True)
class MaterializeResult:
    """What a materialize did."""

    store: Path
    chunks: dict[str, tuple[int, ...]]
    blocks: int
    written: int
    skipped: int
    """Blocks found done by an earlier, interrupted run, and not written again."""
    by_xarray: tuple[str, ...] = field(default=())
    """Variables written by xarray (not copied as stored)."""


def materialize(refs: Input, out: str | os.PathLike[str], chunks: Chunks = "auto", *,
                codec: str = "zstd", level: int = 3, scheduler: str | Untyped | None = None,
                workers: int | None = None, progress: bool | None = None,
                overwrite: bool = False,
                target: str | int = "10MiB", block_bytes: int = BLOCK_BYTES,
                storage_options: dict[str, object] | None = None) -> MaterializeResult:
    """Copy the dataset ``refs`` (references, a Zarr store, a file: anything refgrid reads)
    into a regular Zarr v3 store at ``out``.

    ``chunks``: ``"auto"`` (each array's shape from :func:`refgrid.advise_chunks`, aiming at
    ``target`` bytes, time series and maps weighted equally, aligned with the native chunks)
    or ``{dim: length}`` (dimensions not named keep their native chunk length, or their whole
    length where the native grid is irregular). ``codec``: ``"zstd"`` (default), ``"zlib"``,
    ``"blosc"`` or ``"none"``, at ``level``. ``scheduler``: None (dask's threads here,
    ``workers`` of them), ``"synchronous"``, a scheduler address or a ``distributed.Client``.
    ``block_bytes``: the work of one task (whole target chunks; one chunk at least).
    An existing store is continued if an earlier run of the same copy left it incomplete;
    otherwise it is an error unless ``overwrite``.
    """
    import_extra("dask", "batch", "materialize")
    import xarray as xr

    store = Path(out)
    options = storage_options or {}
    group = scan(refs, **cast("dict[str, Any]", options))  # checked by scan, not by mypy
    plan = _plan(group, chunks, target, codec, level)
    journal = store / JOURNAL
    if (journal / "complete.json").exists() and _same_plan(journal, plan) and not overwrite:
        finished = int(json.loads((journal / "complete.json").read_text())["blocks"])
        return MaterializeResult(store, plan["chunks"], finished, 0, finished)
    resuming = store.exists() and (journal / "plan.json").exists() and _same_plan(journal, plan)
    if store.exists() and not resuming:
        if not overwrite:
            raise WriteError(f"{store}: exists and is not an unfinished copy of this dataset "
                             "with these chunks (overwrite=True / --overwrite replaces it)")
        shutil.rmtree(store)
    # xarray's annotation leaves out the reference dicts the refgrid engine also reads
    ds = xr.open_dataset(cast(Any, refs), engine="refgrid", chunks={},
                         storage_options=options)
    with _quiet_zarr():
        if not resuming:
            _create(ds, store, plan, codec, level)
        return _copy(refs, ds, group, store, plan, resuming, scheduler, workers, progress,
                     block_bytes, options)


@contextmanager
def _quiet_zarr() -> Iterator[None]:
    """Without zarr's warnings about what this store deliberately has: consolidated
    metadata (for one-request opens) and the journal directory beside the arrays."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component")
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not")
        yield


def _copy(refs: Input, ds: xr.Dataset, group: VirtualGroup, store: Path, plan: Plan,
          resuming: bool, scheduler: str | Untyped | None, workers: int | None,
          progress: bool | None, block_bytes: int,
          options: dict[str, object]) -> MaterializeResult:
    """Every block copied as stored, the other variables by xarray, then the mark."""
    journal = store / JOURNAL
    copied = {p for p in plan["chunks"] if _copies_as_stored(group, p, store)}
    blocks = [b for p in sorted(copied)
              for b in _blocks(group[p], plan["chunks"][p], block_bytes)]  # type: ignore[arg-type]
    others = sorted(set(plan["chunks"]) - copied)
    done = {f.name for f in (journal / "done").iterdir()} if resuming else set()
    todo = [b for b in blocks if b.name not in done]
    task = _Copy(refs, str(store), options, group)
    _run(task, todo, scheduler, workers, progress)
    for name in others:  # characters, strings, records: xarray writes them (small, rare)
        if f"xarray-{name}" not in done:
            part = ds[[name]].drop_vars([c for c in ds[[name]].coords if c != name])
            var = part[name].variable
            var.encoding = _kept_encoding(var.encoding)
            if var.ndim:  # dask chunks = the store's: no two writers share a chunk
                part = part.chunk(dict(zip(var.dims, plan["chunks"][name], strict=True)))
            part.to_zarr(store, mode="r+", consolidated=False, zarr_format=3)
            (journal / "done" / f"xarray-{name}").touch()
    write_file(journal / "complete.json", json.dumps({"blocks": len(blocks)}).encode())
    return MaterializeResult(store, plan["chunks"], len(blocks), len(todo),
                             len(blocks) - len(todo), tuple(others))


# -- the plan ----------------------------------------------------------------------------------

def _plan(group: VirtualGroup, chunks: Chunks, target: str | int, codec: str,
          level: int) -> Plan:
    if codec not in ("zstd", "zlib", "blosc", "none"):
        raise ArgumentError(f"codec {codec!r}: zstd, zlib, blosc or none")
    arrays = {p: a for p, a in group.walk() if isinstance(a, VirtualArray)}
    if any("/" in p for p in arrays):
        raise ArgumentError("materialize copies flat datasets; this one has groups")
    if isinstance(chunks, str) and chunks != "auto":
        raise ArgumentError(f"chunks={chunks!r}: 'auto' or {{dim: length}}")
    if isinstance(chunks, Mapping):
        dims = {d for a in arrays.values() for d in a.dims}
        unknown = sorted(set(chunks) - dims)
        if unknown:
            raise ArgumentError(f"chunks: no dimension {unknown[0]!r} (dimensions: "
                                f"{', '.join(sorted(dims))})")
    shapes = {p: _chunks_of(a, chunks, target) for p, a in arrays.items()}
    identities = sorted((u, sorted(i.items())) for u, i in group.sources.items())
    return {"chunks": shapes, "codec": [codec, level],
            "sources": hashlib.blake2b(repr(identities).encode(), digest_size=12).hexdigest()}


def _chunks_of(array: VirtualArray, chunks: Chunks, target: str | int) -> tuple[int, ...]:
    if not array.shape:
        return ()
    if chunks == "auto":
        if array.dtype.kind not in "biufcmM" or math.prod(array.shape) == 0:
            return tuple(max(n, 1) for n in array.shape)
        return advise_chunks(array, target).chunks
    lengths = []
    for d, (dim, n) in enumerate(zip(array.dims, array.shape, strict=True)):
        given = chunks.get(dim) if isinstance(chunks, Mapping) else None
        if given is not None and (not isinstance(given, int) or given < 1):
            raise ArgumentError(f"chunks[{dim!r}]={given!r}: a length >= 1")
        native = array.grid.axes[d].regular_size
        lengths.append(min(given or native or n, max(n, 1)))
    return tuple(lengths)


def _same_plan(journal: Path, plan: Plan) -> bool:
    try:
        return bool(json.loads((journal / "plan.json").read_text()) == json.loads(
            json.dumps(plan)))
    except (OSError, ValueError):
        return False


def _create(ds: xr.Dataset, store: Path, plan: Plan, codec: str, level: int) -> None:
    """The store's metadata, by xarray (which encodes attributes as xarray reads them
    back), and the journal."""
    encoding = {}
    for name, var in ds.variables.items():
        kept = _kept_encoding(var.encoding)
        if var.ndim:
            kept["chunks"] = plan["chunks"][cast(str, name)]  # the plan's names: strings
        kept["compressors"] = _compressors(codec, level)
        encoding[name] = kept
    store.mkdir(parents=True, exist_ok=True)
    (store / JOURNAL / "done").mkdir(parents=True, exist_ok=True)
    try:
        ds.to_zarr(store, mode="a", compute=False, zarr_format=3, encoding=encoding,
                   safe_chunks=False, consolidated=True)
    except RefgridError:
        raise
    except Exception as e:
        raise WriteError(f"{store}: cannot create the store: {type(e).__name__}: {e}") from e
    write_file(store / JOURNAL / "plan.json", json.dumps(plan).encode())


def _kept_encoding(encoding: Mapping[str, object]) -> dict[str, object]:
    """What of a variable's encoding the store keeps (see :data:`KEPT_ENCODING`)."""
    kept = {k: encoding[k] for k in KEPT_ENCODING if k in encoding}
    if _float32_packing(encoding):
        return {k: v for k, v in kept.items() if k in ("units", "calendar")}
    return kept


def _float32_packing(encoding: Mapping[str, object]) -> bool:
    """Packed with float32 factors: xarray unpacks such a variable to float32, but from a
    Zarr store, whose JSON attributes have no float32, to float64. Stored unpacked instead
    (float32), it reads back exactly as from the references."""
    factors = [encoding[k] for k in ("scale_factor", "add_offset") if k in encoding]
    return bool(factors) and all(np.asarray(f).dtype == np.float32 for f in factors)


def _compressors(codec: str, level: int) -> tuple[BytesBytesCodec, ...] | None:
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    if codec == "none":
        return None
    if codec == "zlib":
        return (GzipCodec(level=level),)
    if codec == "blosc":
        return (BloscCodec(clevel=level),)
    return (ZstdCodec(level=level),)


def _copies_as_stored(group: VirtualGroup, path: str, store: Path) -> bool:
    """Whether the store keeps ``path``'s stored values as they are (same shape and type)."""
    import zarr

    array = group[path]
    assert isinstance(array, VirtualArray)
    if array.dtype.kind not in "biufc":
        return False
    try:
        target = zarr.open_array(store, path=path, mode="r")
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return bool(tuple(target.shape) == array.shape and np.dtype(target.dtype)
                == array.value_dtype)


def _blocks(array: VirtualArray, chunks: tuple[int, ...], block_bytes: int) -> Iterator[Block]:
    """Blocks of whole target chunks: slabs of chunk rows along the first dimension (whole
    along the others) of about ``block_bytes``, or single chunks when one row is larger."""
    if not array.shape:
        yield Block(array.name, ())
        return
    row = chunks[0] * math.prod(array.shape[1:]) * array.dtype.itemsize
    if row <= block_bytes:
        step = chunks[0] * max(1, block_bytes // max(row, 1))
        for start in range(0, array.shape[0], step):
            yield Block(array.name, ((start, min(start + step, array.shape[0])),
                                     *((0, n) for n in array.shape[1:])))
        return
    counts = [math.ceil(n / c) for n, c in zip(array.shape, chunks, strict=True)]
    for index in np.ndindex(*counts):
        yield Block(array.name, tuple((i * c, min((i + 1) * c, n))
                                      for i, c, n in zip(index, chunks, array.shape,
                                                         strict=True)))


# -- the copy ----------------------------------------------------------------------------------

class _CopyState(TypedDict):
    """What a :class:`_Copy` pickles: the group is scanned again where it is unpickled."""

    refs: Input
    store: str
    options: dict[str, object]


class _Copy:
    """One block: read as stored by refgrid, write with zarr, record it. Picklable without
    its scanned group: a worker process scans the references once and keeps a reader per
    array."""

    def __init__(self, refs: Input, store: str, options: dict[str, object],
                 group: VirtualGroup | None = None) -> None:
        self.refs = refs
        self.store = store
        self.options = options
        self.group = group
        self.check: SourceCheck | None = None
        """One check of the sources for all arrays (each source checked once)."""
        self.readers: dict[str, tuple[ArrayReader, Array]] = {}

    def __getstate__(self) -> _CopyState:
        return {"refs": self.refs, "store": self.store, "options": self.options}

    def __setstate__(self, state: _CopyState) -> None:
        self.__init__(state["refs"], state["store"], state["options"])  # type: ignore[misc]

    def _reader(self, name: str) -> tuple[ArrayReader, Array]:
        found = self.readers.get(name)
        if found is None:
            import zarr

            if self.group is None:
                self.group = scan(self.refs, **cast("dict[str, Any]", self.options))
            if self.check is None and self.group.sources:
                self.check = SourceCheck(self.group.sources, self.options)
            array = self.group[name]
            assert isinstance(array, VirtualArray)
            target = zarr.open_array(self.store, path=name, mode="r+")
            found = self.readers[name] = (reader_of(array, name, self.options, self.check),
                                          target)
        return found

    def __call__(self, block: Block) -> str:
        reader, target = self._reader(block.variable)
        region = tuple(slice(a, b) for a, b in block.region)
        values = reader.read(region if region else ...)
        target[region if region else ...] = values
        Path(self.store, JOURNAL, "done", block.name).touch()
        return block.name


def _run(task: Callable[[Block], str], blocks: list[Block], scheduler: str | Untyped | None,
         workers: int | None, progress: bool | None) -> None:
    """Every block through ``task`` on dask, with a progress bar."""
    kind = scheduler_kind(scheduler)
    if not blocks:
        return
    bar = progress_bar(len(blocks), "materialize", "block", progress)
    try:
        if kind == "synchronous":
            for block in blocks:
                task(block)
                bar.update(1)
        elif kind == "local":
            import dask
            from dask.callbacks import Callback

            class _Progress(Callback):
                def _posttask(self, key: object, result: object, *_: object) -> None:
                    if isinstance(result, str):
                        bar.update(1)

            delayed = [dask.delayed(task, pure=False)(b) for b in blocks]
            with _Progress():
                dask.compute(*delayed, scheduler="threads",
                             num_workers=workers or os.cpu_count() or 1)
        else:
            with cluster(scheduler, "materialize on a dask cluster") as client:
                from distributed import as_completed

                for future in as_completed(client.map(task, blocks, pure=False)):
                    future.result()
                    bar.update(1)
    finally:
        bar.close()
