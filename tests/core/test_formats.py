"""The input formats are one table (``refgrid.core.formats.FORMATS``, #52): a format is its
scanner and one row, which detection, scanning, the engine, the service, batch/combine's
inputs and the command line all read. A toy format added as one row is accepted by each of
them with no other change."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import shutil

import fsspec
import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import refgrid
from helpers import FIXTURES, closed
from refgrid.codecs.filters import bytes_codec
from refgrid.core import formats
from refgrid.core.formats import FORMATS, InputFormat
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.scanners import detect_format
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source
from servers import http_get, start_refgrid_serve

TOY_MAGIC = b"TOY\x00"


def scan_toy(source: Source, options: ScanOptions) -> VirtualGroup:
    """A toy format's scanner: ``TOY\\0``, a count n (uint32), n little-endian float64s."""
    n = int.from_bytes(source.head(8)[4:8], "little")
    dtype = np.dtype("<f8")
    built = ManifestBuilder((1,))
    built.ranges([0], built.url(source.url), [8], [8 * n])
    array = VirtualArray("x", ("x",), dtype, RectilinearGrid.regular((n,), (n,)), built.build(),
                         np.float64(np.nan), (bytes_codec(dtype),), {"units": "toys"})
    return VirtualGroup({"title": "toy"}, {"x": array}, {}, (), {source.url: source.identity})


TOY = InputFormat("toy", "a toy file", f"{__name__}:scan_toy", suffixes=(".toy",),
                  sniff=lambda head: head.startswith(TOY_MAGIC), served=True, data=True)


@pytest.fixture
def toy(monkeypatch):
    """The table with the toy format's row added (as it was again after the test)."""
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, TOY))
    return TOY


def _toy_file(path, values) -> None:
    values = np.asarray(values, "<f8")
    path.write_bytes(TOY_MAGIC + len(values).to_bytes(4, "little") + values.tobytes())


def test_a_format_is_its_scanner_and_one_row(toy, tmp_path):
    values = np.arange(5.0) * 1.5
    _toy_file(tmp_path / "a.toy", values)
    (tmp_path / "b.bin").write_bytes(TOY_MAGIC + (3).to_bytes(4, "little") + bytes(24))

    # detection (by its bytes, whatever the name) and the scanner, imported when met
    assert detect_format(Source.of(tmp_path / "a.toy", {})) == "toy"
    assert detect_format(Source.of(tmp_path / "b.bin", {})) == "toy"
    group = refgrid.scan(tmp_path / "a.toy")
    assert group.attrs == {"title": "toy"} and group["x"].attrs["units"] == "toys"
    # every reader goes through the dispatcher: the engine, the mapper
    np.testing.assert_array_equal(
        closed(xr.open_dataset(tmp_path / "a.toy", engine="refgrid")).x.values, values)
    np.testing.assert_array_equal(closed(xr.open_dataset(
        refgrid.get_mapper(tmp_path / "a.toy"), engine="zarr")).x.values, values)

    # the command line (its scans run in worker processes)
    from refgrid.cli import main

    done = CliRunner().invoke(main, ["scan", str(tmp_path / "a.toy"), "-o",
                                     str(tmp_path / "a.json")])
    assert done.exit_code == 0, done.output
    np.testing.assert_array_equal(
        closed(xr.open_dataset(tmp_path / "a.json", engine="refgrid")).x.values, values)
    assert "or a toy file." in " ".join(CliRunner().invoke(main, ["scan", "--help"]).output
                                        .split())
    assert "/.dmrpp/.toy)" in CliRunner().invoke(main, ["serve", "--help"]).output

    # a directory of its files is a directory of data files: named by its pattern
    (tmp_path / "more").mkdir()
    for n in range(2):
        _toy_file(tmp_path / "more" / f"t{n}.toy", [n])
    with pytest.raises(refgrid.FormatError, match=r"holds 2 data file\(s\) \(t0.toy, t1.toy\)"
                                                  r".*\*\.toy"):
        refgrid.scan(tmp_path / "more")
    with pytest.raises(refgrid.DirectoryError, match=r"more/\*\.toy"):
        refgrid.combine([str(tmp_path / "more")], "x")


