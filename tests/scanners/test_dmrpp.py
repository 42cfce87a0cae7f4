"""DMR++ input (``scanners/dmrpp.py``): the corpus of real documents Hyrax wrote, read as
h5py/pyhdf read their data files or refused by name; hostile documents refused; documents
through every way in (engine, store, mapper, CLI), combined and batched like files.

Ground truth: h5py for HDF5/NetCDF4 data files, pyhdf for HDF4 (skipped with a message where
it is not installed). Where HDF5 itself leaves values undefined — chunks never written with
the fill time "never", where h5py and netCDF4 read different values — refgrid's own scan of
the data file (the same model, which is what a DMR++ scan promises).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refgrid
from dmrpp_docs import (
    CORPUS,
    SIDECAR,
    corpus_pairs,
    folder,
    hyrax_attributes,
    same_values,
    truth,
    write_dmrpp,
)
from helpers import closed
from realistic import months, write
from refgrid.core.dtypes import original_dtype
from refgrid.read.array import read

pytest.importorskip("defusedxml")
HDF4 = importlib.util.find_spec("pyhdf") is not None


def _netcdf4_raw(data, path):
    import netCDF4

    with netCDF4.Dataset(data) as ds:
        parent, _, name = path.rpartition("/")
        variable = (ds[parent] if parent else ds).variables[name]
        variable.set_auto_maskandscale(False)
        return np.asarray(variable[...])


def _judge(doc, data, path, ours, attrs) -> str:
    """correct / undefined (HDF5 leaves it so; refgrid's scan of the file agrees) /
    no-truth (values Hyrax computed, not in the file) / WRONG."""
    try:
        expected = truth(data, path, attrs)
    except KeyError:
        return "no-truth"
    if same_values(ours, expected):
        return "correct"
    if data.suffix != ".hdf":
        try:
            other = _netcdf4_raw(data, path)
        except Exception:  # (not a netCDF variable, or one netCDF-C cannot read)
            other = None
        if other is not None and same_values(ours, other) and not _never_filled(data, path):
            return "correct"  # netCDF4's view: a variable as long as its dimension
        own = np.asarray(read(refgrid.scan(data)[path]))
        if (other is None or _never_filled(data, path)) and own.tobytes() == ours.tobytes():
            return "undefined"
    return "WRONG"


def _never_filled(data, path) -> bool:
    """Whether HDF5 leaves the variable's unwritten chunks undefined (fill time "never":
    h5py reads zeros, netCDF-C whatever memory held)."""
    import h5py

    with h5py.File(data, "r") as f:
        plist = f[path].id.get_create_plist()
        return plist.get_fill_time() == h5py.h5d.FILL_TIME_NEVER


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the DMR++ corpus is absent ({CORPUS})")
def test_the_corpus_reads_as_its_data_files_or_is_refused_by_name():
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    wrong, unnamed = [], []
    for doc, data in corpus_pairs():
        where = folder(doc)
        if data.suffix == ".hdf" and not HDF4:
            counts[where]["skipped (no pyhdf)"] += 1
            continue
        try:
            group = refgrid.scan(doc, on_error="report")
        except refgrid.RefgridError as e:
            counts[where]["document refused"] += 1
            assert str(doc) in str(e), e
            continue
        for entry in group.report:
            if entry.action == "skipped":
                kind = "refused (sidecar absent)" if SIDECAR.search(entry.reason) else "refused"
                counts[where][kind] += 1
                if not (entry.url and entry.variable and entry.reason):
                    unnamed.append(entry)
        attrs = hyrax_attributes(doc)
        for path, node in group.walk():
            if isinstance(node, refgrid.VirtualArray):
                values = np.asarray(read(node))  # records stored as bytes: as their type
                values = values.view(original_dtype(node.attrs, values.dtype))
                verdict = _judge(doc, data, path, values, attrs.get(path, {}))
                counts[where][verdict] += 1
                if verdict == "WRONG":
                    wrong.append(f"{doc.name}: {path}")
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    print("\nDMR++ corpus, variables by folder:")
    for name, c in sorted(counts.items()):
        print(f"  {name:9} {dict(c)}")
    print(f"  {'all':9} {dict(total)}")
    assert not wrong, wrong
    assert not unnamed, unnamed
    read_ = total["correct"] + total["undefined"] + total["no-truth"]
    held = read_ + total["refused"] + total["document refused"]
    assert read_ / held >= 0.9, (read_, held, dict(total))  # (sidecars the corpus lacks aside)


@pytest.fixture(scope="module")
def granules(tmp_path_factory):
    """Monthly NetCDF4 files (28-31 days, chunks of 10: irregular) with their DMR++ beside."""
    root = tmp_path_factory.mktemp("granules")
    files = write(root, months(2001, 3, "days since {start}"))
    return files, [write_dmrpp(f) for f in files]


def _expected(files):
    return closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                    data_vars="minimal", coords="minimal", compat="override"))


def test_a_document_reads_through_every_way_in_as_its_granule(granules, tmp_path):
    files, docs = granules
    with closed(xr.open_dataset(docs[0], engine="refgrid")) as ours, \
            closed(xr.open_dataset(files[0])) as expected:
        for name in ("tas", "pr", "time", "lat"):
            np.testing.assert_array_equal(ours[name].values, expected[name].values)
    group = refgrid.scan(docs[0])
    assert list(group.sources) == [str(files[0])]  # the granule, with its identity
    assert group.sources[str(files[0])]["size"] == files[0].stat().st_size
    store = refgrid.open_store(docs[0], chunks="auto")
    with closed(xr.open_zarr(store, consolidated=False)) as ours, \
            closed(xr.open_dataset(files[0])) as expected:
        np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)
    store.close()
    import zarr

    mapper = refgrid.get_mapper(docs[0], chunks="auto")
    with closed(xr.open_dataset(files[0])) as expected:
        np.testing.assert_array_equal(zarr.open_group(mapper, mode="r")["tas"][:],
                                      expected["tas"].values)
    from click.testing import CliRunner

    from refgrid.cli import main

    result = CliRunner().invoke(main, ["scan", str(docs[0]), "-o", str(tmp_path / "g.json")])
    assert result.exit_code == 0, result.output
    with closed(xr.open_dataset(tmp_path / "g.json", engine="refgrid")) as ours, \
            closed(xr.open_dataset(files[0])) as expected:
        np.testing.assert_array_equal(ours["pr"].values, expected["pr"].values)


def test_the_service_serves_a_document_as_its_granule(granules, tmp_path):
    from servers import start_refgrid_serve

    files, docs = granules
    (tmp_path / "root").mkdir()
    for d, f in zip(docs, files, strict=True):
        shutil.copy(d, tmp_path / "root" / d.name)
        shutil.copy(f, tmp_path / "root" / f.name)
    for served in start_refgrid_serve(tmp_path / "root", recheck=0.0):
        name = files[0].name  # (the document's name without .dmrpp)
        with closed(xr.open_dataset(f"{served.url}/{name}/native", engine="refgrid")) as ours, \
                closed(xr.open_dataset(files[0])) as expected:
            np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)


def test_documents_combine_along_time_as_their_granules(granules, tmp_path):
    files, docs = granules
    refgrid.write(refgrid.combine([str(d) for d in docs], "time"), tmp_path / "c.json")
    with closed(xr.open_dataset(tmp_path / "c.json", engine="refgrid")) as ours, \
            _expected(files) as expected:
        xr.testing.assert_equal(ours[["tas", "pr", "time_bnds"]].load(),
                                expected[["tas", "pr", "time_bnds"]].load())
        assert ours.sizes["time"] == sum(m.days for m in months(2001, 3, "x"))


def test_a_batch_of_documents_reads_one_document_per_granule(granules, tmp_path):
    """Over HTTP, with the granules elsewhere (``data_url``): each document is one GET (and
    a HEAD for its identity, as HTTP lists nothing), each granule one HEAD (its identity)
    and the chunks of what a batch reads to combine (the time coordinate, variables without
    time): never the granule's metadata. (``padded="encoded"``: the default rewrite of padded
    chunks copies them from the granules, checking each again first.)"""
    import re

    from servers import start_http

    files, docs = granules
    (tmp_path / "docs").mkdir()
    (tmp_path / "data").mkdir()
    for d, f in zip(docs, files, strict=True):
        shutil.copy(d, tmp_path / "docs" / d.name)
        shutil.copy(f, tmp_path / "data" / f.name)
    for server in start_http(tmp_path):
        urls = [f"{server.url}/docs/{d.name}" for d in docs]
        server.counter.reset()
        refgrid.batch(urls, tmp_path / "out.parq", scheduler="synchronous", progress=False,
                      data_url=f"{server.url}/data/{{name}}", padded="encoded")
        requests = list(server.counter.requests)
        for d, f in zip(docs, files, strict=True):
            document = [r for r in requests if f"/docs/{d.name}" in r]  # (HEAD: its listing)
            assert len([r for r in document if r.startswith("GET")]) == 1, document
            granule = [r for r in requests if f"/data/{f.name}" in r]
            assert len([r for r in granule if r.startswith("HEAD")]) == 1, "\n".join(granule)
            first = min(int(m) for m in re.findall(r'offset="(\d+)"', d.read_text("latin-1")))
            starts = [int(r.split("bytes=")[1].split("-")[0]) for r in granule if "bytes=" in r]
            assert all(start >= first for start in starts), (first, granule)  # no metadata
        with closed(xr.open_dataset(tmp_path / "out.parq", engine="refgrid")) as ours, \
                _expected(files) as expected:
            np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)


def _with_blob(granules, root: Path) -> tuple[list[Path], list[Path]]:
    """The granules and their documents in ``root``, each document describing one more
    variable refgrid cannot represent (an HDF5 opaque type: DAP4 ``Opaque``)."""
    files, docs = granules
    root.mkdir()
    for f, d in zip(files, docs, strict=True):
        shutil.copy(f, root / f.name)
        (root / d.name).write_text(d.read_text("latin-1").replace(
            "</Dataset>", '  <Opaque name="blob"/>\n</Dataset>'), encoding="latin-1")
    return [root / f.name for f in files], [root / d.name for d in docs]


def test_a_dropped_variable_is_not_scanned_so_it_stops_nothing(granules, tmp_path):
    """#51: a granule with one variable refgrid cannot represent could not be opened,
    combined or batch-converted even with that variable dropped (it was scanned first, then
    dropped); the engine takes ``on_error=`` as ``scan`` does."""
    from click.testing import CliRunner

    from refgrid.cli import main

    files, docs = _with_blob(granules, tmp_path / "g")
    with pytest.raises(refgrid.ScanError, match="'blob': DAP4 Opaque"):
        refgrid.scan(docs[0])
    group = refgrid.scan(docs[0], drop_variables="blob")
    assert "blob" not in group.arrays and not group.report
    with pytest.raises(refgrid.ArgumentError, match="holds no variable or group nope"):
        refgrid.scan(docs[0], drop_variables=["blob", "nope"])
    with closed(xr.open_dataset(files[0])) as expected:
        for options in ({"drop_variables": ["blob"]}, {"on_error": "report"}):
            with closed(xr.open_dataset(docs[0], engine="refgrid", **options)) as ours:
                assert "blob" not in ours.variables
                xr.testing.assert_identical(ours[["tas", "pr"]].load(),
                                            expected[["tas", "pr"]].load())
    with pytest.raises(refgrid.ArgumentError, match="on_error must be 'raise' or 'report'"):
        xr.open_dataset(docs[0], engine="refgrid", on_error="skip")
    combined = refgrid.combine([str(d) for d in docs], "time", drop_variables=["blob"])
    result = refgrid.batch([str(d) for d in docs], tmp_path / "out.parq", progress=False,
                           scheduler="synchronous", drop_variables=["blob"])
    assert not result.failed, result.failed
    refgrid.write(combined, tmp_path / "c.json")
    for out in (tmp_path / "c.json", tmp_path / "out.parq"):
        with closed(xr.open_dataset(out, engine="refgrid")) as ours, \
                _expected(files) as expected:
            np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)
    cli = CliRunner().invoke(main, ["scan", str(docs[0]), "-o", str(tmp_path / "s.json"),
                                    "--drop-variables", "blob"])
    assert cli.exit_code == 0, cli.output


def test_dropping_a_variable_leaves_the_others_dimension_names_as_they_are(tmp_path):
    """Unnamed dimensions are named ``phony_dim_N`` in the order met, as netCDF-C names
    them: a dropped variable, though not scanned, still takes its names (the HDF5 and DMR++
    scanners alike)."""
    import h5py

    path = tmp_path / "phony.h5"
    with h5py.File(path, "w") as f:
        f["first"] = np.arange(3, dtype="i4")
        f["second"] = np.arange(12, dtype="i4").reshape(4, 3)
        f["third"] = np.arange(5, dtype="i4")
    for source in (path, write_dmrpp(path)):
        whole = refgrid.scan(source)
        dropped = refgrid.scan(source, drop_variables="first")
        assert "first" not in dropped.arrays and not dropped.report
        for name in ("second", "third"):
            assert dropped[name].dims == whole[name].dims, (source, name)
        with closed(xr.open_dataset(source, engine="refgrid",
                                    drop_variables=["first"])) as ours:
            assert ours["second"].dims == whole["second"].dims


# -- hostile documents -------------------------------------------------------------------------

HEAD = ('<?xml version="1.0" encoding="ISO-8859-1"?>\n')
OPEN = ('<Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" '
        'xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" name="g.h5" '
        'dmrpp:href="data/g.h5">')
VARIABLE = ('<Int32 name="v"><Dim size="{n}"/><dmrpp:chunks byteOrder="LE">'
            '<dmrpp:chunkDimensionSizes>{c}</dmrpp:chunkDimensionSizes>{chunks}'
            '</dmrpp:chunks></Int32>')


def _chunk(offset: str, nbytes: str, position: str) -> str:
    return f'<dmrpp:chunk offset="{offset}" nBytes="{nbytes}" chunkPositionInArray="{position}"/>'


HOSTILE = {
    "malformed": (HEAD + OPEN + "<Int32 name='v'>", "not well-formed XML"),
    "text before": ("number of blocks: 1\n" + HEAD + OPEN + "</Dataset>",
                    "text before the XML declaration"),
    "billion laughs": (HEAD + '<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
                       + "".join(f'<!ENTITY {chr(98 + k)} "' + f"&{chr(97 + k)};" * 10 + '">'
                                 for k in range(8))
                       + "]>" + OPEN + "<Attribute name='x' type='String'><Value>&i;</Value>"
                       "</Attribute></Dataset>", "DTD"),
    "external entity": (HEAD + '<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>' + OPEN
                        + "<Attribute name='x' type='String'><Value>&x;</Value></Attribute>"
                        "</Dataset>", "DTD"),
    "past the end": (HEAD + OPEN + VARIABLE.format(n=4, c=4, chunks=_chunk("900", "16", "[0]"))
                     + "</Dataset>", "past the end of the data file"),
    "off the grid": (HEAD + OPEN + VARIABLE.format(n=4, c=2, chunks=_chunk("0", "8", "[1]"))
                     + "</Dataset>", "off its grid"),
    "beyond the grid": (HEAD + OPEN + VARIABLE.format(n=4, c=2, chunks=_chunk("0", "8", "[4]"))
                        + "</Dataset>", "off its grid"),
    "overflow": (HEAD + OPEN + VARIABLE.format(n=4, c=4, chunks=_chunk(
        "99999999999999999999", "16", "[0]")) + "</Dataset>", "is not a count or offset"),
    "negative": (HEAD + OPEN + VARIABLE.format(n=4, c=4, chunks=_chunk("-1", "16", "[0]"))
                 + "</Dataset>", "is not a count or offset"),
    "huge grid": (HEAD + OPEN + VARIABLE.format(n=10**18, c=1, chunks="") + "</Dataset>",
                  "chunks"),
    "no href": (HEAD + OPEN.replace(' dmrpp:href="data/g.h5"', "") + "</Dataset>",
                "no dmrpp:href"),
    "not DAP4": (HEAD + '<Dataset xmlns="urn:other" xmlns:dmrpp="http://xml.opendap.org/dap/'
                 'dmrpp/1.0.0#" dmrpp:href="g.h5"/>', "not a DAP4 Dataset"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_documents_are_refused_naming_the_document_and_reason(case, tmp_path):
    text, reason = HOSTILE[case]
    (tmp_path / "g.h5").write_bytes(bytes(64))
    doc = tmp_path / "g.h5.dmrpp"
    doc.write_text(text, encoding="latin-1")
    with pytest.raises(refgrid.FormatError) as caught:
        refgrid.scan(doc)
    assert str(doc) in str(caught.value) and reason in str(caught.value), caught.value


def test_an_href_outside_the_allowed_sources_is_refused(tmp_path):
    (tmp_path / "g.h5").write_bytes(bytes(64))
    doc = tmp_path / "g.h5.dmrpp"
    doc.write_text(HEAD + OPEN.replace("data/g.h5", "https://elsewhere.example/g.h5")
                   + VARIABLE.format(n=4, c=4, chunks=_chunk("0", "16", "[0]"))
                   + "</Dataset>", encoding="latin-1")
    with pytest.raises(refgrid.AccessError, match=r"elsewhere\.example"):
        refgrid.scan(doc, allowed_sources=[str(tmp_path)])


def test_an_unsupported_filter_is_refused_for_its_variable(tmp_path):
    (tmp_path / "g.h5").write_bytes(bytes(64))
    doc = tmp_path / "g.h5.dmrpp"
    doc.write_text(HEAD + OPEN + VARIABLE.format(n=4, c=4, chunks=_chunk("0", "16", "[0]"))
                   .replace('byteOrder="LE"', 'compressionType="szip" byteOrder="LE"')
                   + "</Dataset>", encoding="latin-1")
    with pytest.raises(refgrid.ScanError, match="'szip' has no Zarr codec"):
        refgrid.scan(doc)
    group = refgrid.scan(doc, on_error="report")
    assert not group.arrays and "szip" in group.report[0].reason


def test_the_scan_reads_nothing_of_the_granule_but_its_identity(granules, tmp_path):
    files, docs = granules
    doc = tmp_path / docs[0].name
    shutil.copy(docs[0], doc)
    (tmp_path / files[0].name).write_bytes(b"\0" * files[0].stat().st_size)  # no HDF5 at all
    group = refgrid.scan(doc)  # the granule's bytes are not looked at
    assert group["tas"].shape == (31, 3, 4)
    assert math.prod(group["tas"].grid.chunk_counts) == 4
    assert json.loads(json.dumps(group["tas"].attrs.get("units"))) == "K"


def _seed_documents():
    seeds = sorted(CORPUS.glob("*.dmrpp"))[::12] if CORPUS.is_dir() else []
    return [p.read_bytes() for p in seeds] or [
        (HEAD + OPEN + VARIABLE.format(n=4, c=2, chunks=_chunk("0", "8", "[0]")) + "</Dataset>")
        .encode()]


SEEDS = _seed_documents()


@settings(max_examples=int(os.environ.get("REFGRID_FUZZ_EXAMPLES", "200")), deadline=None,
          database=None,
          suppress_health_check=list(HealthCheck))
@given(seed=st.sampled_from(range(len(SEEDS))), data=st.data())
def test_any_damaged_document_is_read_or_refused_by_name(seed, data, tmp_path_factory):
    """Documents cut, flipped and spliced: each either scans or is a ``RefgridError`` —
    never another exception, a hang or a read of memory its numbers claim."""
    text = bytearray(SEEDS[seed])
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["cut", "flip", "splice", "number"]))
        at = data.draw(st.integers(0, max(0, len(text) - 1)))
        if kind == "cut":
            del text[at:]
        elif kind == "flip" and text:
            text[at] = data.draw(st.integers(0, 255))
        elif kind == "splice":
            text[at:at] = data.draw(st.sampled_from(
                [b"<", b">", b'"', b"&amp;", b"&x;", b"<!DOCTYPE x>", b"<Group name='g'>",
                 b"</Dataset>", b'<Dim size="99999999999"/>', b'nBytes="-5"']))
        else:
            found = [m.start() for m in re.finditer(rb"\d+", bytes(text))]
            if found:
                start = data.draw(st.sampled_from(found))
                end = start + len(re.match(rb"\d+", bytes(text[start:]))[0])
                text[start:end] = data.draw(st.sampled_from(
                    [b"0", b"1", b"4294967296", b"9" * 25, b"18446744073709551615"]))
    root = tmp_path_factory.mktemp("fuzz")
    (root / "g.h5").write_bytes(bytes(4096))
    doc = root / "g.h5.dmrpp"
    doc.write_bytes(bytes(text))
    try:
        group = refgrid.scan(doc, on_error=data.draw(st.sampled_from(["raise", "report"])),
                             data_url=str(root / "g.h5"))
    except refgrid.RefgridError as e:
        assert str(doc) in str(e) or str(root / "g.h5") in str(e), e
        return
    for _, node in group.walk():
        if isinstance(node, refgrid.VirtualArray) and math.prod(node.shape) < 10**6:
            with contextlib.suppress(refgrid.RefgridError):  # (a named refusal is fine)
                read(node)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the DMR++ corpus is absent ({CORPUS})")
def test_space_padded_strings_read_as_hdf5_reads_them_everywhere(tmp_path):
    """``refgrid.spacepad`` turns the stored padding into NULs: refgrid's reader, and zarr
    through references (its codec found by entry point), read what h5py reads."""
    import h5py
    import zarr
    from zarr.storage import FsspecStore

    doc = CORPUS / "strings__t_string_cont.h5.dmrpp"
    data = doc.with_name(doc.name.removesuffix(".dmrpp"))
    with h5py.File(data) as f:
        expected = f["array_2d"][()]
    group = refgrid.scan(doc, on_error="report")  # (its scalar string is in the file's heap)
    assert read(group["array_2d"]).tolist() == expected.tolist()
    refgrid.write(group, tmp_path / "s.json")
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(tmp_path / "s.json")},
                                 read_only=True)
    assert zarr.open_group(store, mode="r")["array_2d"][...].tolist() == expected.tolist()


@given(st.lists(st.binary(max_size=6).map(lambda b: b.replace(b" ", b"x").replace(b"\0", b"y")),
                max_size=20), st.integers(1, 8))
def test_spacepad_round_trips_what_hdf5_stores(texts, length):
    from refgrid.codecs.pipeline import spacepad_decode, spacepad_encode

    stored = b"".join(t[:length].ljust(length, b" ") for t in texts)  # HDF5's space padding
    decoded = spacepad_decode(stored, length)
    assert decoded == b"".join(t[:length].ljust(length, b"\0") for t in texts)
    assert spacepad_encode(decoded, length) == stored


def test_c_strings_in_a_document_read_as_h5py_reads_them(tmp_path):
    """#51: a document's ``pad="null_term"`` strings came back with the bytes the file holds
    after their NUL (``b"swe\\x00et"``; h5py: ``b"swe"``): through the scan, the engine,
    the store, the mapper and stock zarr on written references (``refgrid.nullterm``)."""
    import zarr
    from zarr.storage import FsspecStore

    from hdf5_strings import h5py_values, write_c_strings

    path = write_c_strings(tmp_path / "c_strings.h5")
    doc = write_dmrpp(path)  # (its records left out: a Structure of a String is refused)
    assert doc.read_text(encoding="latin-1").count('pad="null_term"') == 2
    expected = {k: v for k, v in h5py_values(path).items() if k != "records"}
    group = refgrid.scan(doc)
    store = refgrid.open_store(doc)
    mapped = zarr.open_group(refgrid.get_mapper(doc), mode="r")
    with closed(xr.open_dataset(doc, engine="refgrid")) as ds:
        for name, values in expected.items():
            assert read(group[name]).tolist() == values.tolist(), name
            assert ds[name].values.tolist() == values.tolist(), name
            assert zarr.open_group(store, mode="r")[name][...].tolist() == values.tolist()
            assert mapped[name][...].tolist() == values.tolist(), name
    store.close()
    for name, fmt in (("refs.json", "json"), ("v2.json", "kerchunk-v2")):
        out = refgrid.write(group, tmp_path / name, format=fmt)
        stock = zarr.open_group(FsspecStore.from_url(
            "reference://", storage_options={"fo": str(out)}, read_only=True), mode="r",
            zarr_format=2 if fmt == "kerchunk-v2" else 3)
        for variable, values in expected.items():
            assert stock[variable][...].tolist() == values.tolist(), (fmt, variable)


UNMARKED = [  # (document, variable, h5py's path): fixed-length in the file, not said so
    ("dmrpp__chunked_string_array.h5", "string_array", "string_array"),
    ("dmrpp__grid_1_2d.h5", "HDFEOS_INFORMATION/StructMetadata_0",
     "HDFEOS INFORMATION/StructMetadata.0"),
    ("dmrpp__test32v3.nc4", "letter", "letter"),
    ("fileout__FValue_string_sca.h5", "fill_str_sca", "fill_str_sca"),
    ("strings__t_str_dset.h5", "scalar", "scalar"),
]


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the DMR++ corpus is absent ({CORPUS})")
@pytest.mark.parametrize(("data", "variable", "h5_path"), UNMARKED)
def test_fixed_length_strings_older_documents_leave_unmarked_are_read(data, variable,
                                                                      h5_path):
    """#51: strings Hyrax's older documents describe without ``FixedLengthStringArray`` were
    all refused as variable-length strings in the file's heap; 8 of 9 such in the corpus are
    fixed-length (``|S8``, ``|S32000``, ``|S1``, ``|S29``), as their chunks' sizes show."""
    import h5py

    with h5py.File(CORPUS / data) as f:
        expected = np.asarray(f[h5_path][()])
    array = refgrid.scan(CORPUS / f"{data}.dmrpp", on_error="report")[variable]
    assert read(array).tolist() == expected.tolist()


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the DMR++ corpus is absent ({CORPUS})")
def test_strings_in_the_heap_are_refused_for_what_they_are():
    """#51: a heap reference takes 16 bytes an element: what a 16-byte fixed-length string
    takes too, so the variable is refused saying so (h5py: a variable-length string)."""
    group = refgrid.scan(CORPUS / "dmrpp__chunked_scalar_string.h5.dmrpp", on_error="report")
    [entry] = group.report
    assert entry.variable == "scalar_big_string" and entry.action == "skipped"
    assert "16 bytes an element" in entry.reason and "heap" in entry.reason


