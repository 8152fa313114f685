"""The engines' own start-up warnings about the context they serve (EngineSnapshot.context_warnings),
judged: each fails the check it concerns, with the fix.

- a context past the model's positions, and an attention window cut below the sequence: prompts
  are served and counted whole, but not computed as the answer needs them, so `prompt-integrity`
  (the check that says the longest accepted prompt was served whole) fails;
- a longest sequence or input cut below what the engine was configured for: its KV cache does
  not hold one sequence of the context it states, so `kv-capacity` fails.

A warning fails its check even when no probe was sent (`--capacity-only`, probes that could not
run): the engine's own word is the evidence, and a probe's pass would not outweigh it (a short
answer echoes under any window; a prompt past the positions is counted whole)."""

from __future__ import annotations

from collections.abc import Iterable

from kvpreflight._internal.check_ids import CheckId
from kvpreflight.model import CheckResult, ContextHazard, ContextWarning, EngineSnapshot, Status

PROMPT_INTEGRITY_HAZARDS = (ContextHazard.POSITIONS, ContextHazard.WINDOW)
KV_CAPACITY_HAZARDS = (ContextHazard.SEQUENCE,)


def _tokens(n: int | None, otherwise: str) -> str:
    return f"{n:,} tokens" if n is not None else otherwise


def consequence(w: ContextWarning) -> str:
    """What the warning means for an answer, with its numbers."""
    if w.hazard is ContextHazard.POSITIONS:
        served = f"a context of {w.stated:,} tokens" if w.stated is not None else "a context"
        return (f"it serves {served} past the model's {_tokens(w.tokens, 'positions')}: a longer prompt is served and "
                "counted whole, and answered from positions the model never learned (incorrect outputs)")
    if w.hazard is ContextHazard.WINDOW:
        window = _tokens(w.tokens, "less than the sequence")
        return (f"it cut its attention window to {window}, so its KV cache could hold one sequence: an answer to a "
                "longer prompt sees only that prompt's last window")
    return (f"it cut its longest sequence (or input) to {_tokens(w.tokens, 'less than configured')}: its KV cache "
            "does not hold one sequence of the context it was configured for, so it serves less than stated")


def warned(snapshots: Iterable[EngineSnapshot], hazards: tuple[ContextHazard, ...]
           ) -> list[tuple[EngineSnapshot, ContextWarning]]:
    return [(s, w) for s in snapshots for w in s.context_warnings if w.hazard in hazards]


def warning_result(check_id: CheckId, snapshots: Iterable[EngineSnapshot], hazards: tuple[ContextHazard, ...],
                   endpoint: str | None) -> CheckResult | None:
    """The check's fail for the engines' warnings of these hazards, or None where none warned."""
    found = warned(snapshots, hazards)
    if not found:
        return None
    snap, first = found[0]
    more = f" (and {len(found) - 1} more such warning(s): see the evidence)" if len(found) > 1 else ""
    message = (f"the {snap.role.value} engine's start-up log ({snap.url}) warns \"{first.what}\": {consequence(first)}. "
               f"Fix: {first.fix}{more}")
    evidence = {"start_up_warnings": [{"engine": s.url, **w.evidence()} for s, w in found]}
    return CheckResult(id=check_id, status=Status.FAIL, message=message, endpoint=endpoint, evidence=evidence)
