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


@pytest.mark.parametrize("record_size", [0, -3, "x"])
def test_unusable_record_size_is_a_format_error(tmp_path, record_size):
    """record_size=0 raised ZeroDivisionError."""
    refs = refgrid.write(refgrid.scan(SOURCE), tmp_path / "refs.parq")
    meta = json.loads((refs / ".zmetadata").read_text())
    (refs / ".zmetadata").write_text(json.dumps({**meta, "record_size": record_size}))
    with pytest.raises(refgrid.FormatError, match="record_size"):
        refgrid.scan(refs)
