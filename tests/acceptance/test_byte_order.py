"""Byte order in every cell: (dtype kind, byte order) x writer x reader, each value
compared with h5py's read of the source file.

A big-endian record written as a Zarr ``struct`` with ``bytes{endian: big}`` is read with
its fields swapped by zarr < 3.3 (3.1 ignores the codec's ``endian`` for records, 3.2 too),
and refgrid's own reader read it so as well: ``(1, 1.5)`` came back ``(16777216, 3.1e-319)``.
Records whose fields are not little-endian are now stored as raw bytes with their record type
in refgrid's bookkeeping: refgrid's readers show the records, a stock reader the exact bytes
(``np.frombuffer(raw, record_type)`` gives them back), never other values. Classic kerchunk
(Zarr v2) keeps each field's byte order in its type, so flat records stay typed there.

The expected outcome of each cell is the table :data:`EXPECTED`: ``values`` (every value
equal), ``bytes`` (a stock reader given raw bytes: the source's bytes exactly), ``omitted``
(DAP leaves records out and names them in ``refgrid_dap_omitted``) or ``refused`` (the reader
fails loudly on this output). Nothing else passes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import h5py
import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from zarr.storage import FsspecStore

import refgrid
from refgrid.core.dtypes import zarr_data_type, zarr_fill_value
from servers import start_refgrid_serve

ORDERS = {"little": "<", "big": ">"}
RECORDS = ("records", "nested", "array_members")
WRITERS = {"json": "json.json", "parquet": "parquet.parq", "kerchunk-v2": "v2.json",
           "icechunk": "repo.icechunk"}


def kinds(order: str) -> dict[str, tuple[np.dtype, np.ndarray]]:
    """One variable of each kind of type, in byte order ``order``: values whose bytes read
    in the other order are other values (1 → 16777216, 1.5 → 3.1e-319)."""
    o = order
    n = 6
    records = np.dtype([("a", o + "i4"), ("b", o + "f8")])
    nested = np.dtype([("a", o + "i2"), ("n", [("x", o + "f4"), ("y", o + "u8")])])
    members = np.dtype([("a", o + "i4"), ("m", o + "f8", (2,))])
    out: dict[str, tuple[np.dtype, np.ndarray]] = {
        "int16": (np.dtype(o + "i2"), np.arange(1, n + 1, dtype=o + "i2") * -3),
        "int32": (np.dtype(o + "i4"), np.arange(1, n + 1, dtype=o + "i4")),
        "uint64": (np.dtype(o + "u8"), np.arange(1, n + 1, dtype=o + "u8") * 2**40),
        "float32": (np.dtype(o + "f4"), np.arange(n, dtype=o + "f4") + 0.5),
        "float64": (np.dtype(o + "f8"), np.arange(n, dtype=o + "f8") * 1.5 + 1),
        "array": (np.dtype((o + "i4", (3,))), np.arange(1, 3 * n + 1, dtype=o + "i4")
                  .reshape(n, 3)),
        "enum": (h5py.enum_dtype({"RED": 1, "GREEN": 2, "BLUE": 3}, basetype=o + "i2"),
                 np.array([1, 2, 3, 3, 2, 1], o + "i2")),
        "string": (np.dtype("S5"), np.array([b"ab", b"cde", b"", b"fghij", b"k", b"xy"])),
    }
    values = np.zeros(n, records)
    values["a"], values["b"] = np.arange(1, n + 1), np.arange(n) + 1.5
    out["records"] = (records, values)
    values = np.zeros(n, nested)
    values["a"], values["n"]["x"], values["n"]["y"] = 7, np.arange(n) + 0.25, 2**40 + 3
    out["nested"] = (nested, values)
    values = np.zeros(n, members)
    values["a"], values["m"] = -5, np.arange(2 * n).reshape(n, 2) + 0.75
    out["array_members"] = (members, values)
    return out


def write_source(path: Path, order: str, chunks: tuple[int, ...] | None = (3,),
                 compression: str | None = None) -> Path:
    with h5py.File(path, "w") as f:
        for name, (dtype, values) in kinds(order).items():
            d = f.create_dataset(name, shape=(len(values),), dtype=dtype, chunks=chunks,
                                 compression=compression)
            d[...] = values
    return path


def truth(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path) as f:
        return {name: f[name][()] for name in f}


# -- the expected outcome of every cell ---------------------------------------------------------

def _expected(writer: str, reader: str, kind: str, order: str) -> str:
    if reader in ("dap2", "dap4"):
        return "omitted" if kind in RECORDS else "values"
    if kind not in RECORDS or reader in ("engine", "get_mapper", "served regular"):
        # refgrid's readers show records; the regular view serves them packed little-endian,
        # but records with array members, which zarr 3.1's record type cannot hold
        return "bytes" if kind == "array_members" and reader != "engine" else "values"
    if reader == "reference" and writer == "kerchunk-v2" and kind == "records":
        return "values"  # (a Zarr v2 record type keeps each field's byte order)
    return "values" if kind == "records" and order == "little" else "bytes"


READERS = {
    "json": ["engine", "open_store", "get_mapper", "reference", "served native",
             "served regular", "dap2", "dap4"],
    "parquet": ["engine", "open_store", "get_mapper", "reference", "served native",
                "served regular", "dap2", "dap4"],
    "kerchunk-v2": ["engine", "open_store", "get_mapper", "reference", "served native",
                    "served regular", "dap2", "dap4"],
    "icechunk": ["icechunk"],
}
REFUSED = {("parquet", "reference")}
"""fsspec's parquet references know Zarr v2 keys only: a loud KeyError, never values."""
EXPECTED = {(writer, reader, kind, order): "refused" if (writer, reader) in REFUSED
            else _expected(writer, reader, kind, order)
            for writer, readers in READERS.items() for reader in readers
            for kind in kinds("<") for order in ORDERS}