def test_unmarked_strings_read_where_every_padding_reads_them_alike(tmp_path):
    """#51: a length the chunks show, but no padding: values a C string, a null-padded or a
    space-padded string reads alike are read; others are a named error when read, never
    one padding's guess; compressed strings (sizes that say nothing) refused by name."""
    import h5py

    from hdf5_strings import write_c_strings

    path = write_c_strings(tmp_path / "c_strings.h5")
    with h5py.File(path, "a") as f:
        f.create_dataset("plain", data=np.array([b"ab", b"cdef", b""], dtype="S4"))
    group = refgrid.scan(write_dmrpp(path, string_lengths=False), on_error="report")
    assert read(group["plain"]).tolist() == [b"ab", b"cdef", b""]
    with pytest.raises(refgrid.ReadError, match=r"'contiguous'.*padding the source does not "
                       "give"):
        read(group["contiguous"])
    [entry] = [e for e in group.report if e.variable == "strings"]
    assert "stored compressed" in entry.reason


@given(st.lists(st.binary(min_size=1, max_size=5), min_size=1, max_size=8),
       st.integers(1, 6))
def test_string_codecs_read_as_hdf5_reads_each_padding(texts, length):
    """``refgrid.nullterm``: a C string ends at its first NUL; ``refgrid.anypad``: the bytes
    as they are where every padding reads them alike, else a ValueError; both keep
    what they decode as it is when encoding it again."""
    from refgrid.codecs.pipeline import anypad_decode, byte_codec, nullterm_decode

    stored = b"".join(t[:length].ljust(length, b"\0") for t in texts)
    decoded = nullterm_decode(stored, length)
    assert decoded == b"".join(t[:length].split(b"\0")[0].ljust(length, b"\0")
                               for t in texts)
    codec = byte_codec({"name": "refgrid.nullterm", "configuration": {"length": length}})
    assert codec.encode(decoded) == decoded and codec.decode(stored, len(stored)) == decoded
    alike = all(t[:length].rstrip(b"\0").count(b"\0") == 0 and
                not t[:length].ljust(length, b"\0").endswith(b" ") for t in texts)
    if alike:
        assert anypad_decode(stored, length) == stored
    else:
        with pytest.raises(ValueError, match="padding the source does not give"):
            anypad_decode(stored, length)
    records = b"".join(b"\x01\x02" + t[:length].ljust(length, b"\0") for t in texts)
    assert nullterm_decode(records, length + 2, [[2, length]]) == b"".join(
        b"\x01\x02" + t[:length].split(b"\0")[0].ljust(length, b"\0") for t in texts)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the DMR++ corpus is absent ({CORPUS})")
