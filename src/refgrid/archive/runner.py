"""Running the scans of a batch on dask: local worker processes, or a distributed cluster.

Results come back one task at a time and are handed to the caller as they arrive — that is
what makes a batch resumable (each is recorded at once) and what the progress bar follows.
Locally the scans run in dask's process scheduler (processes, so h5py's global lock does not
serialise them), in waves that bound what dask holds; on a cluster, as futures complete.

A scan that passes its deadline ends its worker process (:mod:`refgrid.archive.deadline`):
locally the pool is replaced, the file recorded as timed out and the other unfinished tasks
run again; on a cluster the worker is restarted by its nanny, and a task whose worker died
is run again one file at a time, so only the file that hangs is given up.
"""

from __future__ import annotations

import contextvars
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

from refgrid.archive.deadline import GUARD, UNGUARDED, read_notes
from refgrid.archive.task import Failed, ScanJob, Scanned, scan_files
from refgrid.core.bounds import STALL_ATTEMPTS, current
from refgrid.core.sources import SourceIdentity
from refgrid.core.tasks import cluster, scheduler_kind
from refgrid.core.typed import Untyped
from refgrid.core.util import import_extra
from refgrid.errors import BatchError

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


def run(files: Files, job: ScanJob, on_result: OnResult, *,
        scheduler: str | Untyped | None = None,
        workers: int | None = None) -> None:
    """Scan ``files``, calling ``on_result`` with each task's outcomes as it finishes.

    ``scheduler`` (:mod:`refgrid.core.tasks`): ``None`` (dask's process scheduler on this
    machine, ``workers`` processes, default one per core), ``"synchronous"`` (in this
    process: for debugging), an address such as ``"tcp://10.0.0.5:8786"``, or a
    ``distributed.Client``.
    """
    kind = scheduler_kind(scheduler)
    if not files:
        return
    if kind == "local":
        _run_local(files, job, on_result, workers or os.cpu_count() or 1)
    elif kind == "synchronous":  # in this process: each file in a thread of its own
        behind: list[threading.Thread] = []
        for task in tasks_of(files, 1):
            on_result([_within(file, job, behind) for file in task])
    else:
        with cluster(scheduler, "batch conversion on a dask cluster") as client:
            _run_distributed(client, files, job, on_result)


def _run_local(files: Files, job: ScanJob, on_result: OnResult, workers: int) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    dask = import_extra("dask", "batch", "batch conversion")
    from dask.callbacks import Callback

    done: set[int] = set()

    def posttask(key: object, result: object, *_: object) -> None:
        if isinstance(key, str) and key.startswith("refgrid-scan-"):
            done.add(int(key.rsplit("-", 1)[1]))
            on_result(cast("list[Scanned | Failed]", result))  # what scan_files returned

    pending = list(enumerate(tasks_of(files, workers)))
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    while pending:
        with ProcessPoolExecutor(min(workers, len(pending)), mp_context=context,
                                 initializer=follow_parent, initargs=(os.getpid(),)) as pool, \
                Callback(posttask=posttask):
            try:
                for wave in _waves(pending):
                    jobs = [dask.delayed(scan_files, pure=False)(
                        task, job, dask_key_name=f"refgrid-scan-{k}") for k, task in wave]
                    dask.compute(*jobs, scheduler="processes", pool=pool)
                return
            except BrokenProcessPool as e:
                if job.notes and (Path(job.notes) / UNGUARDED).exists():
                    (Path(job.notes) / UNGUARDED).unlink(missing_ok=True)
                    raise BatchError(GUARD) from e
                late = read_notes(Path(job.notes)) if job.notes else {}
                if not late:
                    raise BatchError("a batch worker process died while scanning (killed, "
                                     "or crashed inside a library)") from e
        on_result([timed_out(url, seconds) for url, seconds in late.items()])
        pending = [(k, [f for f in task if f[0] not in late]) for k, task in pending
                   if k not in done]
        pending = [(k, task) for k, task in pending if task]


def _within(file: tuple[str, SourceIdentity | None], job: ScanJob,
            behind: list[threading.Thread]) -> Scanned | Failed:
    """One file scanned in this process within the deadline: the scan runs in a thread,
    which is left behind if it passes the deadline (a scan stuck in a socket or in libhdf5
    cannot be stopped from outside; it ends with its own timeouts), and the file is
    recorded as timed out — the batch goes on. A thread left behind inside libhdf5 holds its
    lock, so the next scan first waits for it as long as its timeouts may take: later files
    are not failed for it."""
    limits = current()
    grace = limits.connect_timeout + limits.read_timeout * STALL_ATTEMPTS
    for thread in behind:
        thread.join(grace)
    behind[:] = [t for t in behind if t.is_alive()]
    outcome: list[Scanned | Failed] = []

    def scan() -> None:
        outcome.extend(scan_files([file], replace(job, file_timeout=None)))

    worker = threading.Thread(target=contextvars.copy_context().run, args=(scan,),
                              name=f"refgrid-scan {file[0]}", daemon=True)  # the caller's limits
    worker.start()
    worker.join(job.file_timeout)
    if worker.is_alive() or not outcome:
        behind.append(worker)
        return timed_out(file[0], job.file_timeout or 0.0, "its thread was left behind")
    return outcome[0]


def timed_out(url: str, seconds: float,
              how: str = "its worker process was replaced") -> Failed:
    return Failed(url, "TimeoutError", f"{url}: the scan timed out after {seconds:g} s and "
                  f"was stopped ({how}); --file-timeout raises the limit")


def follow_parent(parent: int) -> None:
    """(Run in each worker.) Exit once the batch process is gone — killed with SIGKILL, say —
    rather than wait forever for work from it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="refgrid-follow-parent", daemon=True).start()


def _waves(numbered: list[tuple[int, Files]]) -> Iterator[list[tuple[int, Files]]]:
    for k in range(0, len(numbered), WAVE_TASKS):
        yield numbered[k:k + WAVE_TASKS]


def _run_distributed(client: Untyped, files: Files, job: ScanJob, on_result: OnResult) -> None:
    distributed = import_extra("distributed", "batch", "batch conversion on a dask cluster")
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    tasks = tasks_of(files, workers)
    job = replace(job, notes=None)  # a worker's disk is not the client's
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    futures = client.map(scan_files, tasks, job=job, pure=False,
                         key=[f"refgrid-scan-{k}-{token}" for k in range(len(tasks))])
    task_of = {f.key: task for f, task in zip(futures, tasks, strict=True)}
    try:
        queue = distributed.as_completed(futures)
        for future in queue:
            try:
                outcomes = future.result()
            except distributed.KilledWorker:  # its worker died: a deadline, or a crash
                task = task_of[future.key]
                if len(task) == 1:
                    outcomes = [timed_out(task[0][0], job.file_timeout or 0.0)]
                else:  # again one file at a time: only the one that hangs is given up
                    again = client.map(scan_files, [[f] for f in task], job=job, pure=False,
                                       key=[f"{future.key}-{i}" for i in range(len(task))])
                    task_of.update({f.key: [t] for f, t in zip(again, task, strict=True)})
                    futures += again
                    queue.update(again)
                    continue
            on_result(outcomes)
            future.release()
    finally:
        client.cancel([f for f in futures if not f.done()])

