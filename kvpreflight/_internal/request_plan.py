"""What a check will send, before it sends it: per probe run (one entry and the engines behind it)
the requests with their sizes, what they cost in context-equivalents, and how long they should
take at the engine's measured speed. `check --plan` prints it; `--max-context-equivalents` refuses
a plan above a limit before any request (exit 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpreflight._internal.probes.budget import PlannedRequest, Speed, calibration_plan
from kvpreflight._internal.probes.results import Expect, Limits
from kvpreflight.errors import ConfigError


class PlanTooCostly(ConfigError):
    """The plan asks more of the engines than --max-context-equivalents allows."""


@dataclass(frozen=True, kw_only=True)
class GroupPlan:
    entry: str | None
    engines: tuple[str, ...]
    limits: Limits | None = None
    requests: tuple[PlannedRequest, ...] = ()
    not_probed: str | None = None  # why this group gets no probe request

    @property
    def calibration(self) -> tuple[PlannedRequest, ...]:
        """The requests `check` sends first to measure the engine's speed."""
        return calibration_plan(self.limits.max_accepted) if self.limits and self.requests else ()

    @property
    def sent(self) -> tuple[PlannedRequest, ...]:
        """The requests sent whatever the engine answers (the counts say what will be sent):
        the calibration, then every probe but the conditional ones."""
        return self.calibration + tuple(p for p in self.requests if p.only_if is None)

    @property
    def conditional(self) -> tuple[PlannedRequest, ...]:
        """The requests sent only if their condition holds (the timing audit)."""
        return tuple(p for p in self.requests if p.only_if is not None)

    @property
    def request_count(self) -> int:
        return _requests_in(self.sent)

    @property
    def submitted_tokens(self) -> int:
        return _tokens_in(self.sent)

    @property
    def conditional_count(self) -> int:
        return _requests_in(self.conditional)

    @property
    def conditional_tokens(self) -> int:
        return _tokens_in(self.conditional)

    @property
    def accepted_tokens(self) -> int:
        """Prompt tokens of the requests that must be served: what an honest engine that refuses
        before prefill computes at most (less what its prefix cache holds)."""
        return sum(p.prompt_tokens * p.concurrent for p in self.sent if p.expect is Expect.ACCEPT)

    def equivalents(self, tokens: int) -> float:
        return tokens / self.limits.served_context if self.limits else 0.0

    def conditional_text(self) -> str:
        """'; up to 90 more requests (2.3 context-equivalents), only if ...', or ''."""
        if not self.conditional:
            return ""
        conditions = ", ".join(dict.fromkeys(str(p.only_if) for p in self.conditional))
        return (f"; up to {self.conditional_count} more requests ({self.conditional_tokens:,} prompt tokens = "
                f"{self.equivalents(self.conditional_tokens):.1f} context-equivalents), only if {conditions}")

    def refuse_above(self, limit: float | None) -> None:
        """Judged on what will be sent; the conditional part is said, and counted only if the
        limit leaves no room for it."""
        if limit is not None and self.equivalents(self.submitted_tokens) > limit:
            raise PlanTooCostly(
                f"the probes for {self.entry} would submit {self.submitted_tokens:,} prompt tokens = "
                f"{self.equivalents(self.submitted_tokens):.1f} context-equivalents{self.conditional_text()}, "
                f"above --max-context-equivalents {limit:g}; nothing was sent (raise the limit, or use --capacity-only)")


@dataclass(frozen=True, kw_only=True)
class GroupPreview:
    plan: GroupPlan
    speed: Speed | None = None
    estimate_s: float | None = None
    calibration: str = ""  # what was sent to measure the speed, or why nothing was
    outlived: tuple[str, ...] = ()  # KV handoff deadlines the longest planned prompt would outlive


