"""What every check gets, and how the list of checks is run (waivers applied here, once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from kvpreflight.checkdata import Thresholds
from kvpreflight.model import CheckResult, EngineSnapshot, Status, Waiver
from kvpreflight.probes.capacity import ProbeRun
from kvpreflight.probes.isolation import IsolationRun

if TYPE_CHECKING:
    from kvpreflight.checks.advisory_data import Advisory


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

    def checked_context(self, snapshot: EngineSnapshot) -> int | None:
        """The larger of what the engine serves and what the operator promises."""
        values = [v for v in (snapshot.served_context, self.promised_context) if v]
        return max(values) if values else None


def probes_missing(ctx: CheckContext, check_id: str, endpoint: str | None = None) -> CheckResult | None:
    """The result for a probe check when no probe ran, else None."""
    if ctx.probes is None:
        return CheckResult(check_id, Status.SKIP, "--capacity-only: no request was sent (read-only mode)", endpoint)
    if ctx.probes.not_run:
        return CheckResult(check_id, Status.INCONCLUSIVE, ctx.probes.not_run, endpoint)
    return None


def isolation_missing(ctx: CheckContext, check_id: str) -> CheckResult | None:
    """The result for an isolation check when its probes did not run, else None."""
    missing = probes_missing(ctx, check_id, ctx.entry)
    if missing:
        return missing
    if ctx.isolation is None:
        return CheckResult(check_id, Status.INCONCLUSIVE, "the two-tenant probes did not run", ctx.entry)
    if ctx.isolation.not_run:
        status = Status.SKIP if ctx.isolation.not_run_status == "skip" else Status.INCONCLUSIVE
        return CheckResult(check_id, status, ctx.isolation.not_run, ctx.entry)
    return None


def run_checks(ctx: CheckContext, check_ids: Sequence[str], waivers: Sequence[Waiver] = ()) -> tuple[CheckResult, ...]:
    from kvpreflight.checks import check_module

    waived = {w.check_id: w for w in waivers}
    results: list[CheckResult] = []
    for check_id in check_ids:
        for result in check_module(check_id).evaluate(ctx):
            waiver = waived.get(check_id)
            if waiver is not None:
                # The check still ran: the report keeps what it found next to the reason it was waived.
                result = CheckResult(
                    result.id, Status.SKIP,
                    f"waived: {waiver.reason} (found: {result.status.value}: {result.message})",
                    result.endpoint, {**result.evidence, "waiver": waiver.reason, "status_before_waiver": result.status.value},
                )
            results.append(result)
    return tuple(results)
