"""Long jobs on dask and the progress bar they show: what batch and materialize share.

``scheduler`` means the same for both: ``None`` (dask on this machine: batch's worker
processes, materialize's threads), ``"synchronous"`` (in this process, one task at a time: for
debugging), a scheduler address (``"tcp://10.0.0.5:8786"``: a ``distributed.Client`` made for
the job and closed after it) or a ``distributed.Client`` (the caller's, left open).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, Protocol

from refgrid.core.typed import Untyped
from refgrid.core.util import import_extra
from refgrid.errors import ArgumentError

Kind = Literal["local", "synchronous", "cluster"]


def scheduler_kind(scheduler: object) -> Kind:
    """Where a job runs, or an :class:`~refgrid.errors.ArgumentError` naming the choices."""
    if scheduler is None or scheduler in ("processes", "threads"):
        return "local"
    if scheduler == "synchronous":
        return "synchronous"
    if isinstance(scheduler, str) or type(scheduler).__name__ == "Client":
        return "cluster"
    raise ArgumentError(f"scheduler must be None, 'synchronous', a scheduler address or a "
                        f"distributed.Client, not {scheduler!r:.80}")


@contextmanager
def cluster(scheduler: object, what: str) -> Iterator[Untyped]:
    """The ``distributed.Client`` of ``scheduler``: the caller's own, or one made for the
    job from an address — closed when the job ends, however it ends."""
    distributed = import_extra("distributed", "batch", what)
    if not isinstance(scheduler, str):
        yield scheduler
        return
    try:
        client = distributed.Client(scheduler, timeout="30s")
    except OSError as e:
        raise ArgumentError(f"cannot connect to the dask scheduler {scheduler}: {e}") from e
    with client:
        yield client


class Progress(Protocol):
    """What a job does with its bar (tqdm's, or :class:`_Silent`)."""

    def update(self, n: int = 1) -> None: ...

    def set_postfix(self, *args: object, **kwargs: object) -> None: ...

    def close(self) -> None: ...


class _Silent:
    """The bar where none is shown."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: object, **kwargs: object) -> None:
        pass

    def close(self) -> None:
        pass


def showing(progress: bool | None) -> bool:
    """Whether to draw a bar: asked for, or stderr is a terminal wide enough to draw one (an
    IDE's console can report 0 columns)."""
    if progress is not None:
        return progress
    return sys.stderr.isatty() and shutil.get_terminal_size((0, 0)).columns >= 40


def progress_bar(total: int, what: str, unit: str, progress: bool | None) -> Progress:
    """A bar on stderr for ``total`` ``unit``\\ s of ``what`` (see :func:`showing`), redrawn
    at every update: the count shown is what is done, even right before a kill."""
    if not total or not showing(progress):
        return _Silent()
    tqdm = import_extra("tqdm.auto", "batch", f"the {what} progress bar").tqdm
    bar: Progress = tqdm(total=total, desc=what, unit=unit, file=sys.stderr,
                         dynamic_ncols=True, mininterval=0, miniters=1)
    return bar
