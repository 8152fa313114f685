"""engine-healthy-after: after the probes every engine is healthy, a small request works, and
used-token gauges are back to idle (no leaked pages) where the engine has them.

Judged after the check's last request: where the isolation probes ran (after the capacity probes,
and the ones that can wedge an engine: disconnects, load near the pool), from what was read after
them. An engine that stopped answering at any point of the run is not healthy after it, whatever
its /health said later (a wedged engine can answer /health 200 and schedule nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight.model import CheckResult, Completion, Status

ID = CheckId.ENGINE_HEALTHY_AFTER
SCOPE = Scope.GROUP
BUSY_STATUSES = (429, 503)  # "retry later": an engine refusing for load, not for what was asked
WEDGED_FIX = ("restart it, and read its log around that request: an engine that stops answering under "
              "kvpreflight's disconnects or load near its pool will do so under real clients")


@dataclass(frozen=True, kw_only=True)
class After:
    """What was read after the last probe run: the isolation probes' where they ran, else the capacity probes'."""

    healthy: Mapping[str, bool]
    idle: Mapping[str, bool | None]
    small: Completion | None
    stopped: str | None
    not_answering: str | None
    stuck_during: Mapping[str, tuple[str, ...]]  # url -> scenarios after which its used-token gauge stayed up


def _after(ctx: CheckContext, stopped: str | None, not_answering: str | None) -> After | None:
    run = ctx.probes
    if run is None:
        return None
    iso = ctx.isolation if ctx.isolation is not None and ctx.isolation.not_run is None else None
    stuck: dict[str, tuple[str, ...]] = {}
    for s in iso.scenarios if iso else ():
        for url, idle in s.idle_after.items():
            if idle is False:
                stuck[url] = (*stuck.get(url, ()), s.name)
    if iso is None:
        return After(healthy=run.healthy_after, idle=run.idle_after, small=run.small_request_after, stopped=stopped,
                     not_answering=not_answering, stuck_during=stuck)
    return After(healthy=iso.healthy_after, idle=iso.idle_after,
                 small=iso.small_request_after if iso.small_request_after is not None else run.small_request_after,
                 stopped=iso.stopped or stopped, not_answering=iso.not_answering or not_answering, stuck_during=stuck)


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    after = _after(ctx, run.stopped, run.not_answering)
    assert after is not None  # probe_run returned a run
    if after.not_answering:
        return [_wedged(ctx, after, s.url, s.role.value) for s in ctx.snapshots]
    if after.stopped:  # an engine that is down now was up when the check read it: that much is measured
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"{s.role.value} engine is not healthy after the probes, which stopped: {after.stopped}",
                            endpoint=s.url, evidence={"health_ok": False})
                if after.healthy.get(s.url) is False else
                CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"not checked after the probes: {after.stopped}", endpoint=s.url)
                for s in ctx.snapshots]
    results = []
    small = after.small
    small_ok = small is not None and small.served and bool(small.completion_tokens)
    # A small request that ran out of time proves the engine slow or still busy, not broken: a slow
    # honest engine is never a fail (a deadline stop or a loaded machine can leave it mid-prefill).
    small_timed_out = small is not None and not small.served and bool(small.timed_out)
    # Refused as busy (429, 503 "retry later"): the probes' own KV may still be held (a request the
    # deadline abandoned keeps running in the engine), so that is not measured as broken either.
    busy_status = small.status if small is not None and not small.served and small.status in BUSY_STATUSES else None
    for snap in ctx.snapshots:
        healthy = after.healthy.get(snap.url)
        idle = after.idle.get(snap.url)
        ev: dict[str, Any] = {"health_ok": healthy, "idle": idle, "small_request_ok": small_ok}
        if stuck := after.stuck_during.get(snap.url):
            ev["stuck_after_scenarios"] = list(stuck)
        if not healthy:
            results.append(CheckResult(id=ID, status=Status.FAIL, message=f"{snap.role.value} engine is not healthy after the probes",
                                       endpoint=snap.url, evidence=ev))
        elif small_timed_out:
            results.append(CheckResult(id=ID, status=Status.INCONCLUSIVE,
                                       message="a small request through the entry timed out after the probes "
                                       "(the engine is healthy; slow or still busy is not measured as broken)",
                                       endpoint=snap.url, evidence=ev))
        elif busy_status is not None:
            results.append(CheckResult(id=ID, status=Status.INCONCLUSIVE,
                                       message=f"a small request through the entry was refused as busy (HTTP "
                                       f"{busy_status}) after the probes (the engine is healthy; its KV may "
                                       "still hold the probes' own requests: busy is not measured as broken)",
                                       endpoint=snap.url, evidence=ev))
        elif not small_ok:
            results.append(CheckResult(id=ID, status=Status.FAIL, message="a small request through the entry failed after the probes",
                                       endpoint=snap.url, evidence=ev))
        elif idle is False:
            results.append(CheckResult(id=ID, status=Status.FAIL,
                                       message=f"{snap.role.value} engine still holds KV tokens 10 s after the probes ended "
                                       "(leaked pages?)",
                                       endpoint=snap.url, evidence=ev))
        elif idle is None:
            results.append(CheckResult(id=ID, status=Status.PASS,
                                       message=f"{snap.role.value} engine healthy and serving; "
                                       "it exposes no used-token gauge to confirm idle",
                                       endpoint=snap.url, evidence=ev))
        else:
            results.append(CheckResult(id=ID, status=Status.PASS, message=f"{snap.role.value} engine healthy, serving, and back to idle",
                                       endpoint=snap.url, evidence=ev))
    return results


def _wedged(ctx: CheckContext, after: After, url: str, role: str) -> CheckResult:
    """The deployment stopped answering during the probes: not healthy after them, whatever /health says now."""
    health = after.healthy.get(url)
    now = {True: "its /health answers OK now, ", False: "its /health fails now, "}.get(health, "") if health is not None else ""
    stuck = after.stuck_during.get(url, ())
    held = f"its used-token gauge stayed up after the {', '.join(stuck)} scenario(s), " if stuck else ""
    ev: dict[str, Any] = {"health_ok": health, "idle": after.idle.get(url), "stopped_answering": after.not_answering}
    if stuck:
        ev["stuck_after_scenarios"] = list(stuck)
    return CheckResult(id=ID, status=Status.FAIL,
                       message=f"{role} engine is not healthy after the probes: the deployment stopped answering "
                       f"during them ({after.not_answering}); {now}{held}but an engine that stopped answering once is not "
                       f"healthy: {WEDGED_FIX}", endpoint=url, evidence=ev)
