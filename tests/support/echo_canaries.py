"""How many fresh tenant canaries an engine (or a router in front of engines) echoes: the
positive control the isolation probes rest on, counted on its own (issue 15: at least 99 of 100)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from kvpreflight.engines import HttpClient, open_adapter
from kvpreflight.probes.markers import new_marker


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

        def echoed(i: int) -> bool:
            canary = new_marker(f"TENANT{'AB'[i % 2]}")
            ids = engine.token_ids(1000, f"{canary} ")
            answer = entry.complete(ids[:100 + 7 * i], max_tokens=80, stream=False, timeout_s=120)
            return answer.served and canary in answer.text

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return sum(pool.map(echoed, range(count)))
    finally:
        client.close()
