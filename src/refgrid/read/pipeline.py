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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zarr.abc.codec import CodecPipeline
from zarr.core.codec_pipeline import BatchedCodecPipeline

if TYPE_CHECKING:
    from refgrid.model.virtual import VirtualArray
    from refgrid.read.views import NativeView

PATH = "refgrid.read.pipeline.RefgridCodecPipeline"
"""The value of zarr's ``codec_pipeline.path`` that selects this pipeline."""
WORKERS = 4
"""Threads one read is split over (decompression releases the GIL)."""
SMALLEST_PART = 64
"""Chunks below which a read is not split further."""


@dataclass(frozen=True)
class _Chunk:
    flat: int
    spec: Any
    chunk_selection: Any
    out_selection: Any


class RefgridCodecPipeline(CodecPipeline):
    """zarr's batched pipeline, with reads of refgrid stores done by refgrid."""

    def __init__(self, inner: CodecPipeline) -> None:
        self.inner = inner

    @classmethod
    def from_codecs(cls, codecs: Iterable[Any]) -> RefgridCodecPipeline:
        return cls(BatchedCodecPipeline.from_codecs(codecs))

    def evolve_from_array_spec(self, array_spec: Any) -> RefgridCodecPipeline:
        return type(self)(self.inner.evolve_from_array_spec(array_spec))

    @property
    def supports_partial_decode(self) -> bool:
        return self.inner.supports_partial_decode

    @property
    def supports_partial_encode(self) -> bool:
        return self.inner.supports_partial_encode

    def validate(self, **kwargs: Any) -> None:
        self.inner.validate(**kwargs)

    def compute_encoded_size(self, byte_length: int, array_spec: Any) -> int:
        return self.inner.compute_encoded_size(byte_length, array_spec)

    async def decode(self, chunk_bytes_and_specs: Any) -> Any:
        return await self.inner.decode(chunk_bytes_and_specs)

    async def encode(self, chunk_arrays_and_specs: Any) -> Any:
        return await self.inner.encode(chunk_arrays_and_specs)

    async def write(self, batch_info: Any, value: Any, drop_axes: tuple[int, ...] = ()) -> None:
        await self.inner.write(batch_info, value, drop_axes)

    def __iter__(self) -> Any:
        return iter(self.inner)  # type: ignore[call-overload]

    async def read(self, batch_info: Any, out: Any, drop_axes: tuple[int, ...] = ()) -> Any:
        batch = list(batch_info)
        found = _refgrid_batch(batch)
        if found is None:
            return await self.inner.read(batch, out, drop_axes)
        from refgrid.core.util import thread_pool

        view, path, array, chunks = found
        loop = asyncio.get_running_loop()
        pool = thread_pool("refgrid-pipeline", WORKERS)
        blobs = await loop.run_in_executor(pool, _fetch, view, path, array, chunks)
        parts = max(1, min(WORKERS, len(chunks) // SMALLEST_PART))
        size = math.ceil(len(chunks) / parts)
        done = await asyncio.gather(*(
            loop.run_in_executor(pool, _decode_part, path, array, chunks[k:k + size], blobs,
                                 out, drop_axes) for k in range(0, len(chunks), size)))
        return tuple(result for part in done for result in part)


def _refgrid_batch(batch: list[Any]) -> tuple[NativeView, str, VirtualArray, list[_Chunk]] | None:
    """The view, array and chunks of a read refgrid does itself (None: zarr's pipeline)."""
    import sys

    if "refgrid.read.store" not in sys.modules:  # no refgrid store made in this process
        return None
    from refgrid.core.keys import chunk_of_key
    from refgrid.model.manifest import flat_index
    from refgrid.read.decode import decoded_by_zarr
    from refgrid.read.store import RefgridStore
    from refgrid.read.views import NativeView

    if not batch:
        return None
    first = batch[0][0]
    store = getattr(first, "store", None)
    if not isinstance(store, RefgridStore) or not isinstance(store.view, NativeView):
        return None
    view = store.view
    chunks: list[_Chunk] = []
    path = None
    for getter, spec, chunk_selection, out_selection, _ in batch:
        found = chunk_of_key(getattr(getter, "path", ""), view.arrays) \
            if getattr(getter, "store", None) is store else None
        if found is None or (path is not None and found[0] != path):
            return None
        path = found[0]
        array = view.arrays[path]
        coords = tuple(int(c) for c in found[1].split("/")) if found[1] else ()
        chunks.append(_Chunk(flat_index(coords, array.manifest.shape), spec, chunk_selection,
                             out_selection))
    assert path is not None
    if path in view.unpacked:
        return None  # served unpacked: decoded by the view, read by zarr's pipeline
    array = view.arrays[path]
    if decoded_by_zarr(array.codecs, array.dtype):
        return None  # strings, records, filters: zarr's pipeline (the store checks them)
    return view, path, array, chunks


def _fetch(view: NativeView, path: str, array: VirtualArray, chunks: list[_Chunk]
           ) -> dict[int, bytes | None]:
    """The stored bytes of ``chunks`` in one fetch: its ranges coalesced per file into as few
    requests as the runs of neighbouring chunks (blocking: on a worker thread)."""
    from refgrid.core.keys import chunk_key
    from refgrid.errors import ReadError
    from refgrid.model.manifest import chunk_coords

    manifest = array.manifest
    kinds = manifest.path_id.reshape(-1)
    stored = [c.flat for c in chunks if kinds[c.flat] >= 0]
    try:
        return dict(zip(stored, view.fetch(path, stored), strict=True)) if stored else {}
    except ReadError as e:  # a source changed, say: name a chunk of it, as zarr's reads do
        if " chunk " in str(e):
            raise
        named = next((f for f in stored if manifest.paths[int(kinds[f])] in str(e)), stored[0])
        raise ReadError(f"array {path!r}, chunk "
                        f"{chunk_key(path, chunk_coords(named, manifest.shape))}: {e}") from e


def _decode_part(path: str, array: VirtualArray, chunks: list[_Chunk],
                 blobs: dict[int, bytes | None], out: Any, drop_axes: tuple[int, ...]
                 ) -> list[Any]:
    """Decode, crop and copy out ``chunks`` (blocking: on a worker thread). Chunks of one
    stored shape are decompressed in one call of refgrid's batch decoder."""
    from refgrid.core.keys import chunk_key
    from refgrid.errors import ReadError
    from refgrid.model.manifest import INLINE, MISSING, chunk_coords
    from refgrid.read.decode import ChunkDecodeError, chunk_decoder

    manifest = array.manifest
    kinds = manifest.path_id.reshape(-1)
    results: list[Any] = [{"status": "present"}] * len(chunks)
    shapes: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
    for k, chunk in enumerate(chunks):
        if kinds[chunk.flat] == MISSING or (kinds[chunk.flat] >= 0 and
                                            blobs[chunk.flat] is None):  # an absent file
            out[chunk.out_selection] = _fill(chunk.spec)
            results[k] = {"status": "missing"}
            continue
        coords = chunk_coords(chunk.flat, manifest.shape)
        shapes.setdefault(array.grid.encoded_chunk_shape(coords), []).append((k, coords))
    for encoded, members in shapes.items():
        decoder = chunk_decoder(array.codecs, array.dtype, encoded)
        datas = [manifest.inline[coords] if kinds[chunks[k].flat] == INLINE else
                 blobs[chunks[k].flat] for k, coords in members]
        try:
            raw = decoder.decompress_many(datas, math.prod(encoded) * decoder.stored.itemsize)
        except ChunkDecodeError as e:
            k, coords = members[e.index]
            source = "inline" if kinds[chunks[k].flat] == INLINE else \
                manifest.paths[int(kinds[chunks[k].flat])]
            raise ReadError(f"array {path!r}, chunk {chunk_key(path, coords)} ({source}): "
                            f"cannot decode: {e}") from None
        values = raw.view(decoder.stored).reshape(len(members), *encoded)
        for i, (k, _) in enumerate(members):
            chunk = chunks[k]
            selected = values[i][tuple(slice(0, n) for n in chunk.spec.shape)][
                chunk.chunk_selection]  # padded chunks: cropped first
            out[chunk.out_selection] = selected.squeeze(axis=drop_axes) if drop_axes \
                else selected
    return results


def _fill(spec: Any) -> Any:
    """A missing chunk's value: the array's fill value, else its data type's default (as
    zarr's own pipeline fills)."""
    if spec.fill_value is not None:
        return spec.fill_value
    return spec.dtype.default_scalar()


def zarr_config() -> dict[str, Any]:
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

    config: dict[str, Any] = {"array.rectilinear_chunks": True}
    if Version(zarr.__version__) >= Version("3.4"):
        register_pipeline(RefgridCodecPipeline)  # also where no entry point is installed
        config["codec_pipeline.path"] = PATH
    return config
