"""A zarr codec pipeline that reads a refgrid store's chunks with refgrid's reader.

zarr spends a few hundred microseconds of its own on every chunk it decodes — the floor a
store alone cannot pass, many times what a small chunk costs to inflate. zarr lets a library
plug its own pipeline (``codec_pipeline.path``, as the ``zarrs`` package does); this one,
named by :func:`refgrid.zarr_config`, takes a read whose chunks all come from a
:class:`~refgrid.read.store.RefgridStore`'s native view and does it the way refgrid's engine
does: the chunks' byte ranges fetched together (coalesced per file, concurrent for remote
files, sources checked), decompressed on a few threads by refgrid's decoders (libdeflate,
bounded), each decoded at its stored shape and cropped (chunks padded inside the array
included), then copied into zarr's output. Anything else — other stores, writes, codecs
refgrid does not decode itself (strings, filters) — goes to zarr's own pipeline unchanged.

zarr imports every pipeline registered through the ``zarr.codec_pipeline`` entry point the
first time it makes one, for any store: this module therefore imports nothing of refgrid's
readers until a read of a refgrid store reaches it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from zarr.abc.codec import CodecPipeline
from zarr.core.codec_pipeline import BatchedCodecPipeline

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.abc.store import ByteGetter, ByteSetter
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from refgrid.read.native import NativeView

PATH = "refgrid.read.pipeline.RefgridCodecPipeline"
"""The value of zarr's ``codec_pipeline.path`` that selects this pipeline."""
WORKERS = 4
"""Threads one read is split over (decompression releases the GIL)."""
SMALLEST_PART = 64
"""Chunks below which a read is not split further."""
Read = tuple["ByteGetter", "ArraySpec", "SelectorTuple", "SelectorTuple", bool]
"""What zarr hands a pipeline's ``read`` for each chunk: its getter, spec and selections."""
Batch = list[Read]
Write = tuple["ByteSetter", "ArraySpec", "SelectorTuple", "SelectorTuple", bool]
"""What zarr hands a pipeline's ``write`` for each chunk: its setter, spec and selections."""
Result = dict[str, str]
"""zarr's ``GetResult`` (>= 3.4) of one chunk: ``{"status": "present" | "missing"}``."""


@dataclass(frozen=True)
class _Chunk:
    flat: int
    coords: tuple[int, ...]
    spec: ArraySpec
    chunk_selection: SelectorTuple
    out_selection: SelectorTuple