@pytest.mark.parametrize(("data", "variable"), [
    ("fileout__multi_fvalue.h5", "test"),  # _FillValue -999 and -9999, HDF5's fill 0
    ("dmrpp__t_special_name.h5", "data field/data.1"),  # _FillValue -999, HDF5's fill 0
    ("fileout__t_cf_1dllzs2.h5", "temp"),
])
def test_the_fill_value_is_the_files_whatever_its_fill_value_attribute(data, variable,
                                                                      tmp_path):
    """#51: a ``_FillValue`` of two values became the fill value (a bare ``TypeError`` when
    written); a ``_FillValue`` other than HDF5's fill value (which absent chunks read as, in
    h5py and netCDF-C) replaced it. The attribute stays as netCDF4 shows it."""
    import h5py
    import netCDF4

    doc = CORPUS / f"{data}.dmrpp"
    with h5py.File(CORPUS / data) as f:
        values, fill = f[variable][()], f[variable].fillvalue
    with netCDF4.Dataset(CORPUS / data) as nc:
        parent, _, name = variable.rpartition("/")
        attribute = (nc[parent] if parent else nc)[name].getncattr("_FillValue")
    array = refgrid.scan(doc)[variable]
    assert read(array).tolist() == values.tolist()
    assert array.fill_value == fill == refgrid.scan(CORPUS / data)[variable].fill_value
    assert np.asarray(array.attrs["_FillValue"]).tolist() == np.asarray(attribute).tolist()
    out = refgrid.write(refgrid.scan(doc), tmp_path / "refs.json")
    with closed(xr.open_dataset(out, engine="refgrid", mask_and_scale=False,
                                group=parent or None)) as ours:
        assert ours[name].values.tolist() == values.tolist()