def test_the_service_finds_names_and_serves_a_format_of_one_row(toy, tmp_path):
    values = np.linspace(0, 1, 7)
    (tmp_path / "sub").mkdir()
    _toy_file(tmp_path / "sub" / "a.toy", values)
    _toy_file(tmp_path / ".hidden.toy", values)
    from refgrid.serve.catalog import discover

    found = discover(tmp_path.resolve())
    assert {name: entry.kind for name, entry in found.items()} == {"sub/a": "toy"}
    served = start_refgrid_serve(tmp_path)
    server = next(served)
    try:
        status, _, body = http_get(f"{server.url}/")
        assert status == 200 and b"sub/a" in body and b"toy" in body
        regular = closed(xr.open_dataset(fsspec.get_mapper(f"{server.url}/sub/a/regular"),
                                         engine="zarr"))
        np.testing.assert_array_equal(regular.x.values, values)
        status, _, body = http_get(f"{server.url}/dap/sub/a.ascii")
        assert status == 200 and b"0.5" in body, body
    finally:
        served.close()


def test_a_format_not_in_the_table_is_named_with_those_that_are():
    with pytest.raises(KeyError, match=r"no input format 'toy' \(.*hdf5, netcdf3"):
        formats.input_format("toy")


def test_every_row_names_a_scanner_that_exists_and_is_loaded_only_when_met(tmp_path):
    """Each scanner by its ``module:function``; scanning JSON references loads no other
    format's scanner (nor h5py)."""
    import importlib
    import subprocess
    import sys

    for row in FORMATS:
        module, _, function = row.scanner.partition(":")
        scanner = getattr(importlib.import_module(module), function)
        assert list(inspect.signature(scanner).parameters) == ["source", "options"], row.name
    refs = tmp_path / "refs.json"
    refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"), refs)
    code = (f"import refgrid, sys; refgrid.scan({str(refs)!r}); "
            "print(sorted(m for m in sys.modules if m.startswith(('refgrid.scanners.', "
            "'h5py'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = set(ast.literal_eval(done.stdout.strip()))
    scanners = {row.scanner.partition(":")[0] for row in FORMATS}
    assert loaded & scanners == {formats.input_format("json").scanner.partition(":")[0]}
    assert "h5py" not in loaded


def test_a_format_option_is_declared_once_and_taken_everywhere():
    """A row's option is a keyword of ``refgrid.scan`` and ``refgrid.batch``, a field of
    ``ScanOptions``, and a flag of ``refgrid scan`` and ``refgrid batch`` declared from the
    row (help text and all)."""
    from refgrid.cli import main

    options = formats.format_options()
    assert [o.keyword for o in options] == ["data_url"]
    fields = {f.name for f in dataclasses.fields(ScanOptions)}
    for option in options:
        assert option.keyword in fields
        for function in (refgrid.scan, refgrid.batch):
            assert option.keyword in inspect.signature(function).parameters, function
        for command in ("scan", "batch"):
            [param] = [p for p in main.commands[command].params if p.name == option.keyword]
            assert param.opts == [option.flag] and param.help == option.help


def test_the_help_lists_the_formats_of_the_table():
    from refgrid.cli import main

    runner = CliRunner()
    scan_help = " ".join(runner.invoke(main, ["scan", "--help"]).output.split())
    for row in FORMATS:
        assert " ".join(row.title.split()) in scan_help, row.name
    serve_help = " ".join(runner.invoke(main, ["serve", "--help"]).output.split())
    assert "without .json/.zarr/.parq/.parquet/.dmrpp)" in serve_help
    for row in formats.served():
        assert row.title in serve_help, row.name
    assert "HDF5/NetCDF4 file" not in serve_help  # (not served: scanned, then written)


def test_the_catalog_calls_a_directory_what_the_dispatcher_does(tmp_path):
    """A directory holding both ``zarr.json`` and ``.zmetadata`` is read as a Zarr store by
    the dispatcher; the catalog called it parquet references (its own list, tried the
    other way round), and stamped it by the wrong file."""
    from refgrid.serve.catalog import discover, stamp_of

    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    closed(xr.open_dataset(source)).to_zarr(tmp_path / "both.zarr", zarr_format=3,
                                            consolidated=False)
    refgrid.write(refgrid.scan(source), tmp_path / "refs.parq")
    shutil.copy(tmp_path / "refs.parq" / ".zmetadata", tmp_path / "both.zarr" / ".zmetadata")
    found = discover(tmp_path.resolve())
    assert {n: e.kind for n, e in found.items()} == {"both": "zarr", "refs": "parquet"}
    for entry in found.values():
        assert entry.kind == detect_format(Source.of(entry.path, {}))
    zarr_json = (tmp_path / "both.zarr" / "zarr.json").stat()
    assert stamp_of(tmp_path / "both.zarr")[2] == zarr_json.st_ino
