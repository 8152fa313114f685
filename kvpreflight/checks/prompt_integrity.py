"""prompt-integrity: a request just under the limit succeeds AND the engine processed exactly
the tokens sent (no silent truncation, no placeholder)."""

from __future__ import annotations

from kvpreflight.checks.interface import CheckContext, probe_run
from kvpreflight.checks.probe_common import not_served, probe_evidence, stalled_or_broken
from kvpreflight.model import CheckResult, Status

ID = "prompt-integrity"


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    p = run.get("boundary-accept")
    if p is None:
        return [CheckResult(ID, Status.INCONCLUSIVE, run.missing("the near-limit request"), ctx.entry)]
    c, ev = p.completion, probe_evidence(p)
    if (unanswered := stalled_or_broken(c, run.speed_note)) is not None:
        return [CheckResult(ID, Status.INCONCLUSIVE, f"a {c.sent_tokens:,}-token prompt within the stated limits: {unanswered}", ctx.entry, ev)]
    if not c.served:
        return [CheckResult(ID, Status.FAIL, f"a {c.sent_tokens:,}-token prompt within the stated limits was not served ({not_served(c)})", ctx.entry, ev)]
    if c.truncated:
        return [CheckResult(ID, Status.FAIL, f"the engine says it truncated a {c.sent_tokens:,}-token prompt within its limits", ctx.entry, ev)]
    if c.prompt_tokens is None:
        return [CheckResult(ID, Status.INCONCLUSIVE, "served, but the engine does not report how many prompt tokens it processed", ctx.entry, ev)]
    if c.prompt_tokens != c.sent_tokens:
        return [CheckResult(ID, Status.FAIL, f"sent {c.sent_tokens:,} tokens, the engine processed {c.prompt_tokens:,}", ctx.entry, ev)]
    if not c.completion_tokens:
        return [CheckResult(ID, Status.FAIL, f"a {c.sent_tokens:,}-token prompt within the stated limits was not served ({not_served(c)})", ctx.entry, ev)]
    return [CheckResult(ID, Status.PASS, f"a {c.sent_tokens:,}-token prompt (the stated maximum) was served with every token processed", ctx.entry, ev)]
