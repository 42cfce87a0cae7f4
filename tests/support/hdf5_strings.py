"""HDF5 files of fixed-length strings whose stored bytes are not what HDF5 reads: C strings
(``H5T_STR_NULLTERM``) holding bytes after their NUL, space-padded strings — alone, as
compound members, as array elements — written with h5py's low-level API (its high-level API
writes null-padded strings only), and h5py's read of them (the ground truth)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

STORED = [b"swe\x00et", b"ab\x00\x00cd", b"abcdef", b"x\x00yz", b"\x00zzzzz"]
"""What the C strings hold: h5py reads ``b"swe"``, ``b"ab"``, ``b"abcdef"``, ``b"x"``,
``b""``."""


def _string(size: int, pad: int) -> h5py.h5t.TypeID:
    kind = h5py.h5t.C_S1.copy()
    kind.set_size(size)
    kind.set_strpad(pad)
    return kind


def _dataset(f: h5py.File, name: str, kind: h5py.h5t.TypeID, values: np.ndarray,
             chunks: tuple[int, ...] | None = None, elements: int = 1) -> None:
    """``values`` stored byte for byte (the memory type is the file's: no conversion), the
    last ``elements`` axes each element's."""
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if chunks is not None:
        plist.set_chunk(chunks)
        plist.set_deflate(4)
    shape = values.shape[:values.ndim + 1 - elements]
    d = h5py.h5d.create(f.id, name.encode(), kind, h5py.h5s.create_simple(shape),
                        dcpl=plist)
    d.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(values), mtype=kind)


def write_c_strings(path: Path) -> Path:
    """``strings`` (chunked, deflated), ``contiguous`` and ``records`` (a C-string member
    of a compound Zarr can type)."""
    c6 = _string(6, h5py.h5t.STR_NULLTERM)
    values = np.array(STORED, dtype="S6")
    with h5py.File(path, "w") as f:
        _dataset(f, "strings", c6, values, chunks=(2,))
        _dataset(f, "contiguous", c6, values)
        record = h5py.h5t.create(h5py.h5t.COMPOUND, 10)
        record.insert(b"n", 0, h5py.h5t.STD_I32LE)
        record.insert(b"name", 4, c6)
        _dataset(f, "records", record, np.array(list(enumerate(STORED)),
                                                dtype=[("n", "<i4"), ("name", "S6")]),
                 chunks=(3,))
    return path


def write_string_members(path: Path) -> Path:
    """``grid`` (elements that are arrays of two C strings), ``nested`` (a compound with a
    C string and a C-string array member, stored as raw bytes) and ``padded_records`` (a
    space-padded member)."""
    c6, c3 = _string(6, h5py.h5t.STR_NULLTERM), _string(3, h5py.h5t.STR_NULLTERM)
    with h5py.File(path, "w") as f:
        pair = h5py.h5t.array_create(c3, (2,))
        pairs = np.array([[b"a\x00b", b"cd\x00"], [b"efg", b"\x00hi"]], dtype="S3")
        _dataset(f, "grid", pair, pairs, elements=2)
        nested = h5py.h5t.create(h5py.h5t.COMPOUND, 16)
        nested.insert(b"n", 0, h5py.h5t.STD_I32LE)
        nested.insert(b"name", 4, c6)
        nested.insert(b"pair", 10, pair)
        _dataset(f, "nested", nested, np.array(
            [(k, s, pairs[k % 2]) for k, s in enumerate(STORED)],
            dtype=[("n", "<i4"), ("name", "S6"), ("pair", "S3", (2,))]))
        padded = h5py.h5t.create(h5py.h5t.COMPOUND, 10)
        padded.insert(b"n", 0, h5py.h5t.STD_I32LE)
        padded.insert(b"name", 4, _string(6, h5py.h5t.STR_SPACEPAD))
        _dataset(f, "padded_records", padded, np.array(
            [(1, b"ab    "), (2, b"a b   "), (3, b"abcdef")],
            dtype=[("n", "<i4"), ("name", "S6")]))
    return path


def h5py_values(path: Path) -> dict[str, np.ndarray]:
    """h5py's read of every dataset."""
    with h5py.File(path, "r") as f:
        return {name: np.asarray(f[name][()]) for name in f}


def same_strings(ours: np.ndarray, expected: np.ndarray) -> bool:
    """Equal values, records and array members compared member by member."""
    return repr(np.asarray(ours).tolist()) == repr(np.asarray(expected).tolist())