def outcome(got: Any, want: np.ndarray) -> str:
    """``values`` or ``bytes`` where ``got`` is exactly ``want``; an AssertionError otherwise."""
    got = np.asarray(got)
    if want.dtype.fields is not None and got.dtype.kind == "V" and got.dtype.fields is None:
        assert got.shape == want.shape and got.tobytes() == want.tobytes(), (got, want)
        return "bytes"
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.fields is not None:
        assert got.dtype.fields is not None and got.dtype.names == want.dtype.names
        for name in want.dtype.names:
            assert outcome(got[name], want[name]) == "values", name
        return "values"
    if want.dtype.kind == "S" and got.dtype.kind in "OU":
        got = got.astype("S")
    assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("=") or \
        want.dtype.kind == "S", (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)
    return "values"


# -- the outputs and the readers -------------------------------------------------------------

@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Any]:
    """Per byte order: the source, its truth, and each writer's output; one service over all."""
    root = tmp_path_factory.mktemp("byte_order")
    sources = root / "sources"
    sources.mkdir()
    served = root / "served"
    made: dict[str, Any] = {"root": served}
    for order, o in ORDERS.items():
        source = write_source(sources / f"{order}.h5", o)
        group = refgrid.scan(source)
        (served / order).mkdir(parents=True)
        made[order] = {"truth": truth(source)}
        for writer, name in WRITERS.items():
            if writer == "icechunk":
                from refgrid.writers.icechunk import local_repository

                repo = local_repository(root / order / name, [str(source)])
                refgrid.write(group, repo)
                made[order][writer] = repo
            else:
                made[order][writer] = refgrid.write(group, served / order / name,
                                                    format=writer)
    return made


@pytest.fixture(scope="module")
def server(outputs):
    yield from start_refgrid_serve(outputs["root"], allow_sources=(str(outputs["root"].parent),),
                                   recheck=0.0)


def _zarr_arrays(group: zarr.Group) -> dict[str, np.ndarray]:
    return {name: array[...] for name, array in group.arrays()}


