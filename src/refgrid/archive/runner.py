"""Running the scans of a batch on dask: local worker processes, or a distributed cluster.

Results come back one task at a time and are handed to the caller as they arrive — that is
what makes a batch resumable (each is recorded at once) and what the progress bar follows.
Locally the scans run in dask's process scheduler (processes, so h5py's global lock does not
serialise them), in waves that bound what dask holds; on a cluster, as futures complete.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from refgrid.archive.task import Failed, ScanJob, Scanned, scan_files
from refgrid.core.sources import SourceIdentity
from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError

Files = list[tuple[str, SourceIdentity | None]]
OnResult = Callable[[list[Scanned | Failed]], None]
WAVE_TASKS = 256
"""Tasks per local wave: dask keeps a wave's results until the wave ends."""
MAX_TASK_FILES = 16
"""Files per task at most: tasks amortise dask's overhead, yet progress moves often."""
PARENT_POLL = 0.5
"""Seconds between a worker's looks at whether the batch process still runs."""


def tasks_of(files: Files, workers: int) -> list[Files]:
    """``files`` cut into tasks: about eight per worker, of at most MAX_TASK_FILES files."""
    size = max(1, min(MAX_TASK_FILES, math.ceil(len(files) / max(1, 8 * workers))))
    return [files[k:k + size] for k in range(0, len(files), size)]


def run(files: Files, job: ScanJob, on_result: OnResult, *, scheduler: Any = None,
        workers: int | None = None) -> None:
    """Scan ``files``, calling ``on_result`` with each task's outcomes as it finishes.

    ``scheduler``: ``None`` (dask's process scheduler on this machine, ``workers``
    processes, default one per core), ``"synchronous"`` (in this process: for debugging),
    an address such as ``"tcp://10.0.0.5:8786"``, or a ``distributed.Client``.
    """
    if not files:
        return
    if scheduler is None or scheduler == "processes":
        _run_local(files, job, on_result, workers or os.cpu_count() or 1)
    elif scheduler == "synchronous":
        for task in tasks_of(files, 1):
            on_result(scan_files(task, job))
    elif isinstance(scheduler, str):
        distributed = import_extra("distributed", "batch", "batch conversion on a dask cluster")
        try:
            client = distributed.Client(scheduler, timeout="30s")
        except OSError as e:
            raise ArgumentError(f"cannot connect to the dask scheduler {scheduler}: {e}") \
                from None
        with client:
            _run_distributed(client, files, job, on_result)
    elif type(scheduler).__name__ == "Client":
        _run_distributed(scheduler, files, job, on_result)
    else:
        raise ArgumentError(f"scheduler must be None, 'synchronous', a scheduler address or a "
                            f"distributed.Client, not {scheduler!r:.80}")


def _run_local(files: Files, job: ScanJob, on_result: OnResult, workers: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    dask = import_extra("dask", "batch", "batch conversion")
    from dask.callbacks import Callback

    def posttask(key: Any, result: Any, *_: Any) -> None:
        if isinstance(key, str) and key.startswith("refgrid-scan-"):
            on_result(result)

    tasks = tasks_of(files, workers)
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context,
                             initializer=follow_parent, initargs=(os.getpid(),)) as pool, \
            Callback(posttask=posttask):
        for wave in _waves(tasks):
            jobs = [dask.delayed(scan_files, pure=False)(task, job,
                                                         dask_key_name=f"refgrid-scan-{k}")
                    for k, task in wave]
            dask.compute(*jobs, scheduler="processes", pool=pool)


def follow_parent(parent: int) -> None:
    """(Run in each worker.) Exit once the batch process is gone — killed with SIGKILL, say —
    rather than wait forever for work from it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="refgrid-follow-parent", daemon=True).start()


def _waves(tasks: list[Files]) -> Iterator[list[tuple[int, Files]]]:
    numbered = list(enumerate(tasks))
    for k in range(0, len(numbered), WAVE_TASKS):
        yield numbered[k:k + WAVE_TASKS]


def _run_distributed(client: Any, files: Files, job: ScanJob, on_result: OnResult) -> None:
    distributed = import_extra("distributed", "batch", "batch conversion on a dask cluster")
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    tasks = tasks_of(files, workers)
    futures = client.map(scan_files, tasks, job=job, pure=False,
                         key=[f"refgrid-scan-{k}-{os.getpid()}" for k in range(len(tasks))])
    try:
        for future in distributed.as_completed(futures):
            on_result(future.result())
            future.release()
    finally:
        client.cancel([f for f in futures if not f.done()])

