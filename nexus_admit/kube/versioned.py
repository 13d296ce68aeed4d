"""One remembered value per object, kept while the object's version stays the same.

Who uses it: `cluster/` (a Node's translation, a pod's requests) and `reservations.py`
(a reservation's slots). The controller rebuilds its snapshot every pass from objects that
mostly did not change; each cache holds one entry per object (by name or uid), replaced when
its version changes, so it never grows with the number of versions seen. Locked: snapshots
are built in worker threads while the loop reads too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from cachetools import LRUCache

__all__ = ["VersionedCache", "object_version"]

V = TypeVar("V")


class VersionedCache(Generic[V]):
    def __init__(self, maxsize: int = 65536) -> None:
        self._entries: LRUCache[Hashable, tuple[Hashable, V]] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: Hashable, compute: Callable[[], V]) -> V:
        """The value for `key` at `version`: remembered, or `compute()` (not kept when it
        raises, so an error is reported again next time)."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        value = compute()
        with self._lock:
            self._entries[key] = (version, value)
        return value


def object_version(obj: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(uid, resourceVersion) of an object, None when it has none (a dump file, a test)."""
    m = obj.get("metadata") if obj is not None else None
    if not isinstance(m, Mapping) or not m.get("uid") or not m.get("resourceVersion"):
        return None
    return (str(m["uid"]), str(m["resourceVersion"]))
