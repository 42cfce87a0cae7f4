"""Native chunk reads of concurrent requests, gathered and fetched together.

Clients read neighbouring chunks at once (zarr asks for every chunk of a selection
concurrently). Each request that wants a stored chunk leaves it here and awaits it; all that
arrive in the same turn of the event loop — and all that arrive while the pool's threads are
busy — are fetched in one call per array, whose byte ranges refgrid's fetch coalesces per
source file: one ``pread`` or one HTTP request for a run of neighbours instead of one each.
Requests for a chunk already being fetched share that fetch. A batch that fails is retried
chunk by chunk, so one bad chunk fails only the requests that asked for it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial

Fetch = Callable[[str, list[int]], list[bytes | None]]
"""``fetch(array path, flat chunk indices)`` → their bytes (None: a chunk file that is
absent), blocking."""


class ChunkBatcher:
    """Gathers chunk requests of one dataset view into batched fetches on ``pool``."""

    def __init__(self, fetch: Fetch, pool: Executor, max_batch: int = 512,
                 max_running: int = 4, gather: float = 0.0) -> None:
        self.fetch = fetch
        self.gather = gather
        """Seconds a first request waits for others (0: the same turn of the loop only)."""
        self.pool = pool
        self.max_batch = max_batch
        self.max_running = max_running
        self.waiting: dict[tuple[str, int], asyncio.Future[bytes | None]] = {}
        self.queued: dict[str, list[int]] = defaultdict(list)
        self.running = 0
        self.scheduled = False

    async def get(self, path: str, flat: int) -> bytes | None:
        key = (path, flat)
        future = self.waiting.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self.waiting[key] = loop.create_future()
            self.queued[path].append(flat)
            if not self.scheduled:
                self.scheduled = True
                loop.call_later(self.gather, self._flush)
        return await asyncio.shield(future)  # a client that leaves does not cancel others

    def _flush(self) -> None:
        self.scheduled = False
        while self.queued and self.running < self.max_running:
            path, flats = next(iter(self.queued.items()))
            batch, rest = flats[:self.max_batch], flats[self.max_batch:]
            if rest:
                self.queued[path] = rest
            else:
                del self.queued[path]
            self.running += 1
            task = asyncio.get_running_loop().run_in_executor(self.pool, self._fetch, path,
                                                              batch)
            task.add_done_callback(partial(self._done, path, batch))

    def _fetch(self, path: str, flats: list[int]) -> list[bytes | BaseException | None]:
        try:
            return list(self.fetch(path, flats))
        except Exception:
            if len(flats) == 1:
                raise
        out: list[bytes | BaseException | None] = []
        for flat in flats:  # one by one: only the bad chunks fail
            try:
                out.extend(self.fetch(path, [flat]))
            except Exception as e:
                out.append(e)
        return out

    def _done(self, path: str, flats: list[int],
              done: asyncio.Future[list[bytes | BaseException | None]]) -> None:
        self.running -= 1
        error = done.exception() if not done.cancelled() else asyncio.CancelledError()
        results = [error] * len(flats) if error is not None else done.result()
        for flat, result in zip(flats, results, strict=True):
            future = self.waiting.pop((path, flat), None)
            if future is None or future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        if self.queued:
            self._flush()