# -- what a review found ------------------------------------------------------------------------

def _unwritten(tmp_path, dtype, fill=None):
    """A netCDF4 file whose variable ``v`` has its middle chunk never written, and the
    chunks' places (position, offset, size) as a document lists them."""
    import h5py
    import netCDF4

    path = tmp_path / "fv.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        v = ds.createVariable("v", dtype, ("time",), chunksizes=(2,), fill_value=fill)
        v[0:2], v[4:6] = [1, 2], [5, 6]
    with h5py.File(path) as f:
        d = f["v"]
        chunks = [d.id.get_chunk_info(k) for k in range(d.id.get_num_chunks())]
    return path, "".join(_chunk(str(c.byte_offset), str(c.size), f"[{c.chunk_offset[0]}]")
                         for c in chunks)


def _document(path, body: str) -> Path:
    doc = path.with_name(path.name + ".dmrpp")
    doc.write_text(HEAD + OPEN.replace("data/g.h5", "data/x") + body + "</Dataset>",
                   encoding="latin-1")
    return doc


@pytest.mark.parametrize(("dtype", "fill", "printed"), [
    ("f8", None, "9.96921e+36"),  # netCDF's default, printed to 6 digits
    ("f4", np.float32(-3.4028235e38), "-3.40282e+38"),  # float32's lowest
    ("i4", None, "-2147483647"),
])
def test_fill_values_printed_to_6_digits_read_as_the_file_holds_them(tmp_path, dtype, fill,
                                                                      printed):
    path, chunks = _unwritten(tmp_path, dtype, fill)
    kind = {"f8": "Float64", "f4": "Float32", "i4": "Int32"}[dtype]
    doc = _document(path, f'<Dimension name="time" size="6"/><{kind} name="v">'
                    f'<Dim name="/time"/><dmrpp:chunks fillValue="{printed}" byteOrder="LE">'
                    f"<dmrpp:chunkDimensionSizes>2</dmrpp:chunkDimensionSizes>{chunks}"
                    f"</dmrpp:chunks></{kind}>")
    import h5py

    with h5py.File(path) as f:
        expected = f["v"][()]
    np.testing.assert_array_equal(read(refgrid.scan(doc)["v"]), expected)


