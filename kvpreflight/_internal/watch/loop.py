"""The watcher: one round (drift + hazards + canaries within the budget), and the loop that runs
a round every interval until told to stop. A round never raises for what an engine does: an
unreachable engine is a finding and the next round tries again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace

from kvpreflight._internal.clock import utc_now
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.interface import EngineAdapter
from kvpreflight._internal.probes.engine_state import EngineState
from kvpreflight._internal.session import DeploymentSession, open_session
from kvpreflight._internal.watch.budget import BudgetPlan, HourlySpend
from kvpreflight._internal.watch.canaries import MAX_PROMPT_TOKENS, REQUESTS_PER_ROUND, CanarySettings, canary_round
from kvpreflight._internal.watch.drift import Baseline, drift_findings
from kvpreflight._internal.watch.findings import Finding, FindingKind, Round, RoundOutcome
from kvpreflight._internal.watch.full import FullResult, full_round, full_targets
from kvpreflight._internal.watch.hazards import HazardWatch
from kvpreflight._internal.watch.targets import Watched
from kvpreflight.check_plan import CheckPlan
from kvpreflight.errors import ConfigError
from kvpreflight.model import EngineSnapshot, Status

STOP_GRACE_S = 2.0  # after SIGTERM, how long a round in flight may take to end (the stop is well inside 10 s)


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    plan: CheckPlan  # targets, entry, engine, auth, logs, timeout: as `check --capacity-only` reads them
    budget: BudgetPlan
    baseline: Baseline | None = None
    canaries: bool = True
    full_every_s: float | None = None  # --full-every: the first round, then one round this often, is full
    deployment: str | None = None  # the `deployment` each round names (an inventory watches several)


class Watcher:
    """Keeps what must survive between rounds: the counters, the logs' offsets, the spending."""

    def __init__(self, settings: WatchSettings, *, progress: Callable[[str], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic, spend: HourlySpend | None = None) -> None:
        self.settings = settings
        self.progress = progress
        self.hazards = HazardWatch(settings.plan.logs)
        self.spend = spend or HourlySpend(clock)  # one shared by every deployment of an inventory: one cap
        self.rounds = 0
        self._clock = clock
        self._last_prompt_tokens = MAX_PROMPT_TOKENS  # the next round's canary size, for the budget
        self._last_full: float | None = None  # when the last full round was sent (None: the next one is)

    @property
    def full_due(self) -> bool:
        every = self.settings.full_every_s
        return every is not None and (self._last_full is None or self._clock() - self._last_full >= every)

    def full_round_tokens(self) -> tuple[int | None, int]:
        """What one full round submits (prompt tokens, None when the engines cannot be read now)
        and through how many entries: read-only, for the budget stated at start."""
        with ExitStack() as opened:
            session = self._open(opened)
            if isinstance(session, Finding):
                return None, 1
            targets, _ = full_targets(session)
        if not targets:
            return None, 1
        return sum(t.prompt_tokens for t in targets), len(targets)

    # -- one round -----------------------------------------------------------------------------
    def round(self, stop: threading.Event | None = None) -> Round:
        stop = stop or threading.Event()
        self.rounds += 1
        started = utc_now()
        findings: list[Finding] = []
        not_measured: list[str] = []
        notes: list[str] = []
        sent = {"requests": 0, "tokens": 0}
        retry_after: float | None = None
        outcome: RoundOutcome | None = None
        is_full = False
        snapshots: Sequence[EngineSnapshot] = ()
        try:
            with ExitStack() as opened:
                session = self._open(opened)
                adapters: Mapping[str, EngineAdapter] = {}
                groups = 0
                if isinstance(session, Finding):
                    findings.append(session)
                else:
                    adapters, snapshots, groups = session.adapters, session.snapshots, len(session.groups)
                    where = self._where()
                    unreadable = [Finding(kind=FindingKind.UNREACHABLE, what="engine", endpoint=r.endpoint or where,
                                          message=r.message) for r in session.unreadable if r.status is Status.INCONCLUSIVE]
                    findings.extend(unreadable)
                    if self.settings.baseline is not None:
                        findings.extend(drift_findings(self.settings.baseline, snapshots,
                                                       unreadable=[f.endpoint for f in unreadable]))
                    self.hazards.follow_logs(session.log_signals())
                outcome, is_full, retry_after = self._send(None if isinstance(session, Finding) else session, groups, stop, sent,
                                                           findings, not_measured, notes)
                if adapters:  # after the canaries: what this round's own requests met counts in this round
                    counters = EngineState(adapters).counters()
                    hazards, hazard_notes, _ = self.hazards.take(counters)
                    not_measured.extend(f"hazards: {url}'s counters could not be read" for url, c in counters.items() if c is None)
                    findings.extend(hazards)
                    notes.extend(hazard_notes)
        finally:
            self.spend.add(sent["requests"], sent["tokens"])
        if stop.is_set():
            outcome = RoundOutcome.CUT_SHORT
        if outcome is None:
            outcome = RoundOutcome.FINDINGS if findings else (RoundOutcome.NOT_MEASURED if not_measured else RoundOutcome.CLEAN)
        return Round(number=self.rounds, started_at=started, finished_at=utc_now(), outcome=outcome,
                     findings=tuple(findings), not_measured=tuple(not_measured), notes=tuple(notes),
                     requests=sent["requests"], prompt_tokens=sent["tokens"], retry_after_s=retry_after,
                     engines=tuple(s.url for s in snapshots), deployment=self.settings.deployment, full=is_full)

    def _send(self, session: DeploymentSession | None, groups: int, stop: threading.Event, sent: dict[str, int],
              findings: list[Finding], not_measured: list[str], notes: list[str]
              ) -> tuple[RoundOutcome | None, bool, float | None]:
        """This round's full round (when due) and canaries: (the outcome they decide, whether the
        round was full, the Retry-After a throttled entry asked for)."""
        outcome: RoundOutcome | None = None
        retry_after: float | None = None
        is_full = False
        live = session if session is not None and session.snapshots else None  # some engine was read
        canary_tokens = REQUESTS_PER_ROUND * self._last_prompt_tokens * groups
        if self.full_due and live is not None and not stop.is_set():
            full = self._full(live, canary_tokens if self.settings.canaries else 0, stop, sent)
            findings.extend(full.findings)
            not_measured.extend(full.not_measured)
            notes.extend(full.notes)
            is_full = full.requests > 0
            if full.cut_short:
                outcome = RoundOutcome.CUT_SHORT
            elif full.skipped:
                outcome = RoundOutcome.SKIPPED
        elif self.full_due:
            not_measured.append("full round: no engine could be read; the next round tries again")
        if self.settings.canaries and live is not None and outcome is not RoundOutcome.CUT_SHORT:
            planned = canary_tokens
            if not self.spend.allows(planned + sent["tokens"], self.settings.budget.max_tokens_per_hour):
                used = self.spend.last_hour()[1]
                notes.append(f"canaries skipped: {planned:,} more prompt tokens would pass --max-tokens-per-hour "
                             f"{self.settings.budget.max_tokens_per_hour:,} ({used:,} sent in the last hour)")
                outcome = RoundOutcome.SKIPPED
            else:
                result = self._canaries(live, stop, sent)
                findings.extend(result[0])
                not_measured.extend(result[1])
                if result[2]:
                    outcome = RoundOutcome.CUT_SHORT
                elif result[3]:
                    retry_after = result[4]
                    wait = f"; the next round waits {retry_after:g} s (Retry-After)" if retry_after else ""
                    notes.append(f"throttled: the entry answered HTTP 429, canaries stopped for this round{wait}")
                    if outcome is None:  # a skipped full round stays the round's outcome
                        outcome = RoundOutcome.THROTTLED
        elif self.settings.canaries and live is None and not findings:
            not_measured.append("canaries: no engine could be read")
        return outcome, is_full, retry_after

    def _full(self, session: DeploymentSession, canary_tokens: int, stop: threading.Event, sent: dict[str, int]
              ) -> FullResult:
        """The full round's two requests per entry, when they fit the hourly cap with this round's
        canaries; otherwise nothing is sent, it is said, and the next round tries again."""
        targets, missing = full_targets(session)
        planned = sum(t.prompt_tokens for t in targets)
        cap = self.settings.budget.max_tokens_per_hour
        if targets and not self.spend.allows(planned + canary_tokens, cap):
            used = self.spend.last_hour()[1]
            return FullResult(notes=(f"full round skipped: its {planned:,} prompt tokens (with this round's canaries "
                                    f"{planned + canary_tokens:,}) would pass --max-tokens-per-hour {cap:,} ({used:,} sent "
                                    "in the last hour); the next round tries again",), skipped=True)
        findings: list[Finding] = []
        notes: list[str] = []
        for target in targets:
            if stop.is_set():
                return FullResult(findings=tuple(findings), not_measured=tuple(missing), notes=tuple(notes),
                                 requests=sent["requests"], cut_short=True)
            done = full_round(session, target, stop)
            sent["requests"] += done.requests
            sent["tokens"] += done.prompt_tokens
            findings.extend(done.findings)
            missing.extend(done.not_measured)
            notes.extend(done.notes)
            if done.cut_short:
                return FullResult(findings=tuple(findings), not_measured=tuple(missing), notes=tuple(notes),
                                 requests=sent["requests"], cut_short=True)
        if targets:
            self._last_full = self._clock()
        return FullResult(findings=tuple(findings), not_measured=tuple(missing), notes=tuple(notes), requests=sent["requests"])

    def _where(self) -> str:
        plan = self.settings.plan
        return plan.entry or ", ".join(t.url for t in plan.targets)

    def _open(self, opened: ExitStack) -> DeploymentSession | Finding:
        """This round's opening of the deployment (closed with `opened`), or why it could not be read."""
        where = self._where()
        try:
            return opened.enter_context(open_session(self.settings.plan))
        except (EngineError, ConfigError) as exc:  # the router's worker list is unreadable this round
            return Finding(kind=FindingKind.UNREACHABLE, what="entry", endpoint=where,
                           message=f"{where}: the engines behind it could not be read this round (down, or not a router): {exc}")

    def _canaries(self, session: DeploymentSession, stop: threading.Event, sent: dict[str, int]
                  ) -> tuple[list[Finding], list[str], bool, bool, float | None]:
        plan = session.plan
        findings: list[Finding] = []
        missing: list[str] = []
        settings = CanarySettings(connection=session.connection, tenant_headers=plan.auth.tenant_headers,
                                  salted=plan.auth.tenant_binding is None)
        for group in session.groups:
            entry = group.entry
            if entry is None:
                missing.append("canaries: a prefill/decode deployment is probed through its router; pass --entry URL")
                continue
            try:
                limits = session.limits(group)
            except EngineError as exc:  # the round goes on: the entry is unreachable this round
                findings.append(Finding(kind=FindingKind.UNREACHABLE, what="entry", endpoint=entry.url,
                                        message=f"{entry.url}: its limits could not be read, so no canary was sent: {exc}"))
                continue
            if limits is None:
                missing.append(f"canaries: {group.entry_url} states no served context or request limit")
                continue

            def count(tokens: int) -> None:
                sent["requests"] += 1
                sent["tokens"] += tokens
                self._last_prompt_tokens = tokens

            engines = list(session.engines_of(group).values())
            try:
                result = canary_round(entry, engines, limits, settings, stop, on_sent=count)
            except EngineError as exc:
                findings.append(Finding(kind=FindingKind.UNREACHABLE, what="entry", endpoint=entry.url,
                                        message=f"{entry.url}: canaries could not be sent: {exc}"))
                continue
            findings.extend(result.findings)
            missing.extend(result.not_measured)
            if result.cut_short or result.throttled:
                return findings, missing, result.cut_short, result.throttled, result.retry_after_s
        return findings, missing, False, False, None

    def _round_into(self, box: list[Round], stop: threading.Event) -> None:
        box.append(self.round(stop))

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event, emit: Callable[[Round], None], *, interval_s: float,
            max_rounds: int | None = None) -> Round | None:
        """`run_watchers` with this one watcher. Returns the last round."""
        last = run_watchers([self], stop, emit, interval_s=interval_s, max_rounds=max_rounds)
        return last[0] if last else None

    def timed_round(self, stop: threading.Event) -> Round:
        """One round in a worker thread, so a stop is obeyed within STOP_GRACE_S even while a
        request is in flight: the round is then recorded as cut short and the worker (a daemon) is
        left to end with the process."""
        box: list[Round] = []
        number, started = self.rounds + 1, utc_now()
        worker = threading.Thread(target=self._round_into, args=(box, stop), name="kvpreflight-watch-round", daemon=True)
        worker.start()
        while worker.is_alive() and not stop.is_set():
            worker.join(0.1)
        worker.join(STOP_GRACE_S if stop.is_set() else None)
        if box:
            return box[0]
        self.rounds = number  # stopped with a request still in flight
        return Round(number=number, started_at=started, finished_at=utc_now(), outcome=RoundOutcome.CUT_SHORT,
                     notes=("stopped (SIGTERM/SIGINT) with a request in flight; it was abandoned",),
                     deployment=self.settings.deployment)


