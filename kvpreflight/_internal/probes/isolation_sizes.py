"""How large each isolation scenario's requests are (the scenarios themselves: probes/scenarios.py).

What a check costs (issue 14): only the boundary and load scenarios need near-limit prompts, and
they ride on requests the capacity checks send anyway. Every other scenario prompt is short
(SCAN_PROMPT_FRACTION of the context, at least SCAN_PROMPT_MIN tokens): a canary on every page
and a freed page reused by the other tenant need no long prompt. The exception is the abandoned
request of cancel-transfer behind a prefill/decode pair, whose transfer must last long enough
for the disconnect and the other tenant's requests to land while it is still writing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvpreflight._internal.probes.prefix_cache import (
    CACHE_PREFIXES,
    cache_prompt_tokens,
    caching_off,
)
from kvpreflight._internal.probes.results import Limits
from kvpreflight.model import EngineSnapshot, Role

SCAN_MAX_TOKENS = 256  # answers long enough to reach past a lost first transfer batch
MIN_SCAN_TOKENS = 16  # an answer shorter than this cannot hold a canary: not a scan (TenantRequest.scanned)
CANCEL_DECODE_MAX_TOKENS = 512
TIMING_AUDIT_CONDITION = "the engine reports no prefix-cache hits (the timing audit)"
MAX_LOAD_REQUESTS = 8
SCAN_PROMPT_FRACTION = 64  # a short scenario prompt: 1/64 of the context...
SCAN_PROMPT_MIN = 256  # ...and at least this: more than one KV transfer batch (8 pages of 16), so a
# transfer lost after its first batch leaves stale pages behind
LOAD_POOL_FRACTION = 0.9  # the load scenario's prompts and answers fill this much of the smallest pool
# cancel-transfer on a unified engine: its client leaves UNIFIED_CANCEL_AFTER_S after sending, so
# the leaver's prefill must outlast that, and the engine's noticing it, for the disconnect to land
# during it. So the leaver is sized from the prompt at the limit, measured: the fewest tokens whose
# prefill lasts LEAVER_PREFILL_OUTLASTS times the wait, at most the longest scanned prompt (sent
# where fewer would not do, if its prefill lasts LEAVER_PREFILL_AT_LEAST times the wait), and only
# where the short prompt's prefill is too short. On unified vLLM on 2 CPU cores (docs/FINDINGS.md)
# leavers prefilled in about 40-51 ms had tokens generated and those of 56-60 ms landed; the prompt
# at the limit of a server's first check ran up to twice as slow as later ones (so a leaver sized
# from it ran faster than predicted). The builtin engine prefills the longest prompt in a few ms,
# where no leaver would land.
LEAVER_PREFILL_OUTLASTS = 10.0
LEAVER_PREFILL_AT_LEAST = 4.0
LONGER_LEAVER_CONDITION = ("the engine prefills the short prompt too fast for a client's disconnect to land during it "
                           "(measured at the limit): cancel-transfer's leaver is sent longer, in place of the short one")


@dataclass(frozen=True)
class IsolationSizes:
    """Every scenario's request sizes, from the limits and the smallest pool (probes/scenarios.py
    declares which request takes which)."""

    gen: int  # tokens generated per scanned answer
    longest: int  # the longest scanned prompt: within the stated limits, with room for the answer
    min_pool: int | None
    over: int  # the over-capacity request
    over_where: str
    transfer_size: int  # cancel-transfer: the abandoned request
    transfer_victim: int  # cancel-transfer: the other tenant's requests after it
    transfer_longer: int | None  # cancel-transfer on a unified engine: the leaver at most, where a short one is too fast
    decode_prompt: int  # cancel-decode
    decode_max_tokens: int
    load_count: int
    load_per: int  # prompt tokens of each load request
    load_max_tokens: int  # its answer: decode pages hold prompt and answer, so both count against the pool
    short: int  # the short scenario prompt (normal twice over, over-capacity's long request, cancel-decode's twice over)
    pair_is_load: bool  # the concurrent-capacity pair fills 80-100% of the smallest pool: it is the load scenario
    cache_prefixes: int  # fresh prefixes of the prefix-cache controls
    cache_tokens: int  # their prompt
    page_size: int | None = None  # the smallest page of the engines that state one
    has_prefill: bool = False  # a prefill engine is among them (the plan's prefill-notices request)

    @classmethod
    def of(cls, limits: Limits, snapshots: Sequence[EngineSnapshot], concurrency: int = 2) -> IsolationSizes:
        ctx = limits.served_context
        gen = max(16, min(SCAN_MAX_TOKENS, ctx // 4))
        longest = max(1, min(limits.max_accepted, ctx - gen - 1))
        pools = [p for s in snapshots if (p := s.pool_tokens()) is not None]
        min_pool = min(pools) if pools else None
        if limits.pool_bound and limits.pool_tokens is not None:
            over = limits.pool_tokens + max(1, (ctx - limits.pool_tokens) // 2)
            over = max(limits.max_accepted + 1, min(over, ctx - gen))
            where = f"over the {limits.pool_tokens:,}-token pool, within the served context"
        else:
            over, where = ctx + 1, "over the served context"
        short = max(1, min(longest, max(SCAN_PROMPT_MIN, ctx // SCAN_PROMPT_FRACTION)))
        longer = None
        if any(s.role is not Role.UNIFIED for s in snapshots):
            size = max(1, min(longest, min_pool // 2)) if min_pool else longest
        else:  # no transfer to race: the disconnect is to land during prefill (leaver_tokens)
            size = short
            longer = longest if longest > short else None
        decode_prompt = max(1, min(short, ctx - CANCEL_DECODE_MAX_TOKENS - 1) // 2)
        per, count, load_gen = longest, 4, gen
        if min_pool:
            # Near the pool, never over it: an honest engine with more KV in flight than its pool
            # holds must preempt or refuse (the builtin engine answered 503 mid-decode), and a
            # refused tenant leaves the scenario unscanned. Each request's share holds its prompt
            # and its answer; the answer takes at most half of it.
            target = int(min_pool * LOAD_POOL_FRACTION)
            count = min(MAX_LOAD_REQUESTS, max(4, -(-target // (longest + gen))))
            share = target // count
            load_gen = max(1, min(gen, share // 2))
            per = max(1, min(longest, share - load_gen))
        pair = max(1, concurrency) * limits.max_accepted  # the concurrent probes: prompt plus answer (capacity_plan)
        off = caching_off(snapshots) is not None
        pages = [s.page_size for s in snapshots if s.page_size]
        return cls(gen=gen, longest=longest, min_pool=min_pool, over=over, over_where=where, transfer_size=size,
                   transfer_longer=longer, transfer_victim=max(1, min(longest, int(size * 0.45))), decode_prompt=decode_prompt,
                   decode_max_tokens=max(gen, min(CANCEL_DECODE_MAX_TOKENS, ctx - decode_prompt - 1)),
                   load_count=count, load_per=per, load_max_tokens=load_gen, short=short,
                   pair_is_load=min_pool is not None and concurrency >= 2 and 0.8 * min_pool <= pair <= min_pool,
                   cache_prefixes=1 if off else CACHE_PREFIXES, cache_tokens=cache_prompt_tokens(longest, ctx, max(pages, default=None)),
                   page_size=min(pages, default=None), has_prefill=any(s.role is Role.PREFILL for s in snapshots))

    def leaver_tokens(self, near_limit_tokens: int, near_limit_s: float, leave_after_s: float) -> tuple[int, str | None]:
        """cancel-transfer's leaver on a unified engine, and why it is not the short prompt: from
        the prompt at the limit (its tokens, its time to the first token), the fewest tokens whose
        prefill outlasts the client's wait before leaving LEAVER_PREFILL_OUTLASTS times, never fewer
        than the short prompt; `transfer_longer` (the longest scanned prompt) at most, sent where
        fewer would not do if its prefill still outlasts the wait LEAVER_PREFILL_AT_LEAST times. An
        engine too fast for that keeps the short prompt: a longer one would cost prefill and show
        nothing more."""
        short, longest = self.transfer_size, self.transfer_longer
        if longest is None or near_limit_tokens <= 0 or near_limit_s <= 0:
            return short, None
        per_token_s = near_limit_s / near_limit_tokens
        need = math.ceil(LEAVER_PREFILL_OUTLASTS * leave_after_s / per_token_s)
        if need <= short:
            return short, None
        measured = f"the prompt at the limit ({near_limit_tokens:,} tokens) had its first token in {near_limit_s * 1000:,.0f} ms"
        wait = f"a disconnect {leave_after_s * 1000:.0f} ms after sending"
        if need > longest and longest * per_token_s < LEAVER_PREFILL_AT_LEAST * leave_after_s:
            return short, (f"the leavers stayed {short:,} tokens: {measured}, so even {longest:,} tokens would be prefilled "
                           f"in about {longest * per_token_s * 1000:,.0f} ms, too fast for {wait} to land during it")
        tokens = min(need, longest)
        return tokens, (f"the leavers were {tokens:,} tokens, not {short:,}: {measured}, so a {short:,}-token prefill (about "
                        f"{short * per_token_s * 1000:,.0f} ms) would end before {wait} could land during it")

    @property
    def normal_tokens(self) -> int:
        return max(1, self.short // 7)

    @property
    def lease_prompt(self) -> int:
        """late-decode's held prompt: a normal prompt, inside one page where the page is known
        (a partly filled page is the first a vLLM prefill hands out again)."""
        if self.page_size is None or self.page_size < 2:
            return self.normal_tokens
        return max(1, min(self.normal_tokens, self.page_size - 1))

    @property
    def normal_answer_tokens(self) -> int:
        """A normal request's answer: twice its prompt (an echoing model repeats all of it, the
        other tenant's pages included, and then some), never more than a scanned answer."""
        return max(MIN_SCAN_TOKENS, min(self.gen, 2 * self.normal_tokens))

    def load_tokens(self) -> int:
        """The KV the load requests hold at once when all are decoding: prompts and answers."""
        return self.load_count * (self.load_per + self.load_max_tokens)
