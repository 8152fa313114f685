"""max-tokens-clamp: warn when the engine silently cuts max_tokens instead of refusing."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight._internal.checks.probe_common import answered_elsewhere, probe_evidence
from kvpreflight._internal.probes.results import ProbeName
from kvpreflight.model import CheckResult, ErrorKind, Status

ID = CheckId.MAX_TOKENS_CLAMP
SCOPE = Scope.GROUP


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    p = run.get(ProbeName.CLAMP)
    if p is None or run.limits is None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=run.missing("the clamp probe"), endpoint=ctx.entry)]
    c, ev = p.completion, probe_evidence(p)
    served = run.limits.served_context
    if c.timed_out or c.transport_error or c.malformed:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"no answer to the clamp probe ({c.transport_error or c.malformed or 'timed out'})",
                            endpoint=ctx.entry, evidence=ev)]
    if c.error_message is not None:
        if c.error_kind is ErrorKind.LENGTH and (c.status or 0) < 500:
            return [CheckResult(id=ID, status=Status.PASS, message="prompt + max_tokens over the context is refused explicitly",
                                endpoint=ctx.entry, evidence=ev)]
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=f"refused, but not for length (HTTP {c.status}): {c.error_message}",
                            endpoint=ctx.entry, evidence=ev)]
    generated = c.completion_tokens
    if generated is None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message="served, but the engine reports no completion token count",
                            endpoint=ctx.entry, evidence=ev)]
    elsewhere = answered_elsewhere(p, ctx.snapshots, ctx.entry_model)
    if c.sent_tokens + generated > served:  # what the client got, whoever answered it
        also = f"; {elsewhere}" if elsewhere else ""
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"generated {generated} tokens after a {c.sent_tokens:,}-token prompt: "
                            f"past the served context of {served:,}{also}",
                            endpoint=ctx.entry, evidence=ev)]
    if elsewhere is not None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"the clamp probe was served, but {elsewhere}, so it shows nothing about them",
                            endpoint=ctx.entry, evidence=ev)]
    if generated < c.max_tokens:
        return [CheckResult(id=ID, status=Status.WARN,
                            message=f"max_tokens {c.max_tokens} silently cut to {generated} "
                            f"(finish_reason {c.finish_reason!r}, HTTP {c.status}); "
                            "clients are not told their request was shortened", endpoint=ctx.entry, evidence=ev)]
    return [CheckResult(id=ID, status=Status.PASS, message="max_tokens honoured", endpoint=ctx.entry, evidence=ev)]
