"""prompt-integrity: a request just under the limit succeeds AND the engine processed exactly
the tokens sent (no silent truncation, no placeholder): by the answer's own usage, and by the
engines' counters over the near-limit requests (the boundary one and the concurrent ones), which
must account for every token sent (kvpreflight._internal.checks.counts): an engine that shortens a prompt
and reports its full length in the answer fails on its counters. Counts are not enough: the
near-limit answers must come from their own prompts (an echoing model's answer repeats it, from
its head where the model reaches that far) and no sooner than the engine can compute them
(kvpreflight._internal.checks.plausibility)."""

from __future__ import annotations

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks import plausibility
from kvpreflight._internal.checks.counts import PromptCount, Tally, computing_tier, prompt_count
from kvpreflight._internal.checks.engine_warnings import PROMPT_INTEGRITY_HAZARDS, warning_result
from kvpreflight._internal.checks.interface import CheckContext, probe_run
from kvpreflight._internal.checks.probe_common import EchoScope, answered_elsewhere, not_served, probe_evidence, stalled_or_broken
from kvpreflight._internal.probes.results import ProbeName, ProbeResult, ProbeRun
from kvpreflight.model import CheckResult, EngineSnapshot, Status

ID = CheckId.PROMPT_INTEGRITY
SCOPE = Scope.GROUP


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    # The engine's own warning (positions overridden, window cut) fails with or without a probe.
    if (warned := warning_result(ID, ctx.snapshots, PROMPT_INTEGRITY_HAZARDS, ctx.entry)) is not None:
        return [warned]
    run = probe_run(ctx, ID)
    if isinstance(run, CheckResult):
        return [run]
    p = run.get(ProbeName.BOUNDARY_ACCEPT)
    if p is None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE, message=run.missing("the near-limit request"), endpoint=ctx.entry)]
    c, ev = p.completion, probe_evidence(p)
    if (unanswered := stalled_or_broken(c, run.speed_note)) is not None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"a {c.sent_tokens:,}-token prompt within the stated limits: {unanswered}",
                            endpoint=ctx.entry, evidence=ev)]
    if not c.served:
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"a {c.sent_tokens:,}-token prompt within the stated limits was not served ({not_served(c)})",
                            endpoint=ctx.entry, evidence=ev)]
    if c.truncated:
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"the engine says it truncated a {c.sent_tokens:,}-token prompt within its limits",
                            endpoint=ctx.entry, evidence=ev)]
    if c.prompt_tokens is None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message="served, but the engine does not report how many prompt tokens it processed",
                            endpoint=ctx.entry, evidence=ev)]
    if c.prompt_tokens != c.sent_tokens:
        return [CheckResult(id=ID, status=Status.FAIL, message=f"sent {c.sent_tokens:,} tokens, the engine processed {c.prompt_tokens:,}",
                            endpoint=ctx.entry, evidence=ev)]
    if not c.completion_tokens:
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"a {c.sent_tokens:,}-token prompt within the stated limits was not served ({not_served(c)})",
                            endpoint=ctx.entry, evidence=ev)]
    counted = _counted(run, computing_tier(ctx.snapshots))
    timed = plausibility.judge(run, ctx.isolation)
    ev = {**ev, "engine_counts": {name: count.evidence() for name, count in counted},
          "plausibility": [j.evidence() for j in timed]}
    short = [f"{name}: {count.describe()}" for name, count in counted if count.tally is Tally.SHORT]
    elsewhere = answered_elsewhere(p, ctx.snapshots, ctx.entry_model)
    if short:  # a deficit is evidence whoever answered: a fail, with the other deployment named if it shows
        also = f"; or it was {elsewhere}" if elsewhere else ""
        return [CheckResult(id=ID, status=Status.FAIL,
                            message=f"the answer reports all {c.sent_tokens:,} prompt tokens processed, but the engines' "
                            "counters do not: " + "; ".join(short) + f" (the prompt was shortened silently){also}",
                            endpoint=ctx.entry, evidence=ev)]
    if elsewhere is not None:
        return [CheckResult(id=ID, status=Status.INCONCLUSIVE,
                            message=f"a {c.sent_tokens:,}-token prompt within the stated limits was served, but "
                            f"{elsewhere}, so it shows nothing about them", endpoint=ctx.entry, evidence=ev)]
    # Every count may agree and the answers still not come from the prompts: an echoing model's
    # near-limit answer that repeats nothing of its prompt (or only its end), or any answer faster
    # than the engine can compute what it reports.
    scope = EchoScope.of(ctx)
    unread = [said for q in (p, *run.concurrent) if q.completion.served
              and (said := scope.not_from_prompt(q.echo, f"{q.name}'s prompt") or scope.window_only(q.echo, f"{q.name}'s prompt"))]
    impossible = [f"{j.describe()}: the engine did not compute the prompt it says it computed (a placeholder prefilled in its "
                  "place answers from whatever the pages held: the incident)" for j in timed if j.impossible]
    if unread or impossible:
        return [CheckResult(id=ID, status=Status.FAIL, message=f"every count says the {c.sent_tokens:,}-token prompt was processed, but "
                            + "; ".join(unread + impossible), endpoint=ctx.entry, evidence=ev)]
    unmeasured = [f"{name}: {count.describe()}" for name, count in counted if count.tally is Tally.UNMEASURED]
    also = "; not cross-checked with the engines' counters: " + "; ".join(unmeasured) if unmeasured else ""
    if not counted:
        also = "; no engine counter moved over it, so only the answer's own count says so"
    speed = next((j for j in timed if j.probe == p.name), None)
    if speed is not None and speed.needs_s is not None:
        also += (f"; answered in {speed.first_token_s:.3f} s, which the fastest prefill seen ({speed.fastest_rate or 0:,.0f} "
                 f"tokens/s) allows ({speed.needs_s:.3f} s, {plausibility.MARGIN:g}x margin)")
    return [CheckResult(id=ID, status=Status.PASS,
                        message=f"a {c.sent_tokens:,}-token prompt (the stated maximum) was served with every token processed{also}",
                        endpoint=ctx.entry, evidence=ev)]


def _counted(run: ProbeRun, tier: tuple[EngineSnapshot, ...]) -> list[tuple[str, PromptCount]]:
    """The computing engines' account of each served near-limit window: the boundary request
    alone, the concurrent ones together (they share one window)."""
    windows: list[tuple[str, list[ProbeResult]]] = []
    if (p := run.get(ProbeName.BOUNDARY_ACCEPT)) is not None and p.completion.served:
        windows.append((p.name, [p]))
    concurrent = [p for p in run.concurrent if p.completion.served]
    if concurrent and len(concurrent) == len(run.concurrent):  # a refused one moved no counter of ours
        windows.append((f"concurrent (x{len(concurrent)})", concurrent))
    out = []
    for name, probes in windows:
        deltas = probes[0].counter_deltas
        if not deltas:
            continue
        out.append((name, prompt_count(sum(p.completion.sent_tokens for p in probes), len(probes), deltas, tier)))
    return out
