"""numcodecs codecs for refgrid's HDF5 codecs, as Zarr v2 metadata names them.

Classic kerchunk output (:mod:`refgrid.refs.kerchunk_v2`) names ``refgrid.lzf``,
``refgrid.szip``, ``refgrid.lz4h5``, ``refgrid.bitshuffle``, ``refgrid.shuffle`` and the string
codecs ``refgrid.spacepad``, ``refgrid.nullterm``, ``refgrid.anypad`` in ``.zarray``;
numcodecs finds these classes through the ``numcodecs.codecs`` entry points in
``pyproject.toml``, so stock zarr (v2 mode) and kerchunk read them with refgrid installed and
nothing imported. A v2 codec is not told the chunk's size, so the writer records it
(``nbytes``): HDF5's filters need it to decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numcodecs.abc

from refgrid.codecs.pipeline import REFGRID_CODECS, byte_codec

if TYPE_CHECKING:
    from typing_extensions import Buffer

class _SizedCodec(numcodecs.abc.Codec):
    """One of refgrid's byte codecs with a fixed decoded size (Zarr v2 chunks are all the
    shape of the grid, edge chunks included)."""

    codec_id: str

    def __init__(self, nbytes: int, **configuration: object) -> None:
        self.nbytes = int(nbytes)
        self.configuration = configuration
        self._codec = byte_codec({"name": self.codec_id, "configuration": configuration})

    def encode(self, buf: Buffer) -> bytes:
        return self._codec.encode(bytes(memoryview(buf).cast("B")))

    def decode(self, buf: Buffer, out: Buffer | None = None) -> Buffer:
        decoded = self._codec.decode(bytes(memoryview(buf).cast("B")), self.nbytes)
        return numcodecs.compat.ndarray_copy(decoded, out) if out is not None else decoded

    def get_config(self) -> dict[str, object]:
        return {"id": self.codec_id, "nbytes": self.nbytes, **self.configuration}


def _codec_class(codec_id: str) -> type[_SizedCodec]:
    return type(codec_id.removeprefix("refgrid.").title(), (_SizedCodec,), {"codec_id": codec_id})


Lzf, Szip, Lz4H5, Bitshuffle, Shuffle, Spacepad, Nullterm, Anypad = map(_codec_class,
                                                                      REFGRID_CODECS)