def _dap(url: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with netCDF4.Dataset(url) as ds:
        omitted = ds.getncattr("refgrid_dap_omitted").split("; ")
        assert {entry.split(":")[0] for entry in omitted} == set(RECORDS), omitted
        for name, var in ds.variables.items():
            var.set_auto_maskandscale(False)
            var.set_auto_chartostring(False)
            values = np.asarray(var[...])
            if values.dtype.kind == "S" and values.ndim == 2:  # (DAP2: netCDF's characters)
                values = netCDF4.chartostring(values, encoding="bytes")
            unsigned = var.__dict__.get("_Unsigned")
            if unsigned == "true" and values.dtype.kind == "i":
                values = values.view(f"u{values.dtype.itemsize}")
            out[name] = values
    return out


def read(reader: str, out: Any, base: str) -> dict[str, np.ndarray]:
    """Every array of ``out`` as ``reader`` reads it (``base``: its URL in the service)."""
    if reader == "engine":
        with xr.open_dataset(out, engine="refgrid", mask_and_scale=False,
                             decode_times=False) as ds:
            return {name: ds[name].values for name in ds.variables}
    if reader == "open_store":
        return _zarr_arrays(zarr.open_group(refgrid.open_store(out), mode="r"))
    if reader == "get_mapper":
        return _zarr_arrays(zarr.open_group(refgrid.get_mapper(out), mode="r"))
    if reader == "reference":
        v2 = Path(out).name == WRITERS["kerchunk-v2"]
        store = FsspecStore.from_url("reference://", storage_options={"fo": str(out)},
                                     read_only=True)
        return _zarr_arrays(zarr.open_group(store, mode="r", zarr_format=2 if v2 else 3))
    if reader == "icechunk":
        return _zarr_arrays(zarr.open_group(out.readonly_session("main").store, mode="r"))
    if reader.startswith("served"):
        view = reader.split()[1]
        mapper = fsspec.get_mapper(f"{base.replace('/dap/', '/')}/{view}")
        return _zarr_arrays(zarr.open_group(FsspecStore.from_mapper(mapper, read_only=True),
                                            mode="r"))
    return _dap(f"{base}#mode={reader}")


CELLS = [(writer, reader) for writer, readers in READERS.items() for reader in readers]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("writer", "reader"), CELLS, ids=[f"{w}-{r}" for w, r in CELLS])
def test_every_kind_reads_as_h5py_reads_it(outputs, server, writer, reader, order):
    out = outputs[order][writer]
    want = outputs[order]["truth"]
    name = Path(str(out)).name.split(".")[0] if writer != "icechunk" else ""
    base = f"{server.url}/dap/{order}/{name}"
    expected = {kind: EXPECTED[writer, reader, kind, order] for kind in want}
    if set(expected.values()) == {"refused"}:
        with pytest.raises(Exception):  # noqa: B017 (whatever the stock reader raises)
            read(reader, out, base)
        return
    got = read(reader, out, base)
    if reader == "dap2":  # (DAP2's stand-in for 64-bit integers: Float64, checked exact)
        got = {k: v.astype(want[k].dtype) if v.dtype.kind == "f" and want[k].dtype.kind in "iu"
               and (v == v.astype(want[k].dtype)).all() else v for k, v in got.items()}
    seen = {kind: outcome(got[kind], want[kind]) if kind in got else "omitted"
            for kind in want}
    assert seen == expected


def test_the_table_covers_every_cell():
    """Every kind, both byte orders, every writer, and each writer's readers: no cell left
    out, and raw bytes only where a record type would be misread or cannot be expressed."""
    assert len(EXPECTED) == sum(len(r) for r in READERS.values()) * len(kinds("<")) * 2
    assert {k for (_, r, k, _), v in EXPECTED.items() if v == "bytes"} <= set(RECORDS)
    assert all(v == "values" for (w, r, _, _), v in EXPECTED.items() if r == "engine")


# -- what other tools wrote -----------------------------------------------------------------------

def test_a_big_endian_struct_another_writer_described_reads_right_and_is_written_raw(tmp_path):
    """A Zarr v3 record type with ``bytes{endian: big}`` (as zarr >= 3.3 writes it) is read
    in its byte order, and written again as raw bytes with its record type."""
    records = np.array([(1, 1.5), (2, -2.25)], [("a", ">i4"), ("b", ">f8")])
    raw = tmp_path / "raw.bin"
    raw.write_bytes(records.tobytes())
    document = {"zarr_format": 3, "node_type": "array", "shape": [2],
                "data_type": zarr_data_type(records.dtype.newbyteorder("<")),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
                "chunk_key_encoding": {"name": "default"},
                "fill_value": zarr_fill_value(records.dtype.newbyteorder("<"), None),
                "codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
                "attributes": {}, "dimension_names": ["x"]}
    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps({"version": 1, "refs": {
        "zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}),
        "v/zarr.json": json.dumps(document), "v/c/0": [str(raw), 0, 24]}}))
    assert refgrid.scan(theirs).arrays["v"].dtype == np.dtype("V12")
    with xr.open_dataset(theirs, engine="refgrid") as ds:
        assert outcome(ds["v"].values, records) == "values"
    with xr.open_dataset(refgrid.get_mapper(theirs), engine="zarr") as ds:
        assert outcome(ds["v"].values, records) == "values"
    out = refgrid.write(refgrid.scan(theirs), tmp_path / "again.json")
    again = json.loads(json.loads(out.read_text())["refs"]["v/zarr.json"])
    assert again["codecs"] == [{"name": "bytes"}] and "struct" not in json.dumps(again)
    with xr.open_dataset(out, engine="refgrid") as ds:
        assert outcome(ds["v"].values, records) == "values"