@pytest.mark.parametrize("printed", ["-3.12346e+07", None])
def test_an_inexact_or_unknown_fill_is_refused_where_chunks_are_absent(tmp_path, printed):
    path, chunks = _unwritten(tmp_path, "f4", np.float32(-31234567.0))
    attribute = "" if printed is None else f' fillValue="{printed}"'
    doc = _document(path, f'<Dimension name="time" size="6"/><Float32 name="v">'
                    f'<Dim name="/time"/><dmrpp:chunks{attribute} byteOrder="LE">'
                    f"<dmrpp:chunkDimensionSizes>2</dmrpp:chunkDimensionSizes>{chunks}"
                    "</dmrpp:chunks></Float32>")
    with pytest.raises(refgrid.ScanError, match="only to 6 digits or not at all"):
        refgrid.scan(doc)


@pytest.mark.parametrize(("held", "outcome"), [
    ("eJw=", "end before their stream does"),  # a zlib header, nothing after
    ("cA==", [112]),  # Hyrax's raw values (one byte)
    ("", [0]),  # none: the fill value
])
def test_missing_data_is_a_whole_stream_or_the_values_themselves(tmp_path, held, outcome):
    (tmp_path / "x").write_bytes(bytes(8))
    doc = _document(tmp_path / "x", f'<UInt8 name="p"><dmrpp:missingdata>{held}'
                    "</dmrpp:missingdata></UInt8>")
    if isinstance(outcome, str):
        with pytest.raises(refgrid.FormatError, match=outcome):
            refgrid.scan(doc)
    else:
        assert np.atleast_1d(read(refgrid.scan(doc)["p"])).tolist() == outcome


