"""The paged KV pool: one torch tensor of pages, allocated once at start-up.

Pages are handed out lowest index first and reused WITHOUT zeroing, as SGLang does for speed:
whatever a page held stays there until someone writes it again. That is what makes a missing or
misdirected KV write visible as someone else's text.
"""

from __future__ import annotations

import ctypes
import heapq
import threading

import torch


class PagedKVPool:
    def __init__(self, num_pages: int, page_size: int, dim: int, device: str) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.dim = dim
        # [page, slot in page, K|V, dim]; zeroed once here, never again.
        self.kv = torch.zeros(num_pages, page_size, 2, dim, dtype=torch.float32, device=device)
        self._free = list(range(num_pages))
        heapq.heapify(self._free)
        self._refs = [0] * num_pages
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def free_pages(self) -> int:
        with self._lock:
            return len(self._free)

    def alloc(self, count: int) -> list[int] | None:
        """`count` pages, lowest index first, or None when not enough are free."""
        with self._lock:
            if count > len(self._free):
                return None
            pages = [heapq.heappop(self._free) for _ in range(count)]
            for p in pages:
                self._refs[p] = 1
            return pages

    def ref(self, pages: list[int]) -> None:
        with self._lock:
            for p in pages:
                self._refs[p] += 1

    def release(self, pages: list[int]) -> list[int]:
        """Drop one reference from each page; returns the pages that became free."""
        freed = []
        with self._lock:
            for p in pages:
                if self._refs[p] <= 0:
                    continue  # already free: a double release must not duplicate the page
                self._refs[p] -= 1
                if self._refs[p] == 0:
                    heapq.heappush(self._free, p)
                    freed.append(p)
            self.changed.notify_all()
        return freed

    def refcount(self, page: int) -> int:
        with self._lock:
            return self._refs[page]

    def flat(self) -> torch.Tensor:
        """[token slot, K|V, dim] view over the whole pool."""
        return self.kv.view(self.num_pages * self.page_size, 2, self.dim)

    def slots(self, pages: list[int], num_tokens: int) -> torch.Tensor:
        """Pool slot index of each of the first num_tokens positions of a page table."""
        ps = self.page_size
        table = torch.tensor(pages, dtype=torch.long, device=self.kv.device)
        pos = torch.arange(num_tokens, dtype=torch.long, device=self.kv.device)
        return table[pos // ps] * ps + pos % ps

    def read_pages(self, pages: list[int]) -> bytes:
        return tensor_bytes(self.kv[torch.tensor(pages, dtype=torch.long, device=self.kv.device)])

    def write_pages(self, pages: list[int], data: bytes) -> None:
        src = torch.frombuffer(bytearray(data), dtype=torch.float32).view(len(pages), self.page_size, 2, self.dim)
        self.kv[torch.tensor(pages, dtype=torch.long, device=self.kv.device)] = src.to(self.kv.device)


def tensor_bytes(t: torch.Tensor) -> bytes:
    # numpy is not a dependency: copy the contiguous CPU storage out directly.
    t = t.detach().to("cpu").contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
