"""pd-transfer: for every served probe that reached a decode engine, the prompt's KV moved from
prefill to decode, by the decode's own counters over that probe: KV received from a transfer
(`kv_transfer_tokens`) and prompt tokens it computed itself (`prefilled_tokens`). A decode that
computed the prompt (the transfer was skipped, or its KV thrown away) fails, quoting the deltas.
Skipped where there is no prefill/decode pair; inconclusive where no counter measures it.

Danger lines in the engines' and the router's logs (a transfer failed, the decode got no transfer
parameters) are quoted with the probe they were logged during: a warning by themselves, part of
the failure beside a recompute. A late read (a decode read KV its prefill had already released:
vLLM's lease ran out; its log line or its counter, which needs no log) fails: every probe here was
answered, so the client got text computed from released KV. An expired lease without a late read
warns with its cost. A KV lease or PD timeout shorter than what the measured speed predicts one
prompt at the limit takes fails (a warning where it is the engine's unstated default). A violation
of the engine's own KV canary (SGLang --kv-canary) fails."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.counts import DEFAULT_PAGE, Tally, prompt_count
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight._internal.checks.probe_common import (
    canary_finding,
    counted_stale_reads,
    danger_entry,
    expiry_finding,
    late_read_finding,
    lease_in_force,
    logged_lines,
    of_hazard,
    outlived_deadlines,
)
from kvpreflight._internal.probes.results import (
    DangerLine,
    Expect,
    ProbeName,
    ProbeResult,
    ProbeRun,
    ScenarioName,
    counter_moved,
    stale_reads,
)
from kvpreflight.model import CheckResult, CounterDelta, CounterDeltas, CounterField, EngineSnapshot, Hazard, Role, Status

ID = CheckId.PD_TRANSFER
SCOPE = Scope.GROUP


class Transfer(enum.StrEnum):
    """What one probe window's counters at one decode say about its KV."""

    MOVED = "moved"
    RECOMPUTED = "recomputed"  # the decode computed the prompt itself
    NOT_MOVED = "not-moved"  # KV for part of the prompt never arrived
    UNMEASURED = "unmeasured"


