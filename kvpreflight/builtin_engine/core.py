"""The engine proper: admission (SGLang's length checks), the prefix cache, prefill, the decode
loop and the decode side of the PD handoff. Runs inside the engine process only (imports torch).

Faults live in `self.faults` and change behaviour only; nothing here reports them anywhere.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from kvpreflight.builtin_engine import tokenizer
from kvpreflight.builtin_engine.config import KV_DIM, EngineConfig, max_req_input_len
from kvpreflight.builtin_engine.model import CopyModel
from kvpreflight.builtin_engine.pagelog import PageLog
from kvpreflight.builtin_engine.pool import PagedKVPool

ALLOC_WAIT_S = 30.0  # a request waits this long for pages held by others (SGLang queues)
BOOTSTRAP_WAIT_S = 60.0


class RequestError(Exception):
    """A request refused or failed; `status` is the HTTP status SGLang would answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    cache_salt: str | None = None
    rid: str = ""
    stream: bool = False


@dataclass(frozen=True)
class Generation:
    rid: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: dict
    cached_tokens: int = 0
    input_logprobs: tuple = ()
    output_logprobs: tuple = ()

    @property
    def text(self) -> str:
        return tokenizer.decode(list(self.output_ids))


@dataclass
class Room:
    """Decode-side state of one PD handoff (SGLang's bootstrap room)."""

    room: int
    rid: str
    reserved_tokens: int
    bootstrapped: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    pages: list[int] = field(default_factory=list)
    pages_released: bool = False
    error: str | None = None
    transfer_status: str | None = None
    tokens_sent: int = 0
    cached_tokens: int = 0
    cancelled_at: float | None = None


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests: int = 0
    cached_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    transfers_sent: int = 0
    transfers_received: int = 0
    transfer_pages: int = 0
    transfer_failed: int = 0
    bootstrap_failed: int = 0
    deferred_release: int = 0
    deferred_release_seconds: float = 0.0
    running: int = 0


