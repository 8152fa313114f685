"""How many fresh tenant canaries an engine (or a router in front of engines) echoes: the
positive control the isolation probes rest on, counted on its own (issue 15: at least 99 of 100)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from kvpreflight._internal.engines import HttpClient, open_adapter
from kvpreflight._internal.probes.markers import new_marker


def echoed_canaries(url: str, count: int = 100, *, engine_url: str | None = None, concurrency: int = 1) -> int:
    """How many of `count` fresh tenant canaries `url` repeats, sent as the isolation probes send
    them (the canary and a space back to back, from the engine's tokenizer) at prompt lengths that
    end at every phase of the canary. `engine_url`: an engine behind `url` when `url` is a router
    (which says neither what engine it fronts nor tokenizes). `concurrency` canaries at a time: an
    engine batches them, so a pair's per-request transfer is not paid one request after another."""
    client = HttpClient()
    try:
        engine = open_adapter(engine_url or url, client)
        engine = type(engine)(engine.url, client, model=engine.snapshot().model)
        entry = type(engine)(url, client, model=engine.model)

        # Tokenized one at a time first: 25 threads at the engine's /tokenize once met "Connection
        # reset by peer" (a keep-alive connection the server was closing), which proved nothing.
        prompts = []
        for i in range(count):
            canary = new_marker(f"TENANT{'AB'[i % 2]}")
            # 100 to 793 tokens whatever the count: a smaller sample still reaches the long prompts
            prompts.append((canary, engine.token_ids(1000, f"{canary} ")[:100 + (693 * i) // max(count - 1, 1)]))

        def echoed(prompt: tuple[str, list[int]]) -> bool:
            canary, ids = prompt
            answer = entry.complete(ids, max_tokens=80, stream=False, timeout_s=120)
            if not answer.served:  # why, on the test's stderr: a timeout is not a model that does not echo
                why = "timed out" if answer.timed_out else answer.transport_error or f"HTTP {answer.status}: {answer.error_message}"
                print(f"canary of {len(ids)} tokens not served: {why}", file=sys.stderr)
            return answer.served and canary in answer.text

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return sum(pool.map(echoed, prompts))
    finally:
        client.close()
