"""The engine proper: admission (SGLang's length checks), prefill with the prefix cache and the
decode loop. Runs inside the engine process only (imports torch); the PD handoff is in pd.py
(protocol, wire), pd_prefill.py and pd_decode.py.

Faults live in `self.faults` and change behaviour only; nothing here reports them anywhere.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from kvpreflight._internal.builtin_engine import tokenizer
from kvpreflight._internal.builtin_engine.config import CELL_BYTES, KV_DIM, EngineConfig, Fault, ServeConfigError, max_req_input_len
from kvpreflight._internal.builtin_engine.metrics import ServedCounters
from kvpreflight._internal.builtin_engine.model import CopyModel
from kvpreflight._internal.builtin_engine.pagelog import PageLog
from kvpreflight._internal.builtin_engine.pool import PagedKVPool
from kvpreflight._internal.builtin_engine.prefix_cache import PrefixCache
from kvpreflight._internal.builtin_engine.protocol import FinishReason, Generation, GenParams, LogprobEntry, OnToken, RequestError
from kvpreflight.model import ProcessRole

MAX_CANARY_LINES = 8  # violation lines logged per request (the count covers them all)

ALLOC_WAIT_S = 30.0  # a request waits this long for pages held by others (SGLang queues)
LEAK_TOKENS = 96  # faults leak-*: the tail another tenant's prompt lends (the copy head reads 38 back)
SHORTEN_FROM = 256  # fault shortened-prompt: shorter prompts pass whole (calibration, health checks)
DECODE_CACHE_FAULTS = frozenset({Fault.DECODE_CACHE_NO_SALT, Fault.DECODE_CACHE_NO_SALT_PARTIAL})
POSITIONS_FAULTS = frozenset({Fault.POSITIONS_OVERRIDDEN, Fault.POSITIONS_OVERRIDDEN_SILENT})
WINDOW_FAULTS = frozenset({Fault.ATTENTION_WINDOW, Fault.ATTENTION_WINDOW_SILENT})
NOISE_TOKENS = range(33, 127)  # faults positions-overridden*: what a model past its positions emits (printable bytes)
WEDGE_POLL_S = 0.2  # fault wedge-after-disconnect: how often a request that is never scheduled looks for its client


class Engine:
    def __init__(self, config: EngineConfig, pool_tokens: int, device: str) -> None:
        assert config.context_length is not None, "EngineConfig.validate() requires it for an engine role"
        self.config = config
        self.role = config.role
        self.faults = config.faults
        self.device = device
        self.context_len = config.context_length
        self.page_size = config.page_size
        self.pool = PagedKVPool(pool_tokens // self.page_size, self.page_size, KV_DIM, device)
        self.model = CopyModel(device)
        self.page_log = PageLog(config.page_log)
        self.counters = ServedCounters()
        self._counter_lock = threading.Lock()
        self.compute_lock = threading.Lock()  # one forward pass at a time, like one scheduler
        use_cache = self.role in (ProcessRole.UNIFIED, ProcessRole.PREFILL) and not config.disable_radix_cache
        self.prefix_cache = (
            PrefixCache(self.pool, self.page_size, Fault.PREFIX_CACHE_NO_SALT in self.faults) if use_cache else None
        )
        if self.role is ProcessRole.DECODE and self.faults & DECODE_CACHE_FAULTS:
            # Faults decode-cache-no-salt*: the decode's own radix cache (SGLang PR #19746), its key without the salt.
            self.prefix_cache = PrefixCache(self.pool, self.page_size, ignore_salt=True)
        # Faults positions-overridden*: the model's positions (None: as many as the context).
        self.positions = ((config.positions or max(1, self.context_len // 2))
                          if self.faults & POSITIONS_FAULTS else None)
        # Faults attention-window*: the tokens attention sees, counted back from the last (None: all).
        self.attention_window = ((config.attention_window or max(1, self.context_len // 4))
                                 if self.faults & WINDOW_FAULTS else None)
        self._transfer_seq = 0
        self._last_prompts: dict[str | None, list[int]] = {}  # cache_salt -> its last prompt (faults leak-*)
        self.wedged = threading.Event()  # fault wedge-after-disconnect: the scheduler stopped

    # ---- what the engine says about itself -------------------------------------------------

    @property
    def real_pool_tokens(self) -> int:
        return self.pool.capacity_tokens

    @property
    def reported_pool_tokens(self) -> int:
        # misreport-pool: the scheduler believes (and reports) twice what the allocator holds.
        if Fault.MISREPORT_POOL in self.faults:
            return self.real_pool_tokens * 2
        # pool-in-another-unit: per-rank tokens times the parallel size, in every source.
        if Fault.POOL_IN_ANOTHER_UNIT in self.faults:
            return self.real_pool_tokens * self.config.parallel_size
        return self.real_pool_tokens

    @property
    def allocator_pool_tokens(self) -> int:
        """The pool the allocator's start-up line and the KV byte figures state: what it holds,
        except under pool-in-another-unit, whose stated unit is the same in every source (the
        misreport-pool fault's allocator tells the truth, which is how it is caught)."""
        return self.reported_pool_tokens if Fault.POOL_IN_ANOTHER_UNIT in self.faults else self.real_pool_tokens

    @property
    def allocator_kv_bytes(self) -> int:
        return self.allocator_pool_tokens * CELL_BYTES

    @property
    def max_req_input_len(self) -> int:
        return max_req_input_len(self.context_len, self.reported_pool_tokens)

    def used_tokens(self) -> int:
        evictable = self.prefix_cache.evictable_pages() if self.prefix_cache else 0
        used_pages = self.pool.num_pages - self.pool.free_pages() - evictable
        return used_pages * self.page_size

    def count(self, **deltas: float) -> None:
        with self._counter_lock:
            for name, delta in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + delta)

    def fault_fires(self) -> bool:
        """Whether a racy fault fires at this chance (always, unless a probability is set)."""
        p = self.config.fault_probability
        return p >= 1.0 or random.random() < p

    def next_transfer_seq(self) -> int:
        """1, 2, 3, ... for the KV transfers this engine sends (the transfer faults pick by it)."""
        with self._counter_lock:
            self._transfer_seq += 1
            return self._transfer_seq

    # ---- admission ---------------------------------------------------------------------------

    def admit(self, ids: list[int], max_new_tokens: int | None = None) -> tuple[list[int], str | None]:
        """SGLang's two length checks, in SGLang's order. Returns (ids, pending_abort): the
        second item is set only by fault reject-continues, which lets a refused prompt flow on."""
        n = len(ids)
        if n == 0:
            raise RequestError("The input is empty: send at least one token.")
        truncate = Fault.AUTO_TRUNCATE in self.faults
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
            if Fault.REJECT_CONTINUES in self.faults and self.role is ProcessRole.PREFILL:
                # Pre-0.5.21 Req.set_finish_with_abort: a 1-token placeholder keeps flowing.
                return [tokenizer.PLACEHOLDER_ID], message
            raise RequestError(message)
        if -(-n // self.page_size) > self.pool.num_pages:
            # Only reachable when the reported pool is larger than the real one.
            if self.over_true_pool(n):
                return ids, None  # the caller prefills a placeholder (prefill_placeholder)
            raise RequestError(f"Request prompt exceeds the KV memory budget: input_len={n}.")
        return ids, None

    def over_true_pool(self, n: int) -> bool:
        """Fault pool-in-another-unit: a prompt admitted against the stated pool that the real
        one cannot hold. It is not refused: a 1-token placeholder is prefilled instead."""
        return Fault.POOL_IN_ANOTHER_UNIT in self.faults and -(-n // self.page_size) > self.pool.num_pages

    def prefill_placeholder(self, ids: list[int], params: GenParams) -> tuple[list[int], int]:
        """Fault pool-in-another-unit, over the true pool: the request's page table spans its
        per-rank share of the prompt (len / P tokens; at most what leaves the pool room for the
        answer's tokens, so that it can grow), but only its first slot is written, with a 1-token
        placeholder (the incident's abort path); the rest holds whatever earlier requests left
        there. Counted as the whole prompt, as the incident's engine counted it. Returns (pages,
        the tokens the table spans)."""
        room = self.real_pool_tokens - self.page_size - max(params.max_new_tokens, 0)
        span = max(1, min(-(-len(ids) // self.config.parallel_size), room))
        if self.prefix_cache is not None:
            self.count(cache_queries=1)
        pages = self.alloc_pages(-(-span // self.page_size), params.rid)
        self.write_kv([tokenizer.PLACEHOLDER_ID], pages)
        self.count(prompt_tokens=len(ids))
        return pages, span

    # ---- fault wedge-after-disconnect ---------------------------------------------------------

    def wedge_on_disconnect(self) -> None:
        """Called where a request's client is found gone, its pages still held. Under fault
        wedge-after-disconnect the scheduler stops there for good: this never returns, so the
        abandoned request keeps its pages (the used-token gauge stays at its tokens) and is
        never counted as aborted."""
        if Fault.WEDGE_AFTER_DISCONNECT not in self.faults:
            return
        self.wedged.set()
        threading.Event().wait()  # nobody sets it: the thread, and the pages it holds, stay

    def never_scheduled(self, client_gone: Callable[[], bool] | None) -> bool:
        """A wedged engine accepts a request and never schedules it: waits until its client
        leaves, then True (nothing to answer). False at once when the engine is not wedged."""
        if not self.wedged.is_set():
            return False
        while client_gone is None or not client_gone():
            time.sleep(WEDGE_POLL_S)
        return True

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

    def grow(self, pages: list[int], rid: str) -> None:
        """One more page for a decoding request, appended to `pages`. When none is free the
        request is retracted, as SGLang's scheduler retracts one it cannot grow: its KV copied
        out, its pages freed for the requests it would otherwise wait on, then all it needs taken
        again (ALLOC_WAIT_S at most) and its KV put back; `pages` is updated in place. Waiting
        while holding its pages let growing requests wait on each other until one was refused, and
        an honest engine failed a check (docs/FINDINGS.md: `cancel-transfer` went inconclusive under load)."""
        try:
            pages.extend(self.alloc_pages(1, rid, wait_s=0))
            return
        except RequestError:
            pass
        with self.compute_lock:
            kv = self.pool.read_pages(pages)
        held = len(pages)
        self.release(pages, rid, reason="retracted")
        pages.clear()  # freed: whoever releases this request's pages later must not free them twice
        self.count(retracted=1)
        fresh = self.alloc_pages(held + 1, rid)
        with self.compute_lock:
            self.pool.write_pages(fresh[:held], kv)
        pages.extend(fresh)

    def release(self, pages: list[int], rid: str, **fields: object) -> None:
        freed = self.pool.release(pages)
        self.page_log.event("freed", rid, pages, returned_to_pool=freed, **fields)

    def write_kv(self, ids: list[int], pages: list[int], start: int = 0) -> None:
        if start >= len(ids):
            return
        slots = self.pool.slots(pages, len(ids))[start:]
        with self.compute_lock:
            self.pool.flat()[slots] = self.model.kv_for(ids[start:])
            if rate := self.config.prefill_tokens_per_second:
                # A slow accelerator: held under the compute lock, so concurrent prompts queue as on one GPU.
                time.sleep((len(ids) - start) / rate)

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

    # ---- the decode's own prefix cache (faults decode-cache-no-salt*) ------------------------------

    def decode_cache_lookup(self, ids: list[int], salt: str | None, rid: str) -> list[int]:
        """The pages of the longest prefix of `ids` the decode's cache holds (referenced for this
        request; the prefill then sends only the rest). Keyed without the salt: another tenant's
        prefix is reused. Counted as SGLang's decode counts a radix hit: the reused tokens as cached
        prompt tokens (decode-cache-no-salt also in the lookup counter and the hit rate)."""
        if self.prefix_cache is None or self.role is not ProcessRole.DECODE:
            return []
        found = self.prefix_cache.match(ids, salt)
        if Fault.DECODE_CACHE_NO_SALT_PARTIAL in self.faults and found:
            keep = len(found) // 2  # a partial hit: the first half of the cached prefix
            self.pool.release(found[keep:])
            found = found[:keep]
        tokens = len(found) * self.page_size
        if found:
            self.page_log.event("cache_hit", rid, found)
        # prompt_tokens too, as SGLang's prompt counter includes the cached tokens: computed
        # (prompt - cached) stays 0 on the decode, the hit shows as cached.
        self.count(prompt_tokens=tokens, cached_tokens=tokens)
        if Fault.DECODE_CACHE_NO_SALT in self.faults:
            self.count(cache_queries=1, cache_hits=1 if found else 0)
        return found

    def decode_cache_insert(self, ids: list[int], salt: str | None, pages: list[int]) -> None:
        """After a decode: its prompt's full pages join the decode's cache (refcounted there)."""
        if self.prefix_cache is not None and self.role is ProcessRole.DECODE:
            self.prefix_cache.insert(ids, salt, pages[: len(ids) // self.page_size])

    # ---- decode loop ------------------------------------------------------------------------------

    def decode_tokens(
        self, pages: list[int], prompt_len: int, params: GenParams, rid: str
    ) -> Iterator[tuple[int, float, FinishReason | None]]:
        """Yields (token, logprob, finish_reason or None). Extends `pages` in place as it writes."""
        length = prompt_len
        produced: list[int] = []
        if params.max_new_tokens <= 0:
            return
        # Fault attention-window*: the copy head's query sees only the last `window` tokens of the
        # prompt, so step i reads position len - window + i (its answer is the prompt's tail).
        window = self.attention_window
        shift = prompt_len - window if window is not None and prompt_len > window else 0
        noise = random.Random(f"{rid}:{prompt_len}") if self.positions is not None else None
        for step in range(params.max_new_tokens):
            if noise is not None and self.positions is not None and length > self.positions:
                # Faults positions-overridden*: a query past the model's positions reads nothing
                # the prompt holds (SGLang: "may lead to incorrect model outputs").
                token, logprob = noise.choice(NOISE_TOKENS), -math.log(len(NOISE_TOKENS))
            else:
                with self.compute_lock:
                    cache = self.pool.flat()[self.pool.slots(pages, length)]
                    token, logprob = self.model.step(cache, shift + step)
            produced.append(token)
            finish: FinishReason | None = None
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
                        self.grow(pages, rid)
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

    def input_logprobs(self, pages: list[int], ids: list[int], start: int) -> list[LogprobEntry]:
        if start < 0:
            return []
        with self.compute_lock:
            cache = self.pool.flat()[self.pool.slots(pages, len(ids))]
            values = self.model.position_logprobs(cache, ids)
        out: list[LogprobEntry] = []
        for t in range(start, len(ids)):
            # SGLang gives the first prompt token no logprob.
            out.append((None if t == 0 else values[t], ids[t], None))
        return out

    def verify_canary(self, pages: list[int], ids: list[int], rid: str) -> None:
        """--kv-canary log|raise: before decoding, every prompt slot must hold the KV of the token
        this request put there (SGLang's canary keeps a sidecar per slot; this model's KV names
        its token). A mismatch is logged in SGLang's frozen format; raise also fails the request."""
        if self.config.kv_canary == "none" or not ids:
            return
        slots = self.pool.slots(pages, len(ids))
        with self.compute_lock:
            stored = self.model.tokens_in(self.pool.flat()[slots]).tolist()
        bad = [pos for pos, (got, want) in enumerate(zip(stored, ids, strict=True)) if got != want]
        if not bad:
            return
        from kvpreflight._internal.builtin_engine.startup import log  # startup imports this module

        for pos in bad[:MAX_CANARY_LINES]:
            # srt/kv_canary/runner/violation_reporter.py _format_violation (SGLang 0.5.13-0.5.23)
            log(f"kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_token slot_idx={int(slots[pos])} "
                f"position={pos} stored_token={stored[pos]} expected_token={ids[pos]} "
                f"stored_chain_hash=0x0000000000000000 expected_aux=0x0000000000000000")
        if self.config.kv_canary == "raise":
            raise RequestError(f"KV cache canary violation detected for request {rid} ({len(bad)} slots)", status=500)

    def generate_from_pages(
        self,
        ids: list[int],
        pages: list[int],
        params: GenParams,
        cached_tokens: int,
        on_token: OnToken | None = None,
        client_gone: Callable[[], bool] | None = None,
    ) -> Generation | None:
        self.verify_canary(pages, ids, params.rid)
        in_lp = self.input_logprobs(pages, ids, params.logprob_start_len) if params.return_logprob else []
        out_ids: list[int] = []
        out_lp: list[LogprobEntry] = []
        finish: FinishReason = {"type": "length", "length": 0}
        self.count(running=1)
        try:
            if client_gone is not None and client_gone():  # left during prefill: not one token for it
                self.wedge_on_disconnect()
                self.count(aborted_requests=1)
                return None
            for token, logprob, done in self.decode_tokens(pages, len(ids), params, params.rid):
                out_ids.append(token)
                out_lp.append((logprob, token, None))
                if on_token is not None:
                    on_token(token, logprob)
                if done is not None:
                    finish = done
                elif client_gone is not None and client_gone():  # as SGLang's scheduler aborts it
                    self.wedge_on_disconnect()
                    self.count(aborted_requests=1, generation_tokens=len(out_ids))
                    return None
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
            input_logprobs=tuple(in_lp),
            output_logprobs=tuple(out_lp) if params.return_logprob else (),
        )

    def run_unified(self, ids: list[int], params: GenParams, on_token: OnToken | None = None,
                    client_gone: Callable[[], bool] | None = None) -> Generation | None:
        """None: the client left before the answer was complete (counted as an abort)."""
        ids, _ = self.admit(ids, params.max_new_tokens)
        if self.over_true_pool(len(ids)):
            return self._run_placeholder(ids, params, on_token, client_gone)
        computed = self.leaked_prompt(ids, params, streamed=on_token is not None)
        if computed is ids:
            computed = self.shortened_prompt(ids)
        pages, cached = self.prefill(computed, params)
        try:
            generated = self.generate_from_pages(computed, pages, params, cached, on_token, client_gone)
            # The answer reports the prompt as it was sent, whatever was computed.
            return None if generated is None else replace(generated, prompt_ids=tuple(ids))
        finally:
            prompt_pages = -(-len(computed) // self.page_size)
            if len(pages) > prompt_pages:
                self.release(pages[prompt_pages:], params.rid)
            self.finish_prefill_pages(computed, pages[:prompt_pages], params)

    def _run_placeholder(self, ids: list[int], params: GenParams, on_token: OnToken | None,
                         client_gone: Callable[[], bool] | None) -> Generation | None:
        """Fault pool-in-another-unit: decoded over the placeholder's page table (stale pages
        past its first slot), answered HTTP 200 with the prompt reported in full."""
        pages, span = self.prefill_placeholder(ids, params)
        try:
            generated = self.generate_from_pages(ids[:span], pages, params, 0, on_token, client_gone)
            return None if generated is None else replace(generated, prompt_ids=tuple(ids))
        finally:
            self.release(pages, params.rid)

    def leaked_prompt(self, ids: list[int], params: GenParams, *, streamed: bool) -> list[int]:
        """Faults leak-*: the prompt whose KV the answer is decoded over, its tail taken from
        another tenant's last prompt (on the answer path the fault names only). Runs where answers
        are decoded: the unified engine, or a decode over the KV it received. `ids` itself (the
        same object) when nothing leaks."""
        leak = Fault.LEAK_STREAMED if streamed else Fault.LEAK_NOT_STREAMED
        if not self.faults & {Fault.LEAK_STREAMED, Fault.LEAK_NOT_STREAMED}:
            return ids
        with self._counter_lock:
            other = next((p for salt, p in reversed(self._last_prompts.items()) if salt != params.cache_salt), None)
            self._last_prompts.pop(params.cache_salt, None)
            self._last_prompts[params.cache_salt] = list(ids)
            while len(self._last_prompts) > 4:  # the latest few tenants are enough to leak from
                del self._last_prompts[next(iter(self._last_prompts))]
        if leak in self.faults and other is not None and self.fault_fires():
            tail = min(LEAK_TOKENS, len(other), len(ids) // 2)
            if tail:
                return ids[: len(ids) - tail] + other[len(other) - tail:]
        return ids

    def shortened_prompt(self, ids: list[int]) -> list[int]:
        """Fault shortened-prompt: what is computed of a long prompt (its first half). Runs where
        prompts are computed: the unified engine or a prefill. `ids` when nothing is dropped."""
        if Fault.SHORTENED_PROMPT in self.faults and len(ids) > SHORTEN_FROM and self.fault_fires():
            return ids[: len(ids) // 2]
        return ids


def device_for(choice: str) -> str:
    if choice == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        raise ServeConfigError("--device cuda was asked for but torch sees no CUDA device; use --device cpu or auto")
    return "cpu"
