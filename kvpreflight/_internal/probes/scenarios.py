"""The isolation scenarios, each declared once as data: its requests (tenant, size, answer,
streamed or not, where the client leaves, which go at once) in the order they are sent. The
prober (probes/isolation.py) sends exactly these; `check --plan` and the budget estimate count
exactly these (`isolation_sizes`). A new scenario or a new request mode is one entry here.

The incident's paths (issue 4), interleaved so that one tenant's KV pages are freed right before
the other tenant's requests reuse them:
  normal           short prompts, A B fourteen times over (the last four pairs at once), read to the
                   end, not streamed and streamed by turns: every answer follows or runs beside the
                   other tenant's request
  boundary         the longest prompt the limits accept: the capacity probes' near-limit requests
                   (prompt-integrity's, then the concurrent pair) carry the canaries of A, then A and B
  over-capacity    A short, then B over the pool/context (the incident path), and mirrored
  cancel-transfer  (churn) A disconnects while its KV is being written, then B's requests take
                   the freed pages; mirrored
  cancel-decode    (churn) A disconnects after its first streamed token, then B (not streamed);
                   mirrored (A streamed): both answer paths read right after a disconnect
  load             (churn) A and B at once, near the smallest pool: the concurrent pair where its
                   KV fills 80-100% of the smallest pool, else requests of its own
  late-decode      (churn, issue 27) behind a prefill/decode pair whose legs kvpreflight can send
                   itself (vLLM NIXL: the adapter's SplitLegs): A's prefill leg straight to the
                   prefill, its decode leg held past the prefill's KV lease while B's requests take
                   the pages the lease freed, then sent to the decode with the prefill's handoff;
                   a B request follows, since vLLM's prefill counts a late read only when it next
                   steps. At most LATE_DECODE_MAX_WAIT_S of waiting: a longer lease is not probed.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace

from kvpreflight._internal.probes.budget import TINY_TOKENS, PlannedRequest
from kvpreflight._internal.probes.capacity import HEALTH_MAX_TOKENS, HEALTH_PROMPT
from kvpreflight._internal.probes.isolation_sizes import LONGER_LEAVER_CONDITION, TIMING_AUDIT_CONDITION, IsolationSizes
from kvpreflight._internal.probes.prefix_cache import DEFAULT_TIMING_SAMPLES, ORDER, TIMING_REQUESTS_PER_SAMPLE, timing_prompt_tokens
from kvpreflight._internal.probes.results import Expect, ProbeName, ScenarioName, Tenant

CANCEL_PROPAGATION_S = 0.06  # router and decode notice a closed socket within ~40 ms
# late-decode waits the lease in force plus this margin (vLLM reaps an expired lease at the
# prefill's next step, which B's first request brings), never more than the maximum wait: a fixed
# bound, not a multiple of the heartbeat interval (a sixth of the lease, so any multiple grows with
# the lease it is meant to bound). 20 s is what one scenario of a check may cost on a 2-core host
# (the disconnect scenarios take 10-30 s each there); it probes the short leases that fail
# (seconds, what a decode's stall outlives) and leaves vLLM's 30 s default and the longer leases
# production sets (aws-do-eks: 300 s) not probed, said in the evidence.
LATE_DECODE_MARGIN_S = 2.0
LATE_DECODE_MAX_WAIT_S = 20.0
LATE_DECODE_CONDITION = (f"the prefill is vLLM NIXL with a KV lease of at most {LATE_DECODE_MAX_WAIT_S - LATE_DECODE_MARGIN_S:g} s "
                         f"(late-decode waits the lease + {LATE_DECODE_MARGIN_S:g} s, {LATE_DECODE_MAX_WAIT_S:g} s at most)")
NOTICES_CONDITION = ("a prefill reads its decodes' transfer notifications only when it steps (vLLM NIXL): "
                     "one tiny request straight to it, so a late read on the last request shows")
A, B = Tenant.A, Tenant.B
NOTICES_REQUEST = "prefill notices"
# The normal scenario's requests, (tenant, streamed): each tenant's answers are read to the end
# both streamed and not, since streaming is its own code path in every engine, router and gateway,
# and every answer follows the other tenant's request. Twenty-eight short requests: a leak that
# fires on a fraction p of requests escapes a run with probability (1 - p) ** chances, and the
# other scenarios' long prompts give few chances (an echoing model repeats a long prompt's head,
# where no page of another request lands). At p = 0.3 six gave a builtin engine's streamed-only
# leak 5 chances (16 of 20 runs caught it), sixteen 11 (59 of 60), twenty-eight 18 with
# cancel-decode's streamed follower (benchmarks/RESULTS.md); twenty-eight of a seventh of the
# short prompt cost the same prefill as sixteen of a quarter.
NORMAL_PAIRS = 14
NORMAL_ORDER = tuple((tenant, pair % 2 == 1) for pair in range(NORMAL_PAIRS) for tenant in (A, B))
# The last pairs go at once (A beside B, one pair not streamed, the next streamed): batching is its
# own path in every engine, and these are the only concurrent answers short enough to be read whole
# (the other concurrent requests, the capacity pair, load and cancel-transfer's followers, are long
# prompts whose answers an echoing model fills from their head). Same requests, same prefill.
NORMAL_AT_ONCE_PAIRS = 4


class Leave(enum.Enum):
    """Where a request's client goes away on purpose."""

    DURING_TRANSFER = "while its KV is being written"
    AFTER_FIRST_TOKEN = "after its first streamed token"

    @property
    def answer_tokens(self) -> int:
        """What the engine generates for it before the client leaves (what the estimate counts)."""
        return 1 if self is Leave.DURING_TRANSFER else 2