# -- a property over files h5py writes ------------------------------------------------------------

LAYOUTS = {"chunked": {"chunks": (2,)}, "deflate": {"chunks": (3,), "compression": "gzip"},
           "contiguous": {"chunks": None}}


@hsettings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.sampled_from(sorted(ORDERS.values())), layout=st.sampled_from(sorted(LAYOUTS)),
       writer=st.sampled_from(["json", "parquet", "kerchunk-v2"]),
       data=st.data())
def test_files_h5py_writes_in_either_byte_order_read_as_h5py_reads_them(
        tmp_path_factory, order, layout, writer, data):
    root = tmp_path_factory.mktemp("property")
    source = write_source(root / "s.h5", order, **LAYOUTS[layout])
    names = data.draw(st.lists(st.sampled_from(sorted(kinds(order))), min_size=1, max_size=4,
                               unique=True))
    want = truth(source)
    out = refgrid.write(refgrid.scan(source, variables=names), root / WRITERS[writer],
                        format=writer)
    readers: dict[str, Callable[[], dict[str, np.ndarray]]] = {
        "engine": lambda: read("engine", out, ""),
        "open_store": lambda: read("open_store", out, ""),
        "get_mapper": lambda: read("get_mapper", out, "")}
    if writer != "parquet":
        readers["reference"] = lambda: read("reference", out, "")
    label = "little" if order == "<" else "big"
    for reader, read_all in readers.items():
        got = read_all()
        for kind in names:
            assert outcome(got[kind], want[kind]) == EXPECTED[writer, reader, kind, label], \
                (reader, kind)
    shutil.rmtree(root)


# -- records DMR++ documents describe (HDF5 compounds, HDF4 Vdata: big-endian) ---------------

def test_records_of_dmrpp_documents_read_as_their_granules_through_written_references(
        corpus, tmp_path):
    """``dmrpp__comp_scalar_be.h5`` read 10 as 167772160 and HDF4 Vdata 1.11 as 7.71e35
    once written: every record array of the corpus's documents, through each writer's
    references and refgrid's readers, against h5py/pyhdf."""
    from dmrpp_docs import corpus_pairs, hyrax_attributes
    from dmrpp_docs import same_values as same_granule
    from dmrpp_docs import truth as granule_truth
    from refgrid.core.dtypes import original_dtype

    checked = []
    for doc, data in corpus_pairs():
        if data.suffix == ".hdf" and importlib.util.find_spec("pyhdf") is None:
            continue
        try:
            group = refgrid.scan(doc, on_error="report")
        except refgrid.RefgridError:
            continue
        records = {path: original_dtype(node.attrs, node.dtype) for path, node in group.walk()
                   if isinstance(node, refgrid.VirtualArray) and "/" not in path  # (the root's)
                   and original_dtype(node.attrs, node.dtype).fields is not None}
        if not records:
            continue
        attrs = hyrax_attributes(doc)
        for writer in ("json", "parquet"):
            out = refgrid.write(group, tmp_path / f"{doc.stem}.{writer}", format=writer)
            for reader in ("engine", "get_mapper"):
                got = read(reader, out, "")
                for path, dtype in records.items():
                    values = np.asarray(got[path])
                    if values.dtype.fields is None:  # raw bytes: exact, as their type
                        values = values.view(dtype)
                    want = granule_truth(data, path, attrs.get(path, {}))
                    assert same_granule(values, want), (doc.name, path, reader)
                    checked.append((doc.name, path))
    names = {name for name, _ in checked}
    assert {"dmrpp__comp_scalar_be.h5.dmrpp"} <= names
    if importlib.util.find_spec("pyhdf") is not None:
        assert "fileout__vdata_packed_linked_blocks.hdf.dmrpp" in names
