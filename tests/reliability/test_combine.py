"""Reliability, combining: a combine that cannot be right is an error naming the cause."""

from __future__ import annotations

import pytest

import refgrid
from helpers import FIXTURES

MONTHS = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2, 3)]


@pytest.mark.parametrize("identical", [True, False])
def test_combine_along_a_dimension_no_file_has(identical):
    """It returned one file's data when the files were identical (and a misleading message
    otherwise)."""
    files = [MONTHS[0]] * 3 if identical else MONTHS
    with pytest.raises(refgrid.CombineError, match=r"dimension 'depth'.*dimensions: .*time"):
        refgrid.combine([refgrid.scan(f) for f in files], concat_dim="depth")
