"""Reliability, reference sets: damaged references give a named error, never fill values."""

from __future__ import annotations

import json

import pytest
import xarray as xr

import refgrid
from helpers import FIXTURES

SOURCE = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"


def test_missing_record_file_of_a_refgrid_parquet_set_is_an_error(tmp_path):
    """A deleted refs.0.parq read as all fill values."""
    refs = refgrid.write(refgrid.scan(SOURCE), tmp_path / "refs.parq", record_size=4)
    (refs / "tas" / "refs.0.parq").unlink()
    with pytest.raises(refgrid.FormatError, match=r"'tas'.*refs\.0\.parq is missing"):
        xr.open_dataset(refs, engine="refgrid")


@pytest.mark.parametrize("damage", ["flipped", "deleted", "rows", "table"])
def test_a_damaged_source_table_is_an_error_at_the_first_read(tmp_path, damage):
    """The sources' identities are read (and checked against their digests) by the first
    read that checks a source: a damaged table is an error naming it there, never a read
    that skips the check."""
    group = refgrid.combine([refgrid.scan(FIXTURES / "monthly" / "chunk10" / f"tas_2001{m}.nc")
                             for m in ("01", "02", "03")], "time")
    refs = refgrid.write(group, tmp_path / "refs.parq", record_size=2)
    page = refs / ".sources" / "refs.1.parq"
    meta = json.loads((refs / ".zmetadata").read_text())
    if damage == "flipped":
        data = bytearray(page.read_bytes())
        data[len(data) // 2] ^= 1
        page.write_bytes(bytes(data))
    elif damage == "deleted":
        page.unlink()
    elif damage == "rows":
        meta["refgrid"]["source_table"]["rows"] = 2
        meta["refgrid"]["source_table"]["pages"] = meta["refgrid"]["source_table"]["pages"][:1]
    else:
        meta["refgrid"]["source_table"] = [3]
    (refs / ".zmetadata").write_text(json.dumps(meta))
    expected = {"flipped": r"\.sources/refs\.1\.parq.* does not match its digest",
                "deleted": r"\.sources/refs\.1\.parq.* cannot be read",
                "rows": "other source record files than the 1 that 2 sources fill",
                "table": 'is not {"rows": n, "page_rows"'}[damage]
    with pytest.raises(refgrid.FormatError, match=expected), \
            xr.open_dataset(refs, engine="refgrid") as ds:
        ds["tas"].load()


@pytest.mark.parametrize("record_size", [0, -3, "x"])
def test_unusable_record_size_is_a_format_error(tmp_path, record_size):
    """record_size=0 raised ZeroDivisionError."""
    refs = refgrid.write(refgrid.scan(SOURCE), tmp_path / "refs.parq")
    meta = json.loads((refs / ".zmetadata").read_text())
    (refs / ".zmetadata").write_text(json.dumps({**meta, "record_size": record_size}))
    with pytest.raises(refgrid.FormatError, match="record_size"):
        refgrid.scan(refs)


@pytest.mark.parametrize(("pieces", "expected"), [
    ({"time": 0}, "pieces is not arrays"), ({"time": True}, "pieces is not arrays"),
    ([64], "pieces is not arrays"), ({"time": 50}, r"holds 64 rows, not 50"),
    ({"time": 128}, r"holds 64 rows, not 92"), ({"time": 10**400}, r"not 92"),
    ({"tas": 64}, r"\.0\.parq is missing"), ("v2", "kerchunk's Zarr v2")])
def test_a_wrong_row_count_for_pieces_is_an_error_not_other_rows(tmp_path, monkeypatch,
                                                                 pieces, expected):
    """An array in record files of pieces (the concat coordinate: 92 pieces of 4 steps
    here, 64 a file) read with another row count took rows of the next pieces, or fill
    values, silently; a count of 10**400 made no record file at all."""
    monkeypatch.setattr("refgrid.model.virtual.INLINE_PIECE", 4)
    v2 = pieces == "v2"  # (refgrid's kerchunk v2 parquet: record files of record_size rows)
    if v2:
        refs = refgrid.write(refgrid.scan(SOURCE), tmp_path / "refs.parq",
                             format="kerchunk-v2")
    else:
        files = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc"
                 for m in range(1, 13)]
        group = refgrid.combine([str(f) for f in files], "time")
        assert group["time"].grid.chunk_counts == (92,)
        refs = refgrid.write(group, tmp_path / "refs.parq")
    meta = json.loads((refs / ".zmetadata").read_text())
    meta.setdefault("refgrid", {})["pieces"] = {"time": 64} if v2 else pieces
    (refs / ".zmetadata").write_text(json.dumps(meta))
    with pytest.raises(refgrid.FormatError, match=expected), \
            xr.open_dataset(refs, engine="refgrid") as ds:
        ds.load()


def test_chunk_keys_of_another_rank_are_not_read_as_this_arrays():
    """Keys are parsed in bulk: "1/2/3/4" next to "5/6" has as many parts as two 3-d keys,
    and must not become chunks (1, 2, 3) and (4, 5, 6). Keys no writer makes (an empty part,
    a sign, a superscript, a leading zero, a space) are not keys of the grid either: the same
    rule as :class:`refgrid.core.keys.KeyEncoding`."""
    from refgrid.core.keys import flat_indices

    counts = (8, 8, 8)
    assert flat_indices(["1/2/3/4", "5/6", "0/0/1"], counts).tolist() == [-1, -1, 1]
    assert flat_indices(["1//2", "0/0/9", "0/-1/0", "1/\u00b2/0", "01/0/0", " 1/0/0"],
                         counts).tolist() == [-1] * 6
    assert flat_indices(["3/4/5"] * 3, counts).tolist() == [229] * 3


@pytest.mark.parametrize("bad", [True, 1.5, -1, 2**63, "12", None])
def test_unusable_offsets_and_lengths_are_named(bad):
    refs = refgrid.to_kerchunk(refgrid.scan(SOURCE))
    key = next(k for k in refs["refs"] if k.startswith("tas/c/"))
    url, offset, length = refs["refs"][key]
    for broken in ([url, bad, length], [url, offset, bad]):
        damaged = {**refs, "refs": {**refs["refs"], key: broken}}
        with pytest.raises(refgrid.FormatError, match=r"tas.*0/0/0.*not an integer"):
            refgrid.scan(damaged)