def to_dict(previews: list[GroupPreview]) -> dict[str, Any]:
    """`check --plan --format json`."""
    groups = []
    for preview in previews:
        plan = preview.plan
        groups.append({
            "entry": plan.entry, "engines": list(plan.engines), "not_probed": plan.not_probed,
            "limits": None if plan.limits is None else {"served_context": plan.limits.served_context,
                                                        "pool_tokens": plan.limits.pool_tokens,
                                                        "max_accepted": plan.limits.max_accepted},
            "requests": [{"probe": p.name, "prompt_tokens": p.prompt_tokens, "max_tokens": p.max_tokens,
                          "count": p.concurrent, "expect": p.expect.value, "only_if": p.only_if}
                         for p in _grouped(plan.calibration + plan.requests)],
            "requests_sent": plan.request_count,  # calibration included, as in the report's cost block
            "calibration_requests": len(plan.calibration),
            "prompt_tokens_submitted": plan.submitted_tokens,
            "context_equivalents_submitted": round(plan.equivalents(plan.submitted_tokens), 2),
            "conditional_requests": plan.conditional_count,
            "conditional_prompt_tokens": plan.conditional_tokens,
            "context_equivalents_conditional": round(plan.equivalents(plan.conditional_tokens), 2),
            "accepted_prompt_tokens": plan.accepted_tokens,
            "context_equivalents_accepted": round(plan.equivalents(plan.accepted_tokens), 2),
            "calibration": preview.calibration,
            "speed": None if preview.speed is None else preview.speed.describe(),
            "expected_duration_s": None if preview.estimate_s is None else round(preview.estimate_s, 1),
            "outlived_deadlines": list(preview.outlived),
        })
    return {"plan": groups}


def render(previews: list[GroupPreview], width: int | None = None) -> str:
    """The plan as text: one block per probe run, its lines fitted to `width` (None: as long as they are)."""
    from tabulate import tabulate

    from kvpreflight.formats._common import fit

    out = []
    for preview in previews:
        plan = preview.plan
        out.append(f"Probe run through {plan.entry or '(no entry)'} ({', '.join(plan.engines)})")
        if plan.not_probed or plan.limits is None:
            out.append(f"  no probe request: {plan.not_probed}")
            continue
        lim = plan.limits
        pool = f", pool {lim.pool_tokens:,}" if lim.pool_tokens is not None else ""
        out.append(f"  limits: context {lim.served_context:,}{pool}, longest accepted prompt {lim.max_accepted:,}")
        rows = [[p.name, f"{p.prompt_tokens:,}", p.max_tokens, p.concurrent, p.expect.value + (" (only if)" if p.only_if else "")]
                for p in _grouped(plan.calibration + plan.requests)]
        table = tabulate(rows, headers=["probe", "prompt tokens", "max_tokens", "x", "must be"], tablefmt="simple")
        out.append("\n".join("  " + line for line in table.splitlines()))
        out.append(f"  {plan.request_count} requests ({len(plan.calibration)} of them calibration); "
                   f"{plan.submitted_tokens:,} prompt tokens submitted = "
                   f"{plan.equivalents(plan.submitted_tokens):.1f} context-equivalents; at most {plan.accepted_tokens:,} "
                   f"prefilled by an engine that refuses before prefill = {plan.equivalents(plan.accepted_tokens):.1f}")
        if plan.conditional:
            out.append(f"  {plan.conditional_text().removeprefix('; ')}")
        out.append(f"  calibration: {preview.calibration}")
        if preview.estimate_s is None or preview.speed is None:
            out.append("  expected duration: unknown (no speed measured)")
        else:
            out.append(f"  expected duration: about {preview.estimate_s:.0f} s at {preview.speed.describe()}")
        out.extend(f"  before sending: {said}" for said in preview.outlived)
    return fit("\n".join(out), width) + "\n"


def _grouped(requests: tuple[PlannedRequest, ...]) -> list[PlannedRequest]:
    """Identical requests of one probe or scenario as one row with their count, where the first
    of them is (a mirrored scenario alternates its sizes: one row per size)."""
    rows: dict[tuple[str, int, int, Expect], PlannedRequest] = {}
    for p in requests:
        key = (p.name, p.prompt_tokens, p.max_tokens, p.expect)
        if (seen := rows.get(key)) is not None:
            rows[key] = PlannedRequest(p.name, p.prompt_tokens, p.max_tokens, p.expect, seen.concurrent + p.concurrent, p.only_if)
        else:
            rows[key] = p
    return list(rows.values())


def _requests_in(planned: tuple[PlannedRequest, ...]) -> int:
    return sum(p.concurrent for p in planned)


def _tokens_in(planned: tuple[PlannedRequest, ...]) -> int:
    return sum(p.prompt_tokens * p.concurrent for p in planned)
