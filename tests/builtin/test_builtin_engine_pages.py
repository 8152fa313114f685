"""The builtin engine's page accounting in process, without a server: requests that outgrow the
pool together are all served, each with its own KV."""

from __future__ import annotations

import threading
import time

from kvpreflight._internal.builtin_engine import tokenizer
from kvpreflight._internal.builtin_engine.config import EngineConfig
from kvpreflight._internal.builtin_engine.core import Engine
from kvpreflight._internal.builtin_engine.protocol import GenParams
from kvpreflight.model import ProcessRole

PAGE = 16


def test_requests_that_outgrow_the_pool_together_are_all_served_with_their_own_kv():
    # Requests that each hold their pages while waiting for one more wait on each other until one
    # is refused (a request decoded for a client that had left, beside two others, did this to
    # the honest builtin pair under load: docs/FINDINGS.md). Here three requests hold 6 of 8
    # pages and each needs 3 more: none can finish unless a request that cannot grow gives its
    # pages back (SGLang retracts it) and gets its KV back when it resumes.
    engine = Engine(EngineConfig(role=ProcessRole.UNIFIED, host="127.0.0.1", port=0, context_length=256),
                    pool_tokens=8 * PAGE, device="cpu")
    prompts = [tokenizer.encode(f"tenant {name} canary {name * 40}")[: 2 * PAGE] for name in "xyz"]
    assert all(len(p) == 2 * PAGE for p in prompts)
    answers: dict[int, object] = {}
    held = [engine.prefill(p, GenParams(rid=f"r{i}"))[0] for i, p in enumerate(prompts)]
    start = threading.Barrier(3)

    def decode(i: int) -> None:
        start.wait()
        params = GenParams(max_new_tokens=3 * PAGE, ignore_eos=True, rid=f"r{i}")
        try:
            answers[i] = engine.generate_from_pages(prompts[i], held[i], params, 0)
        finally:
            engine.release(held[i], f"r{i}")

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(3)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - began
    for i, prompt in enumerate(prompts):
        gen = answers[i]
        # The copy model echoes what its KV holds: its own prompt twice over, or another's text.
        assert gen.finish_reason == {"type": "length", "length": 3 * PAGE}, (i, gen.finish_reason)
        assert list(gen.output_ids) == (prompt * 2)[: 3 * PAGE], i
    assert engine.counters.retracted >= 1
    assert engine.pool.free_pages() == 8  # every page back, none freed twice
    assert took < 10, f"the requests waited on each other for {took:.0f} s"
