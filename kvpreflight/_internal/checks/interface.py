"""What every check gets, and how the list of checks is run (waivers applied here, once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpreflight._internal.check_ids import CheckId
from kvpreflight._internal.checkdata import Thresholds
from kvpreflight._internal.checks.advisory_data import Advisory
from kvpreflight._internal.probes.results import IsolationRun, ProbeRun
from kvpreflight.model import CheckResult, EngineSnapshot, ProcessListeners, Status, Waiver, checked_context


@dataclass(frozen=True)
class CheckContext:
    snapshots: tuple[EngineSnapshot, ...]
    thresholds: Thresholds
    promised_context: int | None = None  # --context-length: what the operator promises users
    probes: ProbeRun | None = None  # None: capacity-only (no request sent)
    entry: str | None = None
    advisories: tuple[Advisory, ...] = ()
    expected_model: str | None = None  # --model
    isolation: IsolationRun | None = None  # the two-tenant probes (None: not run, see probes)
    entry_model: str | None = None  # --entry-model: the name the entry knows the engines' model by
    listeners: tuple[ProcessListeners, ...] = ()  # each engine's (and booted router's) listening sockets, or why not read

    def checked_context(self, snapshot: EngineSnapshot) -> int | None:
        """The context `snapshot` is checked against (kvpreflight.model.checked_context)."""
        return checked_context(snapshot.served_context, self.promised_context)


def probe_run(ctx: CheckContext, check_id: CheckId) -> ProbeRun | CheckResult:
    """The capacity probes' run, or the result of a probe check when no probe ran:

        run = probe_run(ctx, ID)
        if isinstance(run, CheckResult):
            return [run]
    """
    if ctx.probes is None:
        return CheckResult(id=check_id, status=Status.SKIP, message="--capacity-only: no request was sent (read-only mode)",
                           endpoint=ctx.entry)
    if ctx.probes.not_run:
        return CheckResult(id=check_id, status=Status.INCONCLUSIVE, message=ctx.probes.not_run, endpoint=ctx.entry)
    return ctx.probes


def isolation_run(ctx: CheckContext, check_id: CheckId) -> IsolationRun | CheckResult:
    """The two-tenant probes' run, or the result of an isolation check when they did not run."""
    probes = probe_run(ctx, check_id)
    if isinstance(probes, CheckResult):
        return probes
    if ctx.isolation is None:
        return CheckResult(id=check_id, status=Status.INCONCLUSIVE, message="the two-tenant probes did not run", endpoint=ctx.entry)
    if ctx.isolation.not_run:
        return CheckResult(id=check_id, status=Status.INCONCLUSIVE, message=ctx.isolation.not_run, endpoint=ctx.entry)
    return ctx.isolation


def run_checks(ctx: CheckContext, check_ids: Sequence[str], waivers: Sequence[Waiver] = ()) -> tuple[CheckResult, ...]:
    from kvpreflight._internal.checks import check_module

    waived = {w.check_id: w for w in waivers}
    results: list[CheckResult] = []
    for check_id in check_ids:
        for result in check_module(check_id).evaluate(ctx):
            waiver = waived.get(check_id)
            if waiver is not None:
                # The check still ran: the report keeps what it found next to the reason it was waived.
                result = CheckResult(
                    id=result.id, status=Status.SKIP,
                    message=f"waived: {waiver.reason} (found: {result.status.value}: {result.message})",
                    endpoint=result.endpoint,
                    evidence={**result.evidence, "waiver": waiver.reason, "status_before_waiver": result.status.value},
                )
            results.append(result)
    return tuple(results)
