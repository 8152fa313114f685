"""engine-healthy-after: after the probes every engine is healthy, a small request works, and
used-token gauges are back to idle (no leaked pages) where the engine has them."""

from __future__ import annotations

from kvpreflight.check_ids import CheckId, Scope
from kvpreflight.checks.interface import CheckContext, probe_run
from kvpreflight.model import CheckResult, Status

ID = CheckId.ENGINE_HEALTHY_AFTER
SCOPE = Scope.GROUP
BUSY_STATUSES = (429, 503)  # "retry later": an engine refusing for load, not for what was asked


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    if run.stopped:  # an engine that is down now was up when the check read it: that much is measured
        return [CheckResult(ID, Status.FAIL, f"{s.role.value} engine is not healthy after the probes, which stopped: {run.stopped}",
                            s.url, {"health_ok": False})
                if run.healthy_after.get(s.url) is False else
                CheckResult(ID, Status.INCONCLUSIVE, f"not checked after the probes: {run.stopped}", s.url)
                for s in ctx.snapshots]
    results = []
    small = run.small_request_after
    small_ok = small is not None and small.served and bool(small.completion_tokens)
    # A small request that ran out of time proves the engine slow or still busy, not broken: a slow
    # honest engine is never a fail (a deadline stop or a loaded machine can leave it mid-prefill).
    small_timed_out = small is not None and not small.served and bool(small.timed_out)
    # Refused as busy (429, 503 "retry later"): the probes' own KV may still be held (a request the
    # deadline abandoned keeps running in the engine), so that is not measured as broken either.
    busy_status = small.status if small is not None and not small.served and small.status in BUSY_STATUSES else None
    for snap in ctx.snapshots:
        healthy = run.healthy_after.get(snap.url)
        idle = run.idle_after.get(snap.url)
        ev = {"health_ok": healthy, "idle": idle, "small_request_ok": small_ok}
        if not healthy:
            results.append(CheckResult(ID, Status.FAIL, f"{snap.role.value} engine is not healthy after the probes", snap.url, ev))
        elif small_timed_out:
            results.append(CheckResult(ID, Status.INCONCLUSIVE, "a small request through the entry timed out after the probes "
                                       "(the engine is healthy; slow or still busy is not measured as broken)", snap.url, ev))
        elif busy_status is not None:
            results.append(CheckResult(ID, Status.INCONCLUSIVE, f"a small request through the entry was refused as busy (HTTP "
                                       f"{busy_status}) after the probes (the engine is healthy; its KV may "
                                       "still hold the probes' own requests: busy is not measured as broken)", snap.url, ev))
        elif not small_ok:
            results.append(CheckResult(ID, Status.FAIL, "a small request through the entry failed after the probes", snap.url, ev))
        elif idle is False:
            results.append(CheckResult(ID, Status.FAIL, f"{snap.role.value} engine still holds KV tokens 10 s after the probes ended (leaked pages?)", snap.url, ev))
        elif idle is None:
            results.append(CheckResult(ID, Status.PASS, f"{snap.role.value} engine healthy and serving; it exposes no used-token gauge to confirm idle", snap.url, ev))
        else:
            results.append(CheckResult(ID, Status.PASS, f"{snap.role.value} engine healthy, serving, and back to idle", snap.url, ev))
    return results