class RefgridCodecPipeline(CodecPipeline):
    """zarr's batched pipeline, with reads of refgrid stores done by refgrid."""

    def __init__(self, inner: CodecPipeline) -> None:
        self.inner = inner

    @classmethod
    def from_codecs(cls, codecs: Iterable[Codec]) -> RefgridCodecPipeline:
        return cls(BatchedCodecPipeline.from_codecs(codecs))

    def evolve_from_array_spec(self, array_spec: ArraySpec) -> RefgridCodecPipeline:
        return type(self)(self.inner.evolve_from_array_spec(array_spec))

    @property
    def supports_partial_decode(self) -> bool:
        return self.inner.supports_partial_decode

    @property
    def supports_partial_encode(self) -> bool:
        return self.inner.supports_partial_encode

    def validate(self, **kwargs: Any) -> None:  # chunk_grid's type differs in zarr 3.1 and 3.4
        self.inner.validate(**kwargs)

    def compute_encoded_size(self, byte_length: int, array_spec: ArraySpec) -> int:
        return self.inner.compute_encoded_size(byte_length, array_spec)

    async def decode(self, chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]
                     ) -> Iterable[NDBuffer | None]:
        return await self.inner.decode(chunk_bytes_and_specs)

    async def encode(self, chunk_arrays_and_specs: Iterable[tuple[NDBuffer | None, ArraySpec]]
                     ) -> Iterable[Buffer | None]:
        return await self.inner.encode(chunk_arrays_and_specs)

    async def write(self, batch_info: Iterable[Write], value: NDBuffer,
                    drop_axes: tuple[int, ...] = ()) -> None:
        await self.inner.write(batch_info, value, drop_axes)

    def __iter__(self) -> Iterator[Codec]:
        return iter(cast("Iterable[Codec]", self.inner))  # zarr's are; its ABC does not say

    async def read(self, batch_info: Iterable[Read], out: NDBuffer,
                   drop_axes: tuple[int, ...] = ()
                   ) -> Any:  # zarr 3.1: None; >= 3.4: a GetResult per chunk
        batch: Batch = list(batch_info)
        found = _refgrid_batch(batch)
        if found is None:
            return await self.inner.read(batch, out, drop_axes)
        from refgrid.core.util import thread_pool

        view, path, chunks = found
        loop = asyncio.get_running_loop()
        pool = thread_pool("refgrid-pipeline", WORKERS)
        blobs = await loop.run_in_executor(pool, _fetch, view, path, chunks)
        parts = max(1, min(WORKERS, len(chunks) // SMALLEST_PART))
        size = math.ceil(len(chunks) / parts)
        done = await asyncio.gather(*(
            loop.run_in_executor(pool, _decode_part, view, path, chunks[k:k + size], blobs,
                                 out, drop_axes) for k in range(0, len(chunks), size)))
        return tuple(result for part in done for result in part)


def _refgrid_batch(batch: Batch) -> tuple[NativeView, str, list[_Chunk]] | None:
    """The native view, array and chunks of a read refgrid does itself (None: zarr's
    pipeline). A refgrid store says so by its ``native_view`` (no import of refgrid's readers
    for other stores)."""
    if not batch:
        return None
    store = getattr(batch[0][0], "store", None)
    view = getattr(store, "native_view", None)
    if view is None:
        return None
    first = view.tree.locate(getattr(batch[0][0], "path", ""))
    if first is None or first.array in view.unpacked or first.array in view.checked_arrays:
        return None  # decoded by the view, or by zarr's own codecs (strings, filters): zarr
    chunks: list[_Chunk] = []  # reads them through the store, which parses their keys
    for k, (getter, spec, chunk_selection, out_selection, _) in enumerate(batch):
        if getattr(getter, "store", None) is not store:
            return None
        parsed = view.tree.locate(getattr(getter, "path", "")) if k else first  # (not held:
        # filled here)
        if parsed is None or parsed.array != first.array:
            return None
        chunks.append(_Chunk(parsed.flat, parsed.coords, spec, chunk_selection,
                             out_selection))
    return view, first.array, chunks


def _fetch(view: NativeView, path: str, chunks: list[_Chunk]) -> dict[int, bytes | None]:
    """The stored bytes of ``chunks`` in one fetch: its ranges coalesced per file into as few
    requests as the runs of neighbouring chunks (blocking: on a worker thread)."""
    flats = [c.flat for c in chunks]
    kinds = view.arrays[path].manifest.locate(flats).path_id
    stored = [flat for flat, kind in zip(flats, kinds.tolist(), strict=True) if kind >= 0]
    return dict(zip(stored, view.fetch(path, stored), strict=True)) if stored else {}


def _decode_part(view: NativeView, path: str, chunks: list[_Chunk],
                 blobs: dict[int, bytes | None], out: NDBuffer, drop_axes: tuple[int, ...]
                 ) -> list[Result]:
    """Decode, crop and copy out ``chunks`` (blocking: on a worker thread): chunks of one
    stored shape decoded as one batch by refgrid's decoder (the engine's)."""
    from refgrid.model.manifest import INLINE, MISSING
    from refgrid.read.decode import ChunkDecodeError

    array = view.arrays[path]
    manifest = array.manifest
    kinds = manifest.locate([c.flat for c in chunks]).path_id.tolist()
    reader = view.stored_reader(path)
    results: list[Result] = [{"status": "present"}] * len(chunks)
    shapes: dict[tuple[int, ...], list[int]] = {}
    for k, chunk in enumerate(chunks):
        if kinds[k] == MISSING or (kinds[k] >= 0 and blobs[chunk.flat] is None):  # absent
            out[chunk.out_selection] = _fill(chunk.spec)
            results[k] = {"status": "missing"}
            continue
        shapes.setdefault(array.grid.encoded_chunk_shape(chunk.coords), []).append(k)
    for encoded, members in shapes.items():
        datas = [manifest.inline_chunk(chunks[k].flat) if kinds[k] == INLINE else
                 cast("bytes", blobs[chunks[k].flat]) for k in members]  # (absent: filled)
        try:
            values = reader.decoder.decode_many(datas, encoded)
        except ChunkDecodeError as e:
            reader.fail(chunks[members[e.index]].flat, e)
        for i, k in enumerate(members):
            chunk = chunks[k]
            selected = values[i][tuple(slice(0, n) for n in chunk.spec.shape)][
                chunk.chunk_selection]  # padded chunks: cropped first
            out[chunk.out_selection] = selected.squeeze(axis=drop_axes) if drop_axes \
                else selected
    return results


def _fill(spec: ArraySpec) -> object:
    """A missing chunk's value: the array's fill value, else its data type's default (as
    zarr's own pipeline fills)."""
    if spec.fill_value is not None:
        return spec.fill_value
    return spec.dtype.default_scalar()


def zarr_config() -> dict[str, object]:
    """The zarr configuration refgrid recommends, for ``zarr.config.set(...)``:

    * ``array.rectilinear_chunks``: rectilinear chunk grids on (zarr >= 3.2), what refgrid's
      archives of irregular files need;
    * ``codec_pipeline.path``: on zarr >= 3.4, this pipeline, which reads the chunks of a
      refgrid store with refgrid's reader — fetched together, decoded on threads — and hands
      every other read and write to zarr's own pipeline.
    """
    import zarr
    from packaging.version import Version
    from zarr.registry import register_pipeline

    config: dict[str, object] = {"array.rectilinear_chunks": True}
    if Version(zarr.__version__) >= Version("3.4"):
        register_pipeline(RefgridCodecPipeline)  # also where no entry point is installed
        config["codec_pipeline.path"] = PATH
    return config
