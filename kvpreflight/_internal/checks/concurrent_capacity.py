"""concurrent-capacity: K near-limit requests at once each succeed or get a capacity refusal."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight._internal.checks.probe_common import (
    EchoScope,
    answered_elsewhere,
    not_served,
    probe_evidence,
    stalled_or_broken,
    worst_status,
)
from kvpreflight.model import CheckResult, ErrorKind, Status

ID = CheckId.CONCURRENT_CAPACITY
SCOPE = Scope.GROUP


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    probes = run.concurrent
    if not probes:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=run.missing("the concurrent probe"), endpoint=ctx.entry)]
    verdicts = []
    scope = EchoScope.of(ctx)
    for p in probes:
        c = p.completion
        capacity = c.status == 429 or c.error_kind is ErrorKind.LENGTH
        if (unanswered := stalled_or_broken(c, run.speed_note)) is not None:
            verdicts.append((Status.INCONCLUSIVE, f"{p.name}: {unanswered}"))
        elif (c.status or 0) >= 500:
            verdicts.append((Status.FAIL, f"{p.name}: HTTP {c.status} {c.error_message or ''}".rstrip()))
        elif c.empty_body or (c.error_message is not None and (c.completion_tokens or (c.status == 200 and not capacity))):
            # an answer that came back empty, or ended in an error that is no capacity refusal: not served
            verdicts.append((Status.FAIL, f"{p.name}: not served ({not_served(c)})"))
        elif c.error_message is not None:
            verdicts.append((Status.PASS if capacity else Status.INCONCLUSIVE,
                             f"{p.name}: refused (HTTP {c.status}){'' if capacity else ' for a reason other than capacity'}: "
                             f"{c.error_message}"))
        elif c.truncated or (c.prompt_tokens is not None and c.prompt_tokens < c.sent_tokens):
            verdicts.append((Status.FAIL, f"{p.name}: prompt truncated ({c.prompt_tokens} of {c.sent_tokens})"))
        elif c.served and c.completion_tokens:
            elsewhere = answered_elsewhere(p, ctx.snapshots, ctx.entry_model)
            if elsewhere is not None:  # another deployment's answer need not repeat the prompt
                verdicts.append((Status.INCONCLUSIVE, f"{p.name}: served, but {elsewhere}, so it shows nothing about them"))
            elif (alien := scope.not_from_prompt(p.echo, f"{p.name}'s prompt")) is not None:
                verdicts.append((Status.FAIL, f"{p.name}: {alien}"))
            else:
                verdicts.append((Status.PASS, f"{p.name}: served"))
        else:
            verdicts.append((Status.FAIL, f"{p.name}: not served ({not_served(c)})"))
    worst = worst_status(s for s, _ in verdicts)
    size = probes[0].completion.sent_tokens
    message = f"{len(probes)} x {size:,}-token requests at once: " + "; ".join(m for _, m in verdicts)
    return [CheckResult(id=ID, status=worst, message=message, endpoint=ctx.entry, evidence={"probes": [probe_evidence(p) for p in probes]})]