class Leg(enum.Enum):
    """One leg of a prefill/decode request sent by kvpreflight itself, as the deployment's router
    sends it (the engine's adapter knows how: engines/interface.py SplitLegs)."""

    PREFILL = "the prefill leg alone: the prefill computes the prompt and holds its KV for a decode"
    DECODE = "the decode leg, with the prefill's handoff, after the prefill's KV lease ran out"


class Evidence(enum.Enum):
    """How a run of the scenario is shown to have happened as intended (probes/isolation.py)."""

    SERVED = "an answered request"
    LEFT_MID_TRANSFER = "a deferred release, the crossing itself, or the engine's abort count"
    LEFT_AFTER_TOKEN = "a streamed token before each disconnect"
    POOL_FILLED = "the requests' KV held at once against the smallest pool"
    READ_AFTER_LEASE = "the decode leg answered after the prefill's KV lease ran out"


@dataclass(frozen=True)
class ScenarioRequest:
    tenant: Tenant
    name: str  # as the report names it: normal-a1, cancel-transfer-b-left, ...
    prompt_tokens: int
    max_tokens: int
    expect: Expect = Expect.ACCEPT
    stream: bool = False
    leave: Leave | None = None  # None: read to the end
    leg: Leg | None = None  # None: the whole request through the entry
    # A prompt no prefix cache holds (the tenant's canaries from an offset of their own): all its
    # KV is written into newly handed-out pages, from position 0.
    fresh_prefix: bool = False
    # cancel-transfer's leaver on a unified engine: sent at up to this many tokens, in place of
    # prompt_tokens, where the engine prefills that too fast (IsolationSizes.leaver_tokens)
    longer: int | None = None

    def planned(self, scenario: ScenarioName, only_if: str | None = None) -> PlannedRequest:
        answer = self.max_tokens if self.leave is None else self.leave.answer_tokens
        return PlannedRequest(scenario, self.prompt_tokens, answer, self.expect, only_if=only_if)

    def planned_longer(self, scenario: ScenarioName) -> PlannedRequest | None:
        """The longer leaver, conditional (the estimate allows for it; the counts, which hold the
        short one, do not)."""
        if self.longer is None:
            return None
        return replace(self.planned(scenario), prompt_tokens=self.longer, only_if=LONGER_LEAVER_CONDITION)


@dataclass(frozen=True)
class Step:
    """Requests sent at once (each one of `len(requests)` together), then a pause or a wait for
    the engines' pages to come back before the next step."""

    requests: tuple[ScenarioRequest, ...]
    pause_s: float = 0.0
    settle: bool = False  # wait for idle pools afterwards
    outwait_lease: bool = False  # then wait out the prefill's KV lease (late-decode, LATE_DECODE_MARGIN_S)


