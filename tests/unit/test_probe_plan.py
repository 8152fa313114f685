"""`check --plan` and --max-context-equivalents count what will be sent; the timing audit, sent only
where the engine reports no cache hits, is said as the conditional part and judged apart."""

from __future__ import annotations

import pytest

from kvpreflight._internal.probes.budget import PlannedRequest
from kvpreflight._internal.probes.results import Expect, Limits
from kvpreflight._internal.request_plan import GroupPlan, GroupPreview, PlanTooCostly, render, to_dict

LIMITS = Limits(served_context=1000, pool_tokens=4000, max_accepted=993)
ALWAYS = (PlannedRequest("boundary-accept", 993, 1, Expect.ACCEPT), PlannedRequest("over-context", 1001, 96, Expect.REJECT))
AUDIT = tuple(PlannedRequest("prefix-cache-timing", 500, 1, Expect.ACCEPT, only_if="the engine reports no prefix-cache hits")
              for _ in range(6))
PLAN = GroupPlan(entry="http://e", engines=("http://e",), limits=LIMITS, requests=ALWAYS + AUDIT)


def test_the_counts_are_what_will_be_sent_calibration_included_and_the_audit_apart():
    assert PLAN.request_count == 3 + 2  # warm-up and two calibration requests, then the probes
    assert PLAN.submitted_tokens == 8 + 8 + 62 + 993 + 1001
    assert (PLAN.conditional_count, PLAN.conditional_tokens) == (6, 3000)
    text = render([GroupPreview(plan=PLAN)])
    assert "5 requests (3 of them calibration); 2,072 prompt tokens submitted = 2.1 context-equivalents" in text
    assert "up to 6 more requests (3,000 prompt tokens = 3.0 context-equivalents), only if the engine reports no prefix-cache hits" in text
    (group,) = to_dict([GroupPreview(plan=PLAN)])["plan"]
    assert (group["requests_sent"], group["conditional_requests"]) == (5, 6)


def test_max_context_equivalents_judges_what_will_be_sent_and_names_the_conditional_part():
    PLAN.refuse_above(2.5)  # 2.1 sent; the audit's 3.0 more would only come where cache hits are not reported
    with pytest.raises(PlanTooCostly) as info:
        PLAN.refuse_above(2.0)
    assert "2,072 prompt tokens = 2.1 context-equivalents; up to 6 more requests" in str(info.value)
    assert "above --max-context-equivalents 2; nothing was sent" in str(info.value)


def test_at_a_1m_context_the_calibration_prefill_is_long_enough_to_be_measured_and_costs_under_2_percent():
    """The short calibration prompt is 1/16 of the longest accepted prompt up to 16,384 tokens. At a
    1M context 1,024 tokens (the old cap) prefill in milliseconds on a GPU, within a P/D pair's
    per-request spread, so no speed was trusted and no answer's speed judged; 16,384 are 1.6% of
    one near-context prompt."""
    limits = Limits(served_context=1_048_576, pool_tokens=2_000_000, max_accepted=1_048_569)
    plan = GroupPlan(entry="http://e", engines=("http://e",), limits=limits,
                     requests=(PlannedRequest("boundary-accept", 1_048_569, 1, Expect.ACCEPT),))
    assert plan.submitted_tokens == 8 + 8 + 16_384 + 1_048_569
    assert 16_384 / 1_048_569 < 0.016
    small = GroupPlan(entry="http://e", engines=("http://e",), limits=LIMITS, requests=ALWAYS)
    assert small.submitted_tokens == 8 + 8 + 62 + 993 + 1001  # 1/16 of a small context, as before