@dataclass(frozen=True, kw_only=True)
class Window:
    """Probes sent together (the concurrent ones) share one counter window."""

    name: str
    probes: tuple[ProbeResult, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(p.completion.sent_tokens for p in self.probes)

    @property
    def deltas(self) -> CounterDeltas:
        return self.probes[0].counter_deltas


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    decodes = [s for s in ctx.snapshots if s.role is Role.DECODE]
    if not decodes or not any(s.role is Role.PREFILL for s in ctx.snapshots):
        roles = ", ".join(f"{s.role.value} {s.url}" for s in ctx.snapshots) or "no engine"
        return [CheckResult(id=ID, status=Status.SKIP, message=f"not a prefill/decode deployment ({roles}): no KV moves between engines",
                            endpoint=ctx.entry)]
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    windows = _windows([p for p in run.probes if p.expect is Expect.ACCEPT and p.completion.served])
    findings: list[dict[str, Any]] = []
    for window in windows:
        for snap in decodes:
            if snap.url in window.probes[0].reached:
                findings.append(_judge(window, snap, ctx.thresholds.decode_compute_allowance_pages))
    dangers = _danger_lines(run.probes, run.untied_danger_lines)
    stale = [(url, n, f"during {w.name}") for w in windows for url, n in stale_reads(w.deltas).items()]
    evidence: dict[str, Any] = {"probes": findings, "danger_lines": dangers[:MAX_DANGER_EVIDENCE],
                                "danger_lines_count": len(dangers)}
    if stale:
        evidence["stale_kv_reads"] = [{"engine": url, "reads": n, "when": when} for url, n, when in stale]
    expired = [(url, n, f"during {w.name}") for w in windows for url, n in counter_moved(w.deltas, CounterField.EXPIRED_KV).items()]
    if expired:
        evidence["expired_kv_leases"] = [{"engine": url, "requests": n, "when": when} for url, n, when in expired]
    logged = logged_lines(dangers) + counted_stale_reads(stale)
    held_lines, held_counted = _late_decode_reads(ctx)
    if held_lines or held_counted:
        evidence["late_decode_reads"] = {"danger_lines": held_lines,
                                         "stale_kv_reads": [{"engine": u, "reads": n} for u, n, _ in held_counted]}
    # Every request of the capacity probes was meant to be answered: a late read among them is one
    # whose answer reached the client. So was late-decode's decode leg, held past the lease on purpose.
    late = late_read_finding([*of_hazard(dangers, Hazard.LATE_READ), *held_lines], stale + held_counted, ctx.snapshots)
    canary = canary_finding(of_hazard(dangers, Hazard.KV_CANARY))
    handoff = _handoff_finding(_of_served_or_untied(run.probes, of_hazard(dangers, Hazard.HANDOFF_TIMEOUT)))
    corrupt = of_hazard(dangers, Hazard.KV_CORRUPT)
    corruption = (f"a decode received KV other than what its prefill sent (the engine's own KV checksum): a transport or "
                  f"hardware fault, which without the checksum is served as an answer{logged_lines(corrupt)}") if corrupt else None
    expiry = expiry_finding(of_hazard(dangers, Hazard.KV_EXPIRED), expired)
    if late is not None:
        evidence["kv_lease"] = lease_in_force(ctx.snapshots)
    # A measured time fails a stated deadline under it; a prediction (said before the probes too)
    # only warns, for the deadlines the measurement does not already reach.
    near = near_context_time(run)
    max_accepted = run.limits.max_accepted if run.limits else None
    outlived, assumed = outlived_deadlines(ctx.snapshots, near.measured_s, max_accepted, measured=near.went)
    if near.predicted_s is not None and (near.measured_s is None or near.predicted_s > near.measured_s):
        stated, default = outlived_deadlines(ctx.snapshots, near.predicted_s, max_accepted,
                                             at_least_s=near.measured_s or 0.0)
        assumed += stated + default
    if outlived or assumed:
        evidence["outlived_deadlines"] = outlived + assumed
        evidence["near_context_time"] = near.how
    failed = [f for f in findings if f["verdict"] not in (Transfer.MOVED, Transfer.UNMEASURED)]
    said_of_lines = [said for said in (late, canary, handoff, corruption) if said is not None]
    if failed or said_of_lines or outlived:
        parts = [f["finding"] for f in failed] + said_of_lines + outlived
        # These hazards are quoted in their own findings already.
        own = {Hazard.LATE_READ.value, Hazard.KV_CANARY.value, Hazard.HANDOFF_TIMEOUT.value, Hazard.KV_CORRUPT.value}
        rest = [d for d in dangers if d["hazard"] not in own]
        quoted = logged_lines(rest) if said_of_lines else logged
        return [CheckResult(id=ID, status=Status.FAIL, message="; ".join(parts) + quoted, endpoint=ctx.entry, evidence=evidence)]
    if not findings:
        why = run.missing("a served probe") if not windows else "no served probe moved a decode engine's counters"
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"no probe is known to have reached a decode engine: {why}{logged}",
                            endpoint=ctx.entry, evidence=evidence)]
    moved = [f for f in findings if f["verdict"] is Transfer.MOVED]
    if not moved:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message="nothing measures the transfer: the decode engine counts neither KV "
                            f"received nor prompt tokens it computed itself{logged}", endpoint=ctx.entry, evidence=evidence)]
    unmeasured = len(findings) - len(moved)
    also = f"; {unmeasured} more not measured" if unmeasured else ""
    said = f"KV moved from prefill to decode for {len(moved)} served probe(s): " + "; ".join(f["finding"] for f in moved) + also
    if expiry is not None:
        said += f"; {expiry}"
    said += "".join(f"; {a}" for a in assumed)
    return [CheckResult(id=ID, status=Status.WARN if dangers or stale or expiry or assumed else Status.PASS, message=said + logged,
                        endpoint=ctx.entry, evidence=evidence)]


