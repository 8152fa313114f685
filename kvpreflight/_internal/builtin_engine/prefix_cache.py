"""The prefix cache: page-granular, keyed by (cache_salt, token prefix), LRU-evicted."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpreflight._internal.builtin_engine.pool import PagedKVPool


class PrefixCache:
    """Each cached page holds one pool reference; a page referenced only by the cache is evictable.

    `ignore_salt` is fault prefix-cache-no-salt: tenants with different salts share entries.
    """

    def __init__(self, pool: PagedKVPool, page_size: int, ignore_salt: bool) -> None:
        self.pool = pool
        self.page_size = page_size
        self.ignore_salt = ignore_salt
        self.entries: OrderedDict[bytes, int] = OrderedDict()
        self.lock = threading.Lock()

    def _keys(self, ids: list[int], salt: str | None, pages: int) -> list[bytes]:
        h = hashlib.sha256(b"salt:" + (b"" if self.ignore_salt else (salt or "").encode()))
        keys = []
        for k in range(pages):
            h = h.copy()
            chunk = ids[k * self.page_size : (k + 1) * self.page_size]
            h.update(b"".join(t.to_bytes(4, "little") for t in chunk))
            keys.append(h.digest())
        return keys

    def match(self, ids: list[int], salt: str | None) -> list[int]:
        """Cached pages for the longest full-page prefix; at least one token is left to compute."""
        usable = (len(ids) - 1) // self.page_size
        found: list[int] = []
        with self.lock:
            for key in self._keys(ids, salt, usable):
                page = self.entries.get(key)
                if page is None:
                    break
                self.entries.move_to_end(key)
                found.append(page)
            self.pool.ref(found)
        return found

    def insert(self, ids: list[int], salt: str | None, pages: list[int]) -> None:
        full = min(len(ids) // self.page_size, len(pages))
        with self.lock:
            for key, page in zip(self._keys(ids, salt, full), pages[:full], strict=True):
                if key in self.entries:
                    continue
                self.entries[key] = page
                self.pool.ref([page])

    def evictable_pages(self) -> int:
        with self.lock:
            return sum(1 for p in self.entries.values() if self.pool.refcount(p) == 1)

    def evict(self, want_pages: int) -> int:
        freed = 0
        with self.lock:
            for key in list(self.entries):
                if freed >= want_pages:
                    break
                page = self.entries[key]
                if self.pool.refcount(page) == 1:
                    del self.entries[key]
                    freed += len(self.pool.release([page]))
        return freed
