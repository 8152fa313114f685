"""engine-healthy-after on the small request sent after the probes: served is healthy; refused as
busy (the probes' own KV may still be held: a request the deadline abandoned keeps running in the
engine) or timed out is not measured; refused for anything else is a fail."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvpreflight.checks import CheckContext
from kvpreflight.model import Status
from tests.unit.test_checks import T, check, ok, refused, run, snap


@pytest.mark.parametrize(("small", "status", "said"), [
    (ok(16), Status.PASS, "healthy, serving"),
    (refused(16, "The KV pool has no free pages for this request; retry later.", kind=None, status=503), Status.INCONCLUSIVE,
     "refused as busy (HTTP 503)"),
    (refused(16, "Too Many Requests", kind=None, status=429), Status.INCONCLUSIVE, "refused as busy (HTTP 429)"),
    (refused(16, "Internal Server Error", kind=None, status=500), Status.FAIL, "failed after the probes"),
    (refused(16, "bad request", kind=None, status=400), Status.FAIL, "failed after the probes"),
])
def test_the_small_request_after_the_probes(small, status, said):
    probes = replace(run(), small_request_after=small)
    (r,) = check("engine-healthy-after", CheckContext((snap(),), T, probes=probes))
    assert r.status is status and said in r.message, r.message


def test_a_small_request_the_deadline_ran_out_under_is_no_verdict():
    """Seen in CI: the concurrent probe ended just before --deadline, the small request went out
    with what was left and failed; that is the deadline's doing, not the engine's (exit 3, not 1)."""
    from kvpreflight.model import Completion
    from kvpreflight.probes.budget import Budget

    now = [0.0]
    budget = Budget(timeout_s=30, fallback_tokens_per_second=1000, deadline_s=6, clock=lambda: now[0])
    failed = Completion(sent_tokens=16, max_tokens=1, streamed=False, status=None, elapsed_s=0.0,
                        transport_error="timeout must be above 0")
    now[0] = 5.0
    assert not budget.ended_by_deadline(failed) and budget.stopped is None  # a second left: the engine's answer
    now[0] = 6.0
    assert not budget.ended_by_deadline(ok(16))  # served is served
    assert budget.ended_by_deadline(failed) and budget.stopped == "stopped at --deadline of 6 s, during reading the engines"