def test_a_record_fill_keeps_64_bit_integers_exact(tmp_path):
    (tmp_path / "x").write_bytes(bytes(64))
    doc = _document(tmp_path / "x", '<Structure name="r"><Int64 name="a"/><UInt64 name="b"/>'
                    '<Dim size="2"/><dmrpp:chunks fillValue="9223372036854775807 '
                    '9007199254740993" byteOrder="LE"><dmrpp:chunkDimensionSizes>1'
                    "</dmrpp:chunkDimensionSizes></dmrpp:chunks></Structure>")
    values = read(refgrid.scan(doc)["r"])
    assert values["a"].tolist() == [2**63 - 1] * 2 and values["b"].tolist() == [2**53 + 1] * 2


@pytest.mark.parametrize(("body", "reason"), [
    ('<String name="s"><Dim size="2"/><dmrpp:vlsa><v c="300000000">x</v></dmrpp:vlsa>'
     "</String>", "more strings than its 2 elements"),
    ("".join(f'<Int32 name="v{k}"><Dim size="{2**24}"/><dmrpp:missingdata>'
             + base64.b64encode(zlib.compress(bytes(2**26), 9)).decode()
             + "</dmrpp:missingdata></Int32>" for k in range(2)), "in all"),
    ('<Int32 name="v"><Dim size="40"/><dmrpp:chunks byteOrder="LE">'
     "<dmrpp:chunkDimensionSizes>1</dmrpp:chunkDimensionSizes>"
     + "".join(f'<dmrpp:chunk offset="0" nBytes="4" chunkPositionInArray="[{k}]" '
               f'href="f{k}.h5"/>' for k in range(40)) + "</dmrpp:chunks></Int32>",
     "more than 16 data files"),
], ids=["vlsa repeats", "inflation", "data files"])
def test_a_small_document_cannot_claim_large_memory_or_many_requests(tmp_path, body, reason):
    (tmp_path / "x").write_bytes(bytes(64))
    for k in range(40):
        (tmp_path / f"f{k}.h5").write_bytes(bytes(8))
    with pytest.raises(refgrid.FormatError, match=reason):
        refgrid.scan(_document(tmp_path / "x", body))