def _of_served_or_untied(probes: Sequence[ProbeResult], lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The handoff timeouts that count: not one naming a probe that was meant to be refused (its
    decode leg waited out KV its prefill never computed: nothing can land late)."""
    refused = {p.completion.request_id for p in probes if p.expect is not Expect.ACCEPT and p.completion.request_id}
    return [d for d in lines if d.get("request_id") not in refused]


def _handoff_finding(lines: Sequence[Mapping[str, Any]]) -> str | None:
    """An engine's own handoff timeout ran out while kvpreflight's requests were in flight: the
    setting each line names is the one to raise."""
    if not lines:
        return None
    settings = sorted({part.removeprefix("setting=") for d in lines for part in str(d.get("detail") or "").split()
                       if part.startswith("setting=")})
    raise_ = f"raise {' and '.join(settings)} above" if settings else "raise the handoff timeouts above"
    return ("a prefill/decode handoff timed out during the check: a request failed waiting for the other side, and KV that "
            "lands after the timeout may be written into pages since given to another request; "
            f"{raise_} the longest prefill the engines serve{logged_lines(lines)}")


LATE_DECODE_WHEN = "during the late-decode scenario: its decode leg, sent after the prefill's KV lease, was answered"


@dataclass(frozen=True)
class NearContextTime:
    """How long a prompt at the limit takes. The prompt at the limit itself (boundary-accept),
    sent, is the measurement: answered, its time to the answer; not answered, how long it ran
    before it failed, a lower bound (an engine that aborted it at a handoff timeout ran it at least
    that long), beside which the calibration's prediction still counts where it is longer. Not
    sent: the prediction alone, which only warns. A calibration request that stalled once (a vLLM
    NIXL pair on 2 cores waited its 30 s lease on an 8-token request) predicted 110 s for a
    1,023-token prompt that was then served in under a second: a prediction is no evidence against
    a measurement."""

    measured_s: float | None
    predicted_s: float | None  # None where the measurement stands alone (the prompt was answered)
    how: str  # how it is known, for the evidence
    went: str | None  # how the one sent went: "was answered in 3.3 s", "ran 21.5 s and was not answered"


def near_context_time(run: ProbeRun) -> NearContextTime:
    accept = run.get(ProbeName.BOUNDARY_ACCEPT)
    tokens = f"{run.limits.max_accepted:,}-token " if run.limits else ""
    predicted = run.near_context_s
    said = "" if predicted is None else f"; predicted from the measured speed: {predicted:.1f} s"
    if accept is not None:
        c = accept.completion
        if c.served:
            took = c.first_token_s
            went = f"was answered in {took:.1f} s"
            return NearContextTime(took, None, f"measured: the {tokens}prompt at the limit {went}", went)
        went = f"ran {c.elapsed_s:.1f} s and was not answered"
        return NearContextTime(c.elapsed_s, predicted, f"measured: the {tokens}prompt at the limit {went}{said}", went)
    if predicted is None:
        return NearContextTime(None, None, "not known: no speed was measured", None)
    return NearContextTime(None, predicted, "predicted from the measured speed (the prompt at the limit was not sent): "
                           f"{predicted:.1f} s", None)


def _late_decode_reads(ctx: CheckContext) -> tuple[list[dict[str, Any]], list[tuple[str, int, str]]]:
    """The late reads of the isolation scenario late-decode (its log lines, its counted reads):
    the engine answered a decode leg from KV it had released, whether or not a canary crossed."""
    run = ctx.isolation
    scenario = next((s for s in run.scenarios if s.name == ScenarioName.LATE_DECODE and not s.skipped), None) if run else None
    if scenario is None:
        return [], []
    lines = [danger_entry(d, f"logged {LATE_DECODE_WHEN}") for d in scenario.danger_lines if d.hazard is Hazard.LATE_READ]
    return lines, [(url, n, LATE_DECODE_WHEN) for url, n in stale_reads(scenario.counter_deltas).items()]


MAX_DANGER_EVIDENCE = 50  # danger lines kept in the evidence (the message counts them all)


def _danger_lines(probes: Sequence[ProbeResult], untied: Sequence[DangerLine]) -> list[dict[str, Any]]:
    """Every danger line once, with when it was logged: during which probe, or between probes."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for probe in probes:
        if id(probe.danger_lines) in seen:  # concurrent probes share one window's lines
            continue
        seen.add(id(probe.danger_lines))
        when = "concurrent probes" if probe.probe is ProbeName.CONCURRENT else f"probe {probe.name}"
        out += [danger_entry(d, f"logged during {when}") for d in probe.danger_lines]
    return out + [danger_entry(d, "logged between probes") for d in untied]


def _windows(probes: Sequence[ProbeResult]) -> list[Window]:
    concurrent = tuple(p for p in probes if p.probe is ProbeName.CONCURRENT)
    out = [Window(name=p.name, probes=(p,)) for p in probes if p.probe is not ProbeName.CONCURRENT]
    if concurrent:
        out.append(Window(name=f"concurrent (x{len(concurrent)})", probes=concurrent))
    return out


def _judge(window: Window, decode: EngineSnapshot, allowance_pages: int) -> dict[str, Any]:
    deltas = window.deltas.get(decode.url, CounterDelta())  # none: nothing known of the decode's counters
    received, computed = deltas.kv_transfer_tokens, deltas.prefilled_tokens
    cached = deltas.cached_prompt_tokens or 0.0  # the decode's own prefix cache held them: nothing to move
    prompt, requests = window.prompt_tokens, len(window.probes)
    allowance = allowance_pages * (decode.page_size or DEFAULT_PAGE) * requests
    counted = {"decode": decode.url, "probe": window.name, "prompt_tokens_sent": prompt,
               "decode_kv_received_tokens": received, "decode_computed_tokens": computed,
               "decode_cached_tokens": cached, "allowed_decode_compute_tokens": allowance}
    said = (f"{window.name}: {prompt:,} prompt tokens sent, decode received KV for {_n(received)}"
            + (f", found {cached:,.0f} in its own prefix cache" if cached else "") + f" and computed {_n(computed)} itself")
    seconds, timed = deltas.transfer_seconds, deltas.transfers_timed
    if seconds is not None and timed:
        counted["kv_transfer_seconds_mean"] = round(seconds / timed, 4)
        said += f" (KV transfer {seconds / timed:.3f} s each, {timed:.0f} timed)"
    if computed is not None and computed > allowance:
        return {**counted, "verdict": Transfer.RECOMPUTED, "finding": f"{said}: the decode recomputed the prompt "
                f"(computed {computed:,.0f} > {allowance:,} allowed){_skipped(received)}"}
    count = prompt_count(prompt, requests, window.deltas, (decode,), allowance=allowance)
    if count.tally is Tally.SHORT or (received is not None and count.tally is Tally.UNMEASURED):
        return {**counted, "verdict": Transfer.NOT_MOVED, "finding": f"{said}: the KV of {prompt - count.accounted:,.0f} prompt tokens "
                "never reached the decode (the transfer was skipped or cut short)"}
    if received is None and computed is None:
        return {**counted, "verdict": Transfer.UNMEASURED, "finding": f"{window.name}: not measured at {decode.url}"}
    # Received in full, or (no received-KV counter) computed next to nothing itself: served from
    # transferred KV.
    return {**counted, "verdict": Transfer.MOVED, "finding": said}


def _n(value: float | None) -> str:
    return "an uncounted number of tokens" if value is None else f"{value:,.0f} tokens"


def _skipped(received: float | None) -> str:
    return "; no KV arrived (the transfer was skipped)" if received == 0 else ""
