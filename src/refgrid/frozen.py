"""Read-only mappings inside frozen dataclasses that still pickle.

``MappingProxyType`` keeps a model's attribute and inline-chunk mappings read-only, but it
cannot be pickled, and dask.distributed and multiprocessing pickle every lazily opened
dataset they ship. :class:`FrozenPickle` stores such fields as plain dicts in the pickle and
wraps them again when loaded.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any


class FrozenPickle:
    """Mixin for frozen dataclasses whose mapping fields are ``MappingProxyType``."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, MappingProxyType) else v
                for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, MappingProxyType(v) if isinstance(v, dict) else v)