@dataclass(frozen=True)
class ScenarioSpec:
    name: ScenarioName
    purpose: str
    steps: tuple[Step, ...]
    churn: bool = False  # disruptive to a live deployment: sent only where allowed
    evidence: Evidence = Evidence.SERVED
    shown: str = ""  # what an answered run shows (Evidence.SERVED)
    # The capacity probes that, sent as the tenants, are this scenario: then its own steps are
    # sent only where those did not serve it (and are not planned).
    carried_by: tuple[ProbeName, ...] = ()
    # Sent only where this holds (said in --plan; the estimate allows for it, the counts do not).
    only_if: str | None = None

    def planned(self) -> list[PlannedRequest]:
        """Its requests for the estimate: each step's requests of one size as one entry, counted
        as sent at once."""
        out: list[PlannedRequest] = []
        for step in self.steps:
            sizes = Counter(r.planned(self.name, self.only_if) for r in step.requests)
            out += [PlannedRequest(p.name, p.prompt_tokens, p.max_tokens, p.expect, n, p.only_if) for p, n in sizes.items()]
            out += [p for r in step.requests if (p := r.planned_longer(self.name)) is not None]
        return out


def one(*requests: ScenarioRequest, pause_s: float = 0.0, settle: bool = False, outwait_lease: bool = False) -> Step:
    return Step(requests, pause_s=pause_s, settle=settle, outwait_lease=outwait_lease)


