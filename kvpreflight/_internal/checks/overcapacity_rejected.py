"""overcapacity-rejected: real over-pool and over-context requests get a hard, length-specific
rejection with zero generated tokens, before any KV transfer; a shorter twin is accepted."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.counts import DEFAULT_PAGE, other_traffic
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight._internal.checks.probe_common import (
    accepted,
    answered_elsewhere,
    decode_urls,
    probe_evidence,
    refusal_verdict,
    unreached,
    worst_status,
)
from kvpreflight._internal.probes.results import OVER_CAPACITY_PROBES, ProbeName, ProbeResult, ProbeRun, transfer_moved
from kvpreflight.model import CheckResult, CounterDeltas, Status

ID = CheckId.OVERCAPACITY_REJECTED
SCOPE = Scope.GROUP
# What to do about a failure, said with it (the report reads failures first).
FIX = ("fix: the engine must refuse a prompt over its pool or context before prefill: turn off auto-truncation "
       "(SGLang --allow-auto-truncate), serve a --context-length the smallest pool holds, or upgrade the engine "
       "(`kvpreflight advisories list` names the known bugs)")
def traffic_beside_ours(run: ProbeRun, ctx: CheckContext) -> list[str]:
    """What any probe window's counters moved beyond that window's own requests (a concurrent
    window holds all of its requests): other clients were on the deployment during the check."""
    pages = {s.url: s.page_size or DEFAULT_PAGE for s in ctx.snapshots}
    # One window per group of probes sent together (the concurrent ones share theirs).
    windows: dict[str, tuple[int, int, CounterDeltas]] = {}
    for p in run.probes:
        key = "concurrent" if p.name.startswith(ProbeName.CONCURRENT.value) else p.name
        sent, count, deltas = windows.get(key, (0, 0, p.counter_deltas))
        windows[key] = (sent + p.completion.sent_tokens, count + 1, deltas)
    return [o for sent, count, deltas in windows.values() for url, d in deltas.items()
            for o in other_traffic(url, d, sent + count * pages.get(url, DEFAULT_PAGE), count)]


def _decode_windows(p: ProbeResult, decoders: set[str], run: ProbeRun, ctx: CheckContext) -> tuple[Status, str] | None:
    """A refused probe judged by what its windows (the last try's, and the earlier ones it was sent
    again for) saw the decodes' transfer counters do; None: nothing moved in any of them."""
    moved = transfer_moved(p.counter_deltas, decoders)
    earlier = [m for d in p.earlier_windows if (m := transfer_moved(d, decoders))]
    if not moved and not earlier:
        return None
    tries = f" (in each of its {len(earlier) + 1} windows)" if moved and earlier else ""
    # A decode's counters cannot say whose KV moved: with other clients on the deployment a window
    # that moved is neither cleared nor blamed by itself; in a quiet run it can only be the probe's.
    traffic = traffic_beside_ours(run, ctx)
    if moved and traffic:
        return Status.INCONCLUSIVE, (
            f"refused, but the decode's counters moved in its window{tries} ({moved}) while other traffic was on the "
            f"deployment ({traffic[0]}): whose KV moved cannot be told; rerun with no other traffic on the engines")
    if moved:
        return Status.FAIL, f"refused, but KV reached the decode engine first{tries} (counters moved: {moved})"
    if not traffic:
        return Status.FAIL, (f"refused, but KV reached the decode engine first in its first window (counters moved: "
                             f"{earlier[0]}) with no other traffic on the deployment; sent again, it moved nothing")
    return Status.PASS, (f"refused with no KV moved in a window of its own (sent {len(earlier) + 1} times: the decode's "
                         f"counters moved in the earlier windows while other traffic was on the deployment, {traffic[0]})")


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    probes = run.of(*OVER_CAPACITY_PROBES)
    twin = run.get(ProbeName.BOUNDARY_ACCEPT)
    verdicts = []
    decoders = decode_urls(ctx)
    for p in probes:
        status, message = refusal_verdict(p.completion)
        if status is Status.PASS:
            status, message = _decode_windows(p, decoders, run, ctx) or (status, message)
        elsewhere = answered_elsewhere(p, ctx.snapshots, ctx.entry_model)
        if elsewhere is not None:  # the gateway's 200 hides the checked engine's refusal: still a fail (clients got an answer)
            status, message = Status.FAIL, f"{message}; {elsewhere}"
        elif status is Status.FAIL and not p.completion.rejected:
            processed = {u: d.prompt_tokens for u, d in p.counter_deltas.items() if d.prompt_tokens}
            short = {u: int(v) for u, v in processed.items() if v < p.completion.sent_tokens}
            if short:
                message += ("; the engines' prompt-token counters show only "
                            + ", ".join(f"{v:,} token(s) at {u}" for u, v in short.items())
                            + f" of {p.completion.sent_tokens:,} were processed (a placeholder flowed on)")
        if p.foreign_markers:
            status = Status.FAIL
            message += f"; the response carried another request's synthetic marker(s): {', '.join(p.foreign_markers)}"
        verdicts.append((status, f"{p.name} ({p.completion.sent_tokens:,} tokens): {message}", probe_evidence(p)))
    if not verdicts:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=run.missing("the over-capacity probe"), endpoint=ctx.entry)]
    if twin is None:
        verdicts.append((Status.INCONCLUSIVE, run.missing("the shorter twin (boundary-accept)")
                         + ", so a refusal cannot be shown to be about length", {}))
    elif (twin_elsewhere := answered_elsewhere(twin, ctx.snapshots, ctx.entry_model)) is not None:
        verdicts.append((Status.INCONCLUSIVE, f"the shorter twin (boundary-accept) was {twin_elsewhere}, so the checked "
                         "engine's acceptance of it is not shown", probe_evidence(twin)))
    elif not accepted(twin.completion):
        verdicts.append((Status.INCONCLUSIVE,
                         "the shorter twin (boundary-accept) was not accepted, so a refusal cannot be shown to be about length",
                         probe_evidence(twin)))
    worst = worst_status(v[0] for v in verdicts)
    lines = [m for s, m, _ in verdicts if s is worst] if worst is not Status.PASS else [m for _, m, _ in verdicts]
    gap = ""
    if run.limits and not run.limits.pool_bound:
        gap = " (the pool holds the served context: no over-pool gap exists, only over-context was probed)"
    fix = f"; {FIX}" if worst is Status.FAIL else ""
    result = CheckResult(id=ID, status=worst, message="; ".join(lines) + gap + fix, endpoint=ctx.entry,
                         evidence={"probes": [e for _, _, e in verdicts], "twin_accepted": bool(twin and accepted(twin.completion)
                                                                and answered_elsewhere(twin, ctx.snapshots, ctx.entry_model) is None)})
    return [result, *unreached(ctx, ID)]
