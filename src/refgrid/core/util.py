"""Small process-level helpers every part shares: optional dependencies imported when first
used, process-wide thread pools, pausing the garbage collector around bulk object creation,
and read-only mappings in frozen dataclasses that still pickle."""

from __future__ import annotations

import contextvars
import gc
import importlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from types import MappingProxyType, ModuleType
from typing import Concatenate, Generic, ParamSpec, TypeVar, overload

import numpy as np

from refgrid.errors import MissingExtraError

T = TypeVar("T")
Owner = TypeVar("Owner")
P = ParamSpec("P")


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """``module``, imported; ``what`` needs it, and ``pip install 'refgrid[extra]'`` has it.

    ``import refgrid`` stays light, and a missing one is a
    :class:`~refgrid.errors.MissingExtraError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(extra, what, e.name or module) from e


class ContextPool(ThreadPoolExecutor):
    """A thread pool whose tasks run in a copy of the submitter's context: work refgrid hands
    to its threads on a caller's behalf keeps that caller's ``with refgrid.limits(...)``
    (a context variable), whichever thread picks it up. ``loop.run_in_executor`` submits
    through here too."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        run: Callable[Concatenate[Callable[P, T], P], T] = contextvars.copy_context().run
        return super().submit(run, fn, *args, **kwargs)


_pools: dict[str, tuple[int, ContextPool]] = {}
_pools_lock = threading.Lock()


def thread_pool(name: str, workers: int) -> ContextPool:
    """The process-wide pool called ``name`` (its threads are named after it), made on first
    use and anew in a forked child (whose threads are gone)."""
    with _pools_lock:
        found = _pools.get(name)
        if found is None or found[0] != os.getpid():
            found = _pools[name] = (os.getpid(), ContextPool(workers, thread_name_prefix=name))
        return found[1]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused: building 10^6 acyclic objects (selection
    pieces, h5py's per-chunk records) otherwise triggers repeated collector passes over all
    of them, costing more than the construction itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class FrozenPickle:
    """Mixin for frozen dataclasses whose mapping fields are ``MappingProxyType``.

    ``MappingProxyType`` keeps a model's attribute and inline-chunk mappings read-only, but it
    cannot be pickled, and dask.distributed and multiprocessing pickle every lazily opened
    dataset they ship: such fields are plain dicts in the pickle, wrapped again when loaded.
    """

    def __getstate__(self) -> dict[str, object]:
        return {k: dict(v) if isinstance(v, MappingProxyType) else v
                for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, object]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, MappingProxyType(v) if isinstance(v, dict) else v)


class lazy(Generic[Owner, T]):
    """``functools.cached_property`` without Python 3.11's lock: there, one lock per class
    attribute is held while *any* instance computes it, so a source's identity waiting on a
    stalled server blocked the scans of every other file in the process. Two threads may
    compute the same value once each; both get an equal value."""

    def __init__(self, compute: Callable[[Owner], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> lazy[Owner, T]: ...

    @overload
    def __get__(self, instance: Owner, owner: type | None = None) -> T: ...

    def __get__(self, instance: Owner | None, owner: type | None = None) -> T | lazy[Owner, T]:
        if instance is None:
            return self
        value = self.compute(instance)
        instance.__dict__[self.name] = value  # found there first from now on
        return value


def same_value(a: object, b: object) -> bool:
    """Equality for attribute and fill values: NaN equals NaN, arrays compare element-wise."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(p, q) for p, q in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape:
            return False
        if x.dtype.kind in "fc" and y.dtype.kind in "fc":
            return bool(np.array_equal(x, y, equal_nan=True))
        return bool(np.array_equal(x, y))
    if isinstance(a, float | np.floating) and isinstance(b, float | np.floating):
        return bool(a == b or (np.isnan(a) and np.isnan(b)))
    return bool(a == b)
