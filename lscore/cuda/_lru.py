"""The plan cache of the multi-tensor launchers (``MultiTensor``, ``FusedLauncher``)."""

from __future__ import annotations

import collections
import threading
from typing import Any


class LRU:
    """The plans of the last `size` keys, least recently used first out; thread-safe.

    ``get(key)`` is the plan or None (a hit becomes the most recent), ``put(key, plan)``
    keeps it and drops the oldest beyond `size`; iterating gives the keys, oldest first.
    """

    __slots__ = ("_entries", "_lock", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._entries))
