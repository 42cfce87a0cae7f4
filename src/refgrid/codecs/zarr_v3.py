"""Zarr v3 codecs for the HDF5 filters zarr lacks: ``refgrid.lzf``, ``refgrid.szip``,
``refgrid.lz4h5``, ``refgrid.bitshuffle``, ``refgrid.shuffle`` (HDF5's shuffle, which also
accepts lengths that are not a multiple of the element size), and fixed-length strings read
as HDF5 reads them: ``refgrid.spacepad`` (space-padded), ``refgrid.nullterm`` (C strings,
which end at their first NUL) and ``refgrid.anypad`` (padding unknown: read where every
padding reads them alike).

They are registered through the ``zarr.codecs`` entry points in ``pyproject.toml``, so stock
zarr opens refgrid's references without the user importing anything.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from zarr.abc.codec import BytesBytesCodec
from zarr.core.common import JSON, parse_named_configuration

from refgrid.codecs.pipeline import REFGRID_CODECS, ByteCodec, byte_codec
from refgrid.core.util import lazy

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer


@dataclass(frozen=True)
class _RefgridCodec(BytesBytesCodec):
    """A bytes→bytes codec backed by :func:`refgrid.codecs.pipeline.byte_codec`, built once per
    codec object (zarr calls it for every chunk)."""

    codec_name: ClassVar[str]
    is_fixed_size = False
    configuration: dict[str, JSON] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        _, config = parse_named_configuration(data, cls.codec_name, require_configuration=False)
        return cls(configuration=dict(config or {}))

    def to_dict(self) -> dict[str, JSON]:
        return {"name": self.codec_name, "configuration": dict(self.configuration)}

    @lazy
    def _codec(self) -> ByteCodec:
        return byte_codec({"name": self.codec_name, "configuration": dict(self.configuration)})

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        nbytes = math.prod(chunk_spec.shape) * chunk_spec.dtype.to_native_dtype().itemsize
        decoded = self._codec.decode(chunk_bytes.to_bytes(), nbytes)
        return chunk_spec.prototype.buffer.from_bytes(decoded)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)

    def _encode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        encoded = self._codec.encode(chunk_bytes.to_bytes())
        return chunk_spec.prototype.buffer.from_bytes(encoded)

    async def _encode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        return await asyncio.to_thread(self._encode_sync, chunk_bytes, chunk_spec)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError(f"{self.codec_name} output has no fixed size")


def _codec_class(name: str) -> type[_RefgridCodec]:
    """The class of one codec, named as its entry point names it (``refgrid.lz4h5``:
    ``Lz4H5``)."""
    return type(name.removeprefix("refgrid.").title(), (_RefgridCodec,), {"codec_name": name})


Lzf, Szip, Lz4H5, Bitshuffle, Shuffle, Spacepad, Nullterm, Anypad = map(_codec_class,
                                                                      REFGRID_CODECS)