def declared(sizes: IsolationSizes) -> tuple[ScenarioSpec, ...]:
    """Every scenario, in the order the prober runs them, sized from `sizes`."""
    gen, short, longest = sizes.gen, sizes.short, sizes.longest
    normal: list[Step] = []
    for pair in range(NORMAL_PAIRS):
        at_once = pair >= NORMAL_PAIRS - NORMAL_AT_ONCE_PAIRS
        both = tuple(ScenarioRequest(t, f"normal-{'at-once-' if at_once else ''}{t.value}{pair + 1}", sizes.normal_tokens,
                                     sizes.normal_answer_tokens, stream=stream)
                     for t, stream in NORMAL_ORDER[2 * pair:2 * pair + 2])
        normal += [one(*both)] if at_once else [one(r) for r in both]
    boundary = tuple(one(ScenarioRequest(t, f"boundary-{t.value}{i + 1}", longest, gen)) for i, t in enumerate((A, B, B, A)))
    over: list[Step] = []
    for streamed, first in ((False, A), (True, B)):  # mirrored in the other mode: each path refuses, streamed or not
        second = first.other
        over += [one(ScenarioRequest(first, f"over-capacity-{first.value}-long", short, gen, stream=streamed)),
                 one(ScenarioRequest(second, f"over-capacity-{second.value}-over", sizes.over, gen, Expect.REJECT,
                                     stream=streamed))]
    transfer: list[Step] = []
    decode: list[Step] = []
    for leaver in (A, B):
        other = leaver.other
        # A disconnect during the transfer needs no stream, and a router may not pass a streamed
        # client's disconnect on (smg 1.13.0 does not): only the after-first-token case streams.
        transfer += [one(ScenarioRequest(leaver, f"cancel-transfer-{leaver.value}-left", sizes.transfer_size, gen,
                                         leave=Leave.DURING_TRANSFER, longer=sizes.transfer_longer), pause_s=CANCEL_PROPAGATION_S),
                     one(*(ScenarioRequest(other, f"cancel-transfer-{other.value}{i + 1}", sizes.transfer_victim, gen,
                                           stream=i == 1) for i in range(2)), settle=True)]
        decode += [one(ScenarioRequest(leaver, f"cancel-decode-{leaver.value}-left", sizes.decode_prompt,
                                       sizes.decode_max_tokens, stream=True, leave=Leave.AFTER_FIRST_TOKEN)),
                   one(ScenarioRequest(other, f"cancel-decode-{other.value}", sizes.decode_prompt, gen, stream=leaver is B))]
    order = [(A, B)[i % 2] for i in range(sizes.load_count)]
    load = one(*(ScenarioRequest(t, f"load-{t.value}{i // 2 + 1}", sizes.load_per, sizes.load_max_tokens,
                                 stream=(i // 2) % 2 == 1) for i, t in enumerate(order)))
    # A's prompt fits in one partly filled page: vLLM frees a page without a prefix-cache hash
    # first-in-line for reuse (v1/core/block_pool.py free_blocks, LIFO), so B's next prompt is
    # written into it. B's prompts are fresh: a cached prefix would leave its first page unwritten
    # and put B's KV in A's page at other positions (seen on the real pair: A's answer then echoed
    # neither canary). The expiry is reaped during the step that schedules B's first request, so
    # the second is the one that gets A's page.
    answer = sizes.normal_answer_tokens
    late = (one(ScenarioRequest(A, "late-decode-a-prefill", sizes.lease_prompt, 1, leg=Leg.PREFILL), outwait_lease=True),
            one(ScenarioRequest(B, "late-decode-b1", short, answer, fresh_prefix=True)),
            one(ScenarioRequest(B, "late-decode-b2", short, answer, fresh_prefix=True)),
            one(ScenarioRequest(A, "late-decode-a", sizes.lease_prompt, gen, leg=Leg.DECODE)),
            one(ScenarioRequest(B, "late-decode-b3", sizes.normal_tokens, answer, fresh_prefix=True)))
    return (
        ScenarioSpec(ScenarioName.NORMAL, f"short prompts of both tenants, interleaved (A B, {NORMAL_PAIRS} times, the last "
                     f"{NORMAL_AT_ONCE_PAIRS} pairs at once), not streamed and streamed by turns: each reuses pages the other just freed",
                     tuple(normal),
                     shown="both tenants ran and were scanned, streamed and not"),
        ScenarioSpec(ScenarioName.BOUNDARY, "the longest accepted prompt, interleaved (A B B A)", boundary,
                     shown="both tenants ran at the longest accepted prompt",
                     carried_by=(ProbeName.BOUNDARY_ACCEPT, ProbeName.CONCURRENT)),
        ScenarioSpec(ScenarioName.OVER_CAPACITY, "a short request of one tenant, then an over-capacity request of the "
                     "other (the incident path), and mirrored", tuple(over),
                     shown=f"refusal path exercised right after the other tenant's pages were freed ({sizes.over_where})"),
        ScenarioSpec(ScenarioName.CANCEL_TRANSFER, "one tenant disconnects while its KV is being written; the other "
                     "tenant's requests take the freed pages", tuple(transfer), churn=True,
                     evidence=Evidence.LEFT_MID_TRANSFER),
        ScenarioSpec(ScenarioName.CANCEL_DECODE, "one tenant disconnects after its first streamed token; the other "
                     "tenant follows at once", tuple(decode), churn=True, evidence=Evidence.LEFT_AFTER_TOKEN),
        ScenarioSpec(ScenarioName.LOAD, "both tenants at once, near the smallest KV pool", (load,), churn=True,
                     evidence=Evidence.POOL_FILLED, carried_by=(ProbeName.CONCURRENT,) if sizes.pair_is_load else ()),
        ScenarioSpec(ScenarioName.LATE_DECODE, "one tenant's prefill leg straight to the prefill, its decode leg held past "
                     "the prefill's KV lease while the other tenant's requests take the freed pages, then sent to the decode",
                     late, churn=True, evidence=Evidence.READ_AFTER_LEASE, only_if=LATE_DECODE_CONDITION),
    )


def isolation_sizes(sizes: IsolationSizes, *, churn: bool, timing_samples: int = DEFAULT_TIMING_SAMPLES,
                   scenarios: tuple[ScenarioSpec, ...] | None = None, only: Collection[str] = ()) -> list[PlannedRequest]:
    """What the isolation probes send, for `--plan` and the estimate: the declared scenarios (a
    scenario the capacity probes carry sends nothing of its own; churn only where allowed), then
    the prefix-cache controls. The timing audit is listed with its condition (it runs only where
    cache counters are silent): the estimate (and the default deadline) allow for it, the counts
    of what will be sent do not. `only`: the scenarios --scenario selects (empty: all)."""
    out: list[PlannedRequest] = []
    for spec in declared(sizes) if scenarios is None else scenarios:
        if (spec.churn and not churn) or spec.carried_by or (only and spec.name not in only):
            continue
        out += spec.planned()
    accept = Expect.ACCEPT
    out += [PlannedRequest("prefix-cache", sizes.cache_tokens, 1, accept) for _ in range(1 + sizes.cache_prefixes * len(ORDER))]
    timing = timing_prompt_tokens(sizes.longest)
    out += [PlannedRequest("prefix-cache-timing", timing, 1, accept, only_if=TIMING_AUDIT_CONDITION)
            for _ in range(TIMING_REQUESTS_PER_SAMPLE * timing_samples)]
    if sizes.has_prefill:
        out.append(PlannedRequest(NOTICES_REQUEST, TINY_TOKENS, 1, accept, only_if=NOTICES_CONDITION))
    out.append(PlannedRequest(HEALTH_AFTER_REQUEST, HEALTH_PROMPT, HEALTH_MAX_TOKENS, accept))
    return out


HEALTH_AFTER_REQUEST = "health-after"  # the small request after the last isolation probe