class PrefixCache:
    """Page-granular prefix cache keyed by (cache_salt, token prefix), LRU-evicted.

    Each cached page holds one pool reference; a page referenced only by the cache is evictable.
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
            for key, page in zip(self._keys(ids, salt, full), pages[:full]):
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


class Engine:
    def __init__(self, config: EngineConfig, pool_tokens: int, device: str) -> None:
        self.config = config
        self.role = config.role
        self.faults = config.faults
        self.device = device
        self.context_len = int(config.context_length)
        self.page_size = config.page_size
        self.pool = PagedKVPool(pool_tokens // self.page_size, self.page_size, KV_DIM, device)
        self.model = CopyModel(device)
        self.page_log = PageLog(config.page_log)
        self.counters = Counters()
        self.counter_lock = threading.Lock()
        self.compute_lock = threading.Lock()  # one forward pass at a time, like one scheduler
        use_cache = self.role in ("unified", "prefill") and not config.extra.get("disable_radix_cache")
        self.prefix_cache = (
            PrefixCache(self.pool, self.page_size, "prefix-cache-no-salt" in self.faults) if use_cache else None
        )
        self.rooms: dict[int, Room] = {}
        self.refused_rooms: dict[int, tuple[str, int, float]] = {}
        self.rooms_lock = threading.Condition()
        self.transfer_seq = 0

    # ---- what the engine says about itself -------------------------------------------------

    @property
    def real_pool_tokens(self) -> int:
        return self.pool.capacity_tokens

    @property
    def reported_pool_tokens(self) -> int:
        # misreport-pool: the scheduler believes (and reports) twice what the allocator holds.
        return self.real_pool_tokens * 2 if "misreport-pool" in self.faults else self.real_pool_tokens

    @property
    def max_req_input_len(self) -> int:
        return max_req_input_len(self.context_len, self.reported_pool_tokens)

    def used_tokens(self) -> int:
        evictable = self.prefix_cache.evictable_pages() if self.prefix_cache else 0
        used_pages = self.pool.num_pages - self.pool.free_pages() - evictable
        return used_pages * self.page_size

    def count(self, **deltas: float) -> None:
        with self.counter_lock:
            for name, delta in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + delta)

    # ---- admission ---------------------------------------------------------------------------

    def tokenize(self, text: str | None, input_ids: list | None) -> list[int]:
        if input_ids is not None:
            if not isinstance(input_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
                raise RequestError("input_ids must be a list of integers.")
            bad = [t for t in input_ids if t < 0 or t >= tokenizer.VOCAB_SIZE]
            if bad:
                raise RequestError(f"Token id {bad[0]} is out of vocabulary (vocab size {tokenizer.VOCAB_SIZE}).")
            return list(input_ids)
        if isinstance(text, list):
            raise RequestError("Batched text is not supported by the builtin engine: send one string per request.")
        if not isinstance(text, str):
            raise RequestError("Either text or input_ids should be provided.")
        return tokenizer.encode(text)

    def admit(self, ids: list[int], max_new_tokens: int | None = None) -> tuple[list[int], str | None]:
        """SGLang's two length checks, in SGLang's order. Returns (ids, pending_abort): the
        second item is set only by fault reject-continues, which lets a refused prompt flow on."""
        n = len(ids)
        if n == 0:
            raise RequestError("The input is empty: send at least one token.")
        truncate = "auto-truncate" in self.faults
        if n >= self.context_len:
            if not truncate:
                raise RequestError(
                    f"The input ({n} tokens) is longer than the model's context length ({self.context_len} tokens)."
                )
            ids = ids[: self.context_len]
            n = len(ids)
        # SGLang's tokenizer manager (validate_total_tokens, on by default): prompt plus
        # max_new_tokens must fit the context; it refuses rather than cutting max_new_tokens.
        if max_new_tokens is not None and not truncate and n + max_new_tokens > self.context_len:
            raise RequestError(
                "Requested token count exceeds the model's maximum context length "
                f"of {self.context_len} tokens. You requested a total of {n + max_new_tokens} "
                f"tokens: {n} tokens from the input messages and "
                f"{max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        limit = self.max_req_input_len
        if n >= limit:
            if truncate:
                return ids[:limit], None
            message = (
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
            if "reject-continues" in self.faults and self.role == "prefill":
                # Pre-0.5.21 Req.set_finish_with_abort: a 1-token placeholder keeps flowing.
                return [tokenizer.PLACEHOLDER_ID], message
            raise RequestError(message)
        if -(-n // self.page_size) > self.pool.num_pages:
            # Only reachable when the reported pool is larger than the real one.
            raise RequestError(f"Request prompt exceeds the KV memory budget: input_len={n}.")
        return ids, None

    # ---- pages ---------------------------------------------------------------------------------

    def alloc_pages(self, count: int, rid: str, wait_s: float = ALLOC_WAIT_S) -> list[int]:
        if count > self.pool.num_pages:
            raise RequestError(f"Request prompt exceeds the KV memory budget: input_len={count * self.page_size}.")
        deadline = time.monotonic() + wait_s
        while True:
            pages = self.pool.alloc(count)
            if pages is None and self.prefix_cache is not None:
                self.prefix_cache.evict(count - self.pool.free_pages())
                pages = self.pool.alloc(count)
            if pages is not None:
                self.page_log.event("given", rid, pages)
                return pages
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestError("The KV pool has no free pages for this request; retry later.", status=503)
            with self.pool.changed:
                self.pool.changed.wait(min(remaining, 0.2))

    def release(self, pages: list[int], rid: str, **fields: object) -> None:
        freed = self.pool.release(pages)
        self.page_log.event("freed", rid, pages, returned_to_pool=freed, **fields)

    def write_kv(self, ids: list[int], pages: list[int], start: int = 0) -> None:
        if start >= len(ids):
            return
        slots = self.pool.slots(pages, len(ids))[start:]
        with self.compute_lock:
            self.pool.flat()[slots] = self.model.kv_for(ids[start:])

    # ---- prefill (unified and prefill roles) ----------------------------------------------------

    def prefill(self, ids: list[int], params: GenParams) -> tuple[list[int], int]:
        """Computes the prompt's KV into pool pages; returns (page table, cached tokens)."""
        cached = self.prefix_cache.match(ids, params.cache_salt) if self.prefix_cache else []
        if self.prefix_cache is not None:
            self.count(cache_queries=1, cache_hits=1 if cached else 0)
        if cached:
            self.page_log.event("cache_hit", params.rid, cached)
        need = -(-len(ids) // self.page_size) - len(cached)
        try:
            pages = cached + self.alloc_pages(need, params.rid)
        except RequestError:
            if cached:
                self.release(cached, params.rid)
            raise
        cached_tokens = len(cached) * self.page_size
        self.write_kv(ids, pages, start=cached_tokens)
        self.count(prompt_tokens=len(ids), cached_tokens=cached_tokens)
        return pages, cached_tokens

    def finish_prefill_pages(self, ids: list[int], pages: list[int], params: GenParams) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.insert(ids, params.cache_salt, pages)
        self.release(pages, params.rid)

    # ---- decode loop ------------------------------------------------------------------------------

    def decode_tokens(
        self, pages: list[int], prompt_len: int, params: GenParams, rid: str
    ) -> Iterator[tuple[int, float, dict | None]]:
        """Yields (token, logprob, finish_reason or None). Extends `pages` in place as it writes."""
        length = prompt_len
        produced: list[int] = []
        if params.max_new_tokens <= 0:
            return
        for step in range(params.max_new_tokens):
            with self.compute_lock:
                cache = self.pool.flat()[self.pool.slots(pages, length)]
                token, logprob = self.model.step(cache, step)
            produced.append(token)
            finish = None
            if token == tokenizer.EOS_ID and not params.ignore_eos:
                finish = {"type": "stop", "matched": token}
            elif token in params.stop_token_ids:
                finish = {"type": "stop", "matched": token}
            elif params.stop:
                text = tokenizer.decode(produced)
                hit = next((s for s in params.stop if s and s in text), None)
                if hit is not None:
                    finish = {"type": "stop", "matched": hit}
            if finish is None and step + 1 == params.max_new_tokens:
                finish = {"type": "length", "length": params.max_new_tokens}
            if finish is None:
                # The generated token's KV goes into the cache like any other.
                if length // self.page_size >= len(pages):
                    try:
                        pages.extend(self.alloc_pages(1, rid, wait_s=5.0))
                    except RequestError as exc:
                        yield token, logprob, {"type": "abort", "message": str(exc), "status_code": 503}
                        return
                slot = self.pool.slots(pages, length + 1)[length:]
                with self.compute_lock:
                    self.pool.flat()[slot] = self.model.kv_for([token])
                length += 1
            yield token, logprob, finish
            if finish is not None:
                return

    def input_logprobs(self, pages: list[int], ids: list[int], start: int) -> list:
        if start < 0:
            return []
        with self.compute_lock:
            cache = self.pool.flat()[self.pool.slots(pages, len(ids))]
            values = self.model.position_logprobs(cache, ids)
        out = []
        for t in range(start, len(ids)):
            # SGLang gives the first prompt token no logprob.
            out.append([None if t == 0 else values[t], ids[t], None])
        return out

    def generate_from_pages(
        self,
        ids: list[int],
        pages: list[int],
        params: GenParams,
        cached_tokens: int,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Generation:
        in_lp = self.input_logprobs(pages, ids, params.logprob_start_len) if params.return_logprob else []
        out_ids: list[int] = []
        out_lp: list = []
        finish: dict = {"type": "length", "length": 0}
        self.count(running=1)
        try:
            for token, logprob, done in self.decode_tokens(pages, len(ids), params, params.rid):
                out_ids.append(token)
                out_lp.append([logprob, token, None])
                if on_token is not None:
                    on_token(token, logprob)
                if done is not None:
                    finish = done
        finally:
            self.count(running=-1)
        if params.max_new_tokens <= 0:
            finish = {"type": "length", "length": 0}
        self.count(generation_tokens=len(out_ids), num_requests=1)
        return Generation(
            rid=params.rid,
            prompt_ids=tuple(ids),
            output_ids=tuple(out_ids),
            finish_reason=finish,
            cached_tokens=cached_tokens,
            input_logprobs=tuple(map(tuple, in_lp)),
            output_logprobs=tuple(map(tuple, out_lp)) if params.return_logprob else (),
        )

    def run_unified(self, ids: list[int], params: GenParams, on_token=None) -> Generation:
        ids, _ = self.admit(ids, params.max_new_tokens)
        pages, cached = self.prefill(ids, params)
        try:
            return self.generate_from_pages(ids, pages, params, cached, on_token)
        finally:
            prompt_pages = -(-len(ids) // self.page_size)
            if len(pages) > prompt_pages:
                self.release(pages[prompt_pages:], params.rid)
            self.finish_prefill_pages(ids, pages[:prompt_pages], params)

    # ---- decode side of the PD handoff ------------------------------------------------------------

    def open_room(self, room_id: int, rid: str, ids: list[int]) -> Room:
        room = Room(room=room_id, rid=rid, reserved_tokens=len(ids))
        with self.rooms_lock:
            refused = self.refused_rooms.pop(room_id, None)
            if refused is not None:
                # The prefill refused (and said so) before this request reached decode.
                room.error = refused[0]
                room.bootstrapped.set()
            else:
                self.rooms[room_id] = room
            self.rooms_lock.notify_all()
        return room

    def refuse_room(self, room_id: int, message: str, status: int = 400) -> None:
        """Remember that a room will never bootstrap, so the other side need not wait for it."""
        with self.rooms_lock:
            room = self.rooms.get(room_id)
            if room is not None:
                room.error = message
                room.bootstrapped.set()
            else:
                now = time.monotonic()
                for key in [k for k, v in self.refused_rooms.items() if now - v[2] > 300]:
                    del self.refused_rooms[key]
                self.refused_rooms[room_id] = (message, status, now)
            self.rooms_lock.notify_all()

    def find_room(self, room_id: int, wait_s: float = 10.0) -> tuple[Room | None, tuple[str, int] | None]:
        """(room, None) once the decode request arrived, or (None, (message, status)) when
        decode refused it itself. The router sends to both at once, so the prefill may knock first."""
        deadline = time.monotonic() + wait_s
        with self.rooms_lock:
            while room_id not in self.rooms:
                if room_id in self.refused_rooms:
                    message, status, _ = self.refused_rooms.pop(room_id)
                    return None, (message, status)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, ("unknown bootstrap room", 500)
                self.rooms_lock.wait(remaining)
            return self.rooms[room_id], None

    def close_room(self, room: Room) -> None:
        with self.rooms_lock:
            self.rooms.pop(room.room, None)

    def release_room_pages(self, room: Room, **fields: object) -> None:
        with self.rooms_lock:
            if room.pages_released or not room.pages:
                room.pages_released = True
                return
            room.pages_released = True
            pages = list(room.pages)
        self.release(pages, room.rid, room=room.room, **fields)

    def cancel_room(self, room: Room) -> None:
        """The client went away. Pages are released only once the transfer drained (deferred
        release), unless fault early-free-on-cancel frees them while writes are in flight."""
        room.cancelled_at = time.monotonic()
        self.page_log.event("cancel", room.rid, room.pages, room=room.room, transfer_done=room.done.is_set())
        if room.done.is_set() or not room.bootstrapped.is_set():
            self.release_room_pages(room, reason="cancelled")
            self.close_room(room)
        elif "early-free-on-cancel" in self.faults:
            self.release_room_pages(room, reason="cancelled")
        # else: the transfer thread releases them when the transfer ends (see transfer_ended).

    def transfer_ended(self, room: Room, status: str, tokens_sent: int) -> None:
        room.transfer_status = status
        room.tokens_sent = tokens_sent
        self.page_log.event("transfer_end", room.rid, room.pages, room=room.room, status=status, tokens=tokens_sent)
        room.done.set()
        if room.cancelled_at is not None:
            if not room.pages_released:
                waited = time.monotonic() - room.cancelled_at
                self.count(deferred_release=1, deferred_release_seconds=waited)
                self.release_room_pages(room, reason="deferred_release", waited_s=round(waited, 4))
            self.close_room(room)

    def decode_after_transfer(self, room: Room, ids: list[int], params: GenParams, on_token=None) -> Generation:
        try:
            if room.transfer_status != "ok":
                self.count(transfer_failed=1)
                raise RequestError(
                    f"KV transfer failed for request {room.rid} (bootstrap room {room.room}): {room.transfer_status}.",
                    status=500,
                )
            if "no-transfer-check" not in self.faults and room.tokens_sent != room.reserved_tokens:
                raise RequestError(
                    f"Context corruption detected: received KV for {room.tokens_sent} tokens but "
                    f"{room.reserved_tokens} tokens were reserved for request {room.rid}.",
                    status=500,
                )
            pages = list(room.pages)
            try:
                return self.generate_from_pages(ids, pages, params, room.cached_tokens, on_token)
            finally:
                # Pages added for generated tokens go back even when the client disconnected
                # mid-decode (found by the isolation probes: 16 tokens leaked per disconnect).
                extra = pages[len(room.pages):]
                if extra:
                    self.release(extra, room.rid)
        finally:
            self.release_room_pages(room, reason="finished")
            self.close_room(room)


def new_rid() -> str:
    return uuid.uuid4().hex


def device_for(choice: str) -> str:
    if choice == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        from kvpreflight.builtin_engine.config import EngineConfigError

        raise EngineConfigError("--device cuda was asked for but torch sees no CUDA device; use --device cpu or auto")
    return "cpu"