def run_watchers(watchers: Sequence[Watcher], stop: threading.Event, emit: Callable[[Round], None], *,
                 interval_s: float, max_rounds: int | None = None) -> list[Round]:
    """Every `interval_s` (after a throttled round: at least its Retry-After), one round of each
    watcher, one deployment after another, until `stop` is set or each ran `max_rounds`. Returns
    the last round of each watcher that ran one."""
    last: dict[int, Round] = {}
    while not stop.is_set() and (max_rounds is None or any(w.rounds < max_rounds for w in watchers)):
        wait = interval_s
        for i, watcher in enumerate(watchers):
            if stop.is_set():
                break
            if max_rounds is not None and watcher.rounds >= max_rounds:
                continue
            last[i] = watcher.timed_round(stop)
            emit(last[i])
            wait = max(wait, last[i].retry_after_s or 0.0)
        if stop.is_set() or (max_rounds is not None and all(w.rounds >= max_rounds for w in watchers)):
            break
        stop.wait(wait)
    return [last[i] for i in sorted(last)]


def watchers_for(targets: Sequence[Watched], *, budget: BudgetPlan, baseline: Baseline | None, canaries: bool,
                 progress: Callable[[str], None]) -> list[Watcher]:
    """One watcher per deployment, sharing one hourly spend (one --max-tokens-per-hour over all).
    A read-only deployment (an inventory's capacity_only) sends nothing: no canaries, no full round."""
    spend = HourlySpend() if len(targets) > 1 else None
    out = []
    for target in targets:
        sends = canaries and not target.read_only
        if target.read_only and canaries:
            progress(f"{target.name}: capacity_only in the inventory: read only, no canaries and no full rounds")
        settings = WatchSettings(plan=target.plan, budget=budget, baseline=baseline, canaries=sends, deployment=target.name,
                                 full_every_s=budget.full_every_s if sends else None)
        out.append(Watcher(settings, progress=progress, spend=spend))
    return out


def stated_budget(budget: BudgetPlan, watchers: Sequence[Watcher]) -> BudgetPlan:
    """The budget to state at start for these watchers (those that send): how many deployments,
    and with --full-every what one full round of each submits, read from the engines now."""
    out = replace(budget, deployments=max(1, len(watchers)))
    if budget.full_every_s is None:
        return out
    sizes = [w.full_round_tokens() for w in watchers]
    known = [tokens for tokens, _ in sizes]
    return replace(out, full_round_tokens=None if None in known else sum(t for t in known if t is not None),
                   full_entries=sum(entries for _, entries in sizes))


def exit_code(rounds: Sequence[Round]) -> int:
    """`check`'s exit code over each deployment's last round: 1 a finding, 3 not all measured, 0 clean."""
    from kvpreflight.model import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK

    codes = [r.exit_code for r in rounds]
    if not codes:
        return EXIT_INCONCLUSIVE
    return EXIT_FAIL if EXIT_FAIL in codes else (EXIT_INCONCLUSIVE if EXIT_INCONCLUSIVE in codes else EXIT_OK)
