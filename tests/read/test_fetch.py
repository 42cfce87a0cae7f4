"""Byte ranges: coalescing neighbours into requests, and reading them back in the order
asked (locally with pread, remotely with one request per coalesced span)."""

from __future__ import annotations

import numpy as np
import pytest

from refgrid.read.fetch import MAX_REQUEST, FetchError, coalesce, read_ranges


def _spans(offset, length, gap):
    order, starts, ends, firsts = coalesce(np.array(offset, np.uint64),
                                           np.array(length, np.uint64), gap)
    return order.tolist(), list(zip(starts.tolist(), ends.tolist(), strict=True)), \
        firsts.tolist()


def test_neighbours_closer_than_the_gap_share_a_request():
    assert _spans([100, 0, 50], [10, 10, 10], 16) == ([1, 2, 0], [(0, 10), (50, 60),
                                                                   (100, 110)], [0, 1, 2])
    assert _spans([100, 0, 50], [10, 10, 10], 40)[1] == [(0, 110)]
    assert _spans([100, 0, 30], [10, 10, 10], 20)[1] == [(0, 40), (100, 110)]
    assert _spans([100, 0, 30], [10, 10, 10], 19)[1] == [(0, 10), (30, 40), (100, 110)]


def test_overlapping_and_repeated_ranges_are_read_once():
    assert _spans([0, 5, 0], [10, 10, 10], 0)[1] == [(0, 15)]
    assert _spans([0, 2], [50, 3], 0)[1] == [(0, 50)]  # one range inside another


def test_requests_are_cut_at_multiples_of_the_request_limit():
    assert _spans([MAX_REQUEST - 10, MAX_REQUEST + 5], [10, 10], 2**40)[1] == [
        (MAX_REQUEST - 10, MAX_REQUEST), (MAX_REQUEST + 5, MAX_REQUEST + 15)]


@pytest.fixture
def files(tmp_path):
    data = [np.random.default_rng(k).integers(0, 256, 200_000, np.uint8).tobytes()
            for k in range(2)]
    paths = []
    for k, blob in enumerate(data):
        path = tmp_path / f"f{k}.bin"
        path.write_bytes(blob)
        paths.append(str(path))
    return paths, data


def test_ranges_come_back_in_the_order_asked(files):
    paths, data = files
    rng = np.random.default_rng(7)
    n = 500
    path_id = rng.integers(0, 2, n).astype(np.int32)
    offset = rng.integers(0, 199_000, n).astype(np.uint64)
    length = rng.integers(0, 1000, n).astype(np.uint64)
    offset[:5], length[:5] = offset[5], length[5]  # repeats
    path_id[:5] = path_id[5]
    got = read_ranges(paths, path_id, offset, length)
    for k in range(n):
        start = int(offset[k])
        assert bytes(got[k]) == data[path_id[k]][start:start + int(length[k])], k


def test_past_the_end_is_short_and_a_missing_file_is_named(files, tmp_path):
    paths, data = files
    got = read_ranges(paths, np.array([0], np.int32), np.array([199_990], np.uint64),
                      np.array([100], np.uint64))
    assert bytes(got[0]) == data[0][199_990:]  # short: the caller checks lengths
    missing = [*paths, str(tmp_path / "gone.bin")]
    with pytest.raises(FetchError) as caught:
        read_ranges(missing, np.array([0, 2], np.int32), np.zeros(2, np.uint64),
                    np.ones(2, np.uint64))
    assert caught.value.missing and caught.value.index == 1
    assert caught.value.url.endswith("gone.bin")


def test_remote_neighbours_cost_one_request(http_server, files):
    _, data = files
    (http_server.root / "f0.bin").write_bytes(data[0])
    url = f"{http_server.url}/f0.bin"
    offset = np.arange(0, 100_000, 1000, dtype=np.uint64)
    length = np.full(len(offset), 500, np.uint64)
    http_server.counter.reset()
    got = read_ranges([url], np.zeros(len(offset), np.int32), offset, length)
    assert [bytes(g) for g in got] == [data[0][o:o + 500] for o in offset.tolist()]
    ranged = [r for r in http_server.counter.requests if r.startswith("GET")]
    assert len(ranged) == 1, http_server.counter.requests
