"""Limits: ``set_limits`` for the process, ``with refgrid.limits(...)`` for one thread or task
— and for the work refgrid's own threads do on its behalf."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import xarray as xr

import refgrid
from refgrid.core.bounds import current
from refgrid.core.util import thread_pool


def test_a_block_holds_for_its_own_thread_only():
    seen: dict[str, int] = {}
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        seen["other"] = current().max_chunks
        leave.set()

    thread = threading.Thread(target=other)
    thread.start()
    with refgrid.limits(max_chunks=5):
        inside.set()
        leave.wait(10)
        seen["mine"] = current().max_chunks
    thread.join(10)
    assert seen == {"mine": 5, "other": refgrid.Limits().max_chunks}
    assert current().max_chunks == refgrid.Limits().max_chunks


def test_set_limits_holds_for_every_thread():
    previous = refgrid.set_limits(max_url_length=123)
    try:
        found = thread_pool("test-limits", 1).submit(lambda: current().max_url_length).result()
        assert found == 123
    finally:
        refgrid.set_limits(max_url_length=previous.max_url_length)


def test_a_blocks_limits_reach_refgrids_threads_and_tasks():
    with refgrid.limits(max_references=77):
        in_pool = thread_pool("test-limits", 1).submit(lambda: current().max_references)
        assert in_pool.result() == 77

        async def task() -> int:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(thread_pool("test-limits", 1),
                                              lambda: current().max_references)

        assert asyncio.run(task()) == 77
    assert thread_pool("test-limits", 1).submit(
        lambda: current().max_references).result() == refgrid.Limits().max_references


def test_a_blocks_decoding_limit_holds_in_the_readers_threads():
    """A read spread over refgrid's reader threads decodes with the block's limits: a text
    chunk larger than the default variable-length limit reads inside a block that raises it,
    however many threads the read uses."""
    import base64
    import json

    import numcodecs

    text = np.array(["y" * 2**20] * 10, dtype=object)
    chunk = base64.b64encode(numcodecs.GZip(1).encode(numcodecs.VLenUTF8().encode(text)))
    array = json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [40], "data_type": "string",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [10]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "", "codecs": [{"name": "vlen-utf8"},
                                     {"name": "gzip", "configuration": {"level": 1}}],
        "attributes": {}, "dimension_names": ["x"]})
    refs = {"version": 1, "refs": {
        "zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}),
        "a/zarr.json": array, **{f"a/c/{k}": "base64:" + chunk.decode() for k in range(4)}}}
    with pytest.raises(refgrid.ReadError, match="8,388,608"):
        xr.open_dataset(refs, engine="refgrid")["a"].values  # noqa: B018
    with refgrid.limits(max_variable_chunk_bytes=2**25):
        values = xr.open_dataset(refs, engine="refgrid")["a"].values
    assert list(values) == list(text) * 4