def test_a_chunk_href_outside_the_allowed_sources_is_an_access_error(tmp_path):
    (tmp_path / "x").write_bytes(bytes(64))
    doc = _document(tmp_path / "x", '<Int32 name="v"><Dim size="2"/><dmrpp:chunks '
                    'byteOrder="LE"><dmrpp:chunkDimensionSizes>1</dmrpp:chunkDimensionSizes>'
                    '<dmrpp:chunk offset="0" nBytes="4" chunkPositionInArray="[0]"/>'
                    '<dmrpp:chunk offset="0" nBytes="4" chunkPositionInArray="[1]" '
                    'href="https://elsewhere.example/f.h5"/></dmrpp:chunks></Int32>')
    for on_error in ("raise", "report"):
        with pytest.raises(refgrid.AccessError, match=r"elsewhere\.example"):
            refgrid.scan(doc, on_error=on_error, allowed_sources=[str(tmp_path)])


def test_a_dimension_declared_in_a_later_group_is_found(tmp_path):
    (tmp_path / "x").write_bytes(bytes(64))
    doc = _document(tmp_path / "x", '<Int32 name="v"><Dim name="/g/n"/><dmrpp:missingdata>'
                    + base64.b64encode(zlib.compress(np.arange(3, dtype="<i4").tobytes()))
                    .decode() + '</dmrpp:missingdata></Int32><Group name="g">'
                    '<Dimension name="n" size="3"/></Group>')
    group = refgrid.scan(doc)
    assert group["v"].dims == ("n",) and read(group["v"]).tolist() == [0, 1, 2]
