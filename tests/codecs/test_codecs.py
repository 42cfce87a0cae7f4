"""The codec table and the decoders, piece by piece: HDF5 filter → codec JSON, the
byte-level codecs against what HDF5 (through h5py and hdf5plugin) writes and reads, the
batch decoder's size checks."""

from __future__ import annotations

import zlib

import h5py
import hdf5plugin
import numpy as np
import pytest

import refgrid
from refgrid.codecs.bounded import ONE_CALL_BYTES, TINY_LIMIT, TooLarge, inflate_many
from refgrid.codecs.filters import UnsupportedFilter, bytes_codec, hdf5_pipeline
from refgrid.codecs.pipeline import (
    ChunkCodec,
    byte_codec,
    hdf5_shuffle_decode,
    hdf5_shuffle_encode,
    unshuffle,
)
from refgrid.read.decode import LIBDEFLATE_FROM, ChunkDecodeError, chunk_decoder


def test_hdf5_pipelines_become_zarr_v3_codec_lists():
    f4 = np.dtype("<f4")
    assert hdf5_pipeline([(2, [4]), (1, [6]), (3, [])], f4) == [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "numcodecs.shuffle", "configuration": {"elementsize": 4}},
        {"name": "numcodecs.zlib", "configuration": {"level": 6}},
        {"name": "numcodecs.fletcher32", "configuration": {}}]
    # a shuffle after another filter sees bytes of any length: HDF5's semantics
    assert hdf5_pipeline([(1, [4]), (2, [4])], f4)[2]["name"] == "refgrid.shuffle"
    assert bytes_codec(np.dtype(">i2")) == {"name": "bytes", "configuration": {"endian": "big"}}
    assert bytes_codec(np.dtype("u1")) == {"name": "bytes"}
    with pytest.raises(UnsupportedFilter, match=r"HDF5 filter 5 \(nbit\) has no Zarr codec"):
        hdf5_pipeline([(5, [])], f4)
    with pytest.raises(UnsupportedFilter, match="bitshuffle with compression 9"):
        hdf5_pipeline([(32008, [0, 3, 4, 0, 9])], f4)
    with pytest.raises(ValueError, match="mixes byte orders"):
        bytes_codec(np.dtype([("a", "<i4"), ("b", ">i4")]))


FILTERS = {
    "lzf": {"compression": "lzf"},
    "shuffle+deflate": {"compression": "gzip", "shuffle": True},
    "bitshuffle": hdf5plugin.Bitshuffle(nelems=0, cname="none"),
    "bitshuffle+lz4": hdf5plugin.Bitshuffle(nelems=0, cname="lz4"),
    "bitshuffle+zstd": hdf5plugin.Bitshuffle(nelems=0, cname="zstd"),
    "bitshuffle, small blocks": hdf5plugin.Bitshuffle(nelems=64, cname="lz4"),
    "lz4 (HDF5 framing)": hdf5plugin.LZ4(),
    "fletcher32": {"fletcher32": True},
}


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("dtype", ["<i2", ">f8"])
def test_chunks_decode_and_encode_as_hdf5_does(tmp_path, name, dtype):
    """Chunks of 1003 elements (not a multiple of 8: bitshuffle leaves a tail unshuffled)."""
    options = FILTERS[name]
    kwargs = dict(options)
    values = (np.arange(2 * 1003) % 251 * 3).astype(dtype)
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=values, chunks=(1003,), **kwargs)
    array = refgrid.scan(path)["v"]
    assert isinstance(array, refgrid.VirtualArray)
    codec = ChunkCodec(array.codecs, array.dtype)
    copy = tmp_path / "copy.h5"
    with h5py.File(path, "r") as f, h5py.File(copy, "w") as g:
        g.create_dataset("v", shape=values.shape, dtype=dtype, chunks=(1003,), **kwargs)
        for k in range(2):
            _, stored = f["v"].id.read_direct_chunk((k * 1003,))
            decoded = codec.decode(stored, (1003,))
            np.testing.assert_array_equal(decoded, values[k * 1003:(k + 1) * 1003])
            # ... and what refgrid encodes, HDF5 decodes
            g["v"].id.write_direct_chunk((k * 1003,), codec.encode(decoded))
        np.testing.assert_array_equal(g["v"][...], values)


def test_hdf5_shuffle_keeps_a_remainder_in_place():
    data = bytes(range(23))  # 5 elements of 4 bytes and 3 bytes left over
    shuffled = hdf5_shuffle_encode(data, 4)
    body = np.frombuffer(data[:20], np.uint8).reshape(5, 4)
    assert shuffled == body.T.tobytes() + data[20:]
    assert hdf5_shuffle_decode(shuffled, 4) == data
    rows = np.frombuffer(shuffled * 3, np.uint8).reshape(3, 23)  # the batch form
    assert all(row.tobytes() == data for row in unshuffle(rows, 4))


@pytest.mark.parametrize("nbytes", [LIBDEFLATE_FROM // 2, LIBDEFLATE_FROM * 4])
def test_deflate_checks_the_decoded_size(nbytes):
    """libdeflate (from LIBDEFLATE_FROM bytes) and zlib alike: a chunk that inflates to more
    or fewer bytes than its shape is an error naming its place in the batch, never a chunk
    cut or read short."""
    codecs = [{"name": "bytes"}, {"name": "numcodecs.zlib", "configuration": {"level": 1}}]
    decoder = chunk_decoder(codecs, np.dtype("u1"))
    good = zlib.compress(bytes(range(256)) * (nbytes // 256))
    np.testing.assert_array_equal(decoder.decompress_many([good, good], nbytes)[1],
                                  np.frombuffer(bytes(range(256)) * (nbytes // 256), np.uint8))
    for bad in (zlib.compress(bytes(nbytes + 1)), zlib.compress(bytes(nbytes - 1))):
        with pytest.raises(ChunkDecodeError) as caught:
            decoder.decompress_many([good, bad], nbytes)
        assert caught.value.index == 1
    with pytest.raises(ChunkDecodeError, match="Error"):
        decoder.decompress_many([b"not deflate"], nbytes)


@pytest.mark.parametrize("limit", [TINY_LIMIT, 4 * TINY_LIMIT])
def test_a_batch_of_deflate_streams_is_bounded_as_one_stream_is(limit):
    """Inflated many at once (one C-level loop, tiny chunks one thread at a time): a stream
    past the limit is refused, whether it is short enough to inflate in one call or long
    enough to be stopped at the limit; a truncated one is an error; the others come back."""
    good = zlib.compress(bytes(range(200)) * 3)
    assert inflate_many([good] * 3, limit) == [bytes(range(200)) * 3] * 3
    short_bomb = zlib.compress(bytes(limit + 1), 9)
    long_bomb = zlib.compress(bytes(64 * ONE_CALL_BYTES), 9)
    assert len(long_bomb) * 1032 > ONE_CALL_BYTES
    for bomb in (short_bomb, long_bomb):
        with pytest.raises(TooLarge):
            inflate_many([good, bomb], limit)
    with pytest.raises(zlib.error):
        inflate_many([good, good[:-5]], limit)
    assert inflate_many([], limit) == []


def test_byte_codecs_are_built_once_and_unknown_ones_named():
    entry = {"name": "numcodecs.zstd", "configuration": {"level": 1}}
    assert byte_codec(entry) is byte_codec(dict(entry))
    with pytest.raises(KeyError, match="no byte-level codec for 'nope'"):
        byte_codec({"name": "nope"})
