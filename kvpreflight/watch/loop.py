"""The watcher: one round (drift + hazards + canaries within the budget), and the loop that runs
a round every interval until told to stop. A round never raises for what an engine does: an
unreachable engine is a finding and the next round tries again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvpreflight.check_plan import CheckPlan
from kvpreflight.clock import utc_now
from kvpreflight.engines import EngineError, HttpClient
from kvpreflight.engines.interface import EngineAdapter, LogSignal
from kvpreflight.errors import ConfigError
from kvpreflight.model import EngineSnapshot, Status
from kvpreflight.probes.capacity import deployment_limits
from kvpreflight.probes.engine_state import EngineState
from kvpreflight.routers import RouterListing, router_class
from kvpreflight.watch.budget import BudgetPlan, HourlySpend
from kvpreflight.watch.canaries import MAX_PROMPT_TOKENS, REQUESTS_PER_ROUND, CanarySettings, canary_round
from kvpreflight.watch.drift import Baseline, drift_findings
from kvpreflight.watch.findings import Finding, FindingKind, Round, RoundOutcome
from kvpreflight.watch.hazards import HazardWatch

STOP_GRACE_S = 2.0  # after SIGTERM, how long a round in flight may take to end (the stop is well inside 10 s)


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    plan: CheckPlan  # targets, entry, engine, auth, logs, timeout: as `check --capacity-only` reads them
    budget: BudgetPlan
    baseline: Baseline | None = None
    canaries: bool = True


class Watcher:
    """Keeps what must survive between rounds: the counters, the logs' offsets, the spending."""

    def __init__(self, settings: WatchSettings, *, progress: Callable[[str], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.progress = progress
        self.hazards = HazardWatch(settings.plan.logs)
        self.spend = HourlySpend(clock)
        self.rounds = 0
        self._last_prompt_tokens = MAX_PROMPT_TOKENS  # the next round's canary size, for the budget

    # -- one round -----------------------------------------------------------------------------
    def round(self, stop: threading.Event | None = None) -> Round:
        from kvpreflight.pipeline import client_of

        stop = stop or threading.Event()
        self.rounds += 1
        started = utc_now()
        plan = self.settings.plan
        findings: list[Finding] = []
        not_measured: list[str] = []
        notes: list[str] = []
        client = client_of(plan)
        sent = {"requests": 0, "tokens": 0}
        retry_after: float | None = None
        outcome: RoundOutcome | None = None
        try:
            read = self._read(client)
            adapters: Mapping[str, EngineAdapter] = {}
            snapshots: list[EngineSnapshot] = []
            if isinstance(read, Finding):
                findings.append(read)
            else:
                adapters, snapshots, unreadable, listing = read
                findings.extend(unreadable)
                if self.settings.baseline is not None:
                    findings.extend(drift_findings(self.settings.baseline, snapshots,
                                                   unreadable=[f.endpoint for f in unreadable]))
                self.hazards.follow_logs(_log_signals(adapters, listing))
            if self.settings.canaries and snapshots:
                planned = REQUESTS_PER_ROUND * self._last_prompt_tokens * len(_groups(plan, snapshots))
                if not self.spend.allows(planned, self.settings.budget.max_tokens_per_hour):
                    used = self.spend.last_hour()[1]
                    notes.append(f"canaries skipped: {planned:,} more prompt tokens would pass --max-tokens-per-hour "
                                 f"{self.settings.budget.max_tokens_per_hour:,} ({used:,} sent in the last hour)")
                    outcome = RoundOutcome.SKIPPED
                else:
                    result = self._canaries(plan, client, adapters, snapshots, stop, sent)
                    findings.extend(result[0])
                    not_measured.extend(result[1])
                    if result[2]:
                        outcome = RoundOutcome.CUT_SHORT
                    elif result[3]:
                        retry_after = result[4]
                        wait = f"; the next round waits {retry_after:g} s (Retry-After)" if retry_after else ""
                        notes.append(f"throttled: the entry answered HTTP 429, canaries stopped for this round{wait}")
                        outcome = RoundOutcome.THROTTLED
            elif self.settings.canaries and not findings:
                not_measured.append("canaries: no engine could be read")
            if adapters:  # after the canaries: what this round's own requests met counts in this round
                counters = EngineState(adapters).counters()
                hazards, hazard_notes, _ = self.hazards.take(counters)
                not_measured.extend(f"hazards: {url}'s counters could not be read" for url, c in counters.items() if c is None)
                findings.extend(hazards)
                notes.extend(hazard_notes)
        finally:
            client.close()
            self.spend.add(sent["requests"], sent["tokens"])
        if stop.is_set():
            outcome = RoundOutcome.CUT_SHORT
        if outcome is None:
            outcome = RoundOutcome.FINDINGS if findings else (RoundOutcome.NOT_MEASURED if not_measured else RoundOutcome.CLEAN)
        return Round(number=self.rounds, started_at=started, finished_at=utc_now(), outcome=outcome,
                     findings=tuple(findings), not_measured=tuple(not_measured), notes=tuple(notes),
                     requests=sent["requests"], prompt_tokens=sent["tokens"], retry_after_s=retry_after,
                     engines=tuple(s.url for s in snapshots))

    def _read(self, client: HttpClient) -> Finding | tuple[dict[str, EngineAdapter], list[EngineSnapshot], list[Finding],
                                                       RouterListing | None]:
        from kvpreflight.pipeline import read_engines

        plan = self.settings.plan
        where = plan.entry or ", ".join(t.url for t in plan.targets)
        try:
            adapters, snapshots, unreadable, listing = read_engines(plan, client, lambda _: None)
        except (EngineError, ConfigError) as exc:  # the router's worker list is unreadable this round
            return Finding(kind=FindingKind.UNREACHABLE, what="entry", endpoint=where,
                           message=f"{where}: the engines behind it could not be read this round (down, or not a router): {exc}")
        lost = [Finding(kind=FindingKind.UNREACHABLE, what="engine", endpoint=r.endpoint or where, message=r.message)
                for r in unreadable if r.status is Status.INCONCLUSIVE]
        return adapters, snapshots, lost, listing

    def _canaries(self, plan: CheckPlan, client: HttpClient, adapters: Mapping[str, EngineAdapter],
                  snapshots: Sequence[EngineSnapshot], stop: threading.Event, sent: dict[str, int]
                  ) -> tuple[list[Finding], list[str], bool, bool, float | None]:
        from kvpreflight.pipeline import entry_adapter

        findings: list[Finding] = []
        missing: list[str] = []
        settings = CanarySettings(timeout_s=plan.timeout_s, base_headers=plan.auth.headers, tenant_headers=plan.auth.tenant_headers,
                                  salted=plan.auth.tenant_binding is None, ca_bundle=plan.auth.ca_bundle,
                                  client_cert=plan.auth.client_cert, client_key=plan.auth.client_key)
        for entry_url, group in _groups(plan, snapshots):
            entry = entry_adapter(plan, entry_url, group, client)
            if entry is None:
                missing.append("canaries: a prefill/decode deployment is probed through its router; pass --entry URL")
                continue
            limits = deployment_limits(entry, group)
            if limits is None:
                missing.append(f"canaries: {entry_url} states no served context or request limit")
                continue

            def count(tokens: int) -> None:
                sent["requests"] += 1
                sent["tokens"] += tokens
                self._last_prompt_tokens = tokens

            engines = [adapters[s.url] for s in group if s.url in adapters]
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
        """A round every `interval_s` (after a throttled round: at least its Retry-After) until
        `stop` is set or `max_rounds` ran. Each round runs in a worker thread, so a stop is obeyed
        within STOP_GRACE_S even while a request is in flight: the round is then recorded as cut
        short and the worker (a daemon) is left to end with the process. Returns the last round."""
        last: Round | None = None
        while not stop.is_set() and (max_rounds is None or self.rounds < max_rounds):
            box: list[Round] = []
            number, started = self.rounds + 1, utc_now()
            worker = threading.Thread(target=self._round_into, args=(box, stop), name="kvpreflight-watch-round", daemon=True)
            worker.start()
            while worker.is_alive() and not stop.is_set():
                worker.join(0.1)
            worker.join(STOP_GRACE_S if stop.is_set() else None)
            if box:
                last = box[0]
            else:  # stopped with a request still in flight
                self.rounds = number
                last = Round(number=number, started_at=started, finished_at=utc_now(), outcome=RoundOutcome.CUT_SHORT,
                             notes=("stopped (SIGTERM/SIGINT) with a request in flight; it was abandoned",))
            emit(last)
            if stop.is_set() or (max_rounds is not None and self.rounds >= max_rounds):
                break
            stop.wait(max(interval_s, last.retry_after_s or 0.0))
        return last


def _groups(plan: CheckPlan, snapshots: Sequence[EngineSnapshot]) -> list[tuple[str | None, list[EngineSnapshot]]]:
    from kvpreflight.pipeline import probe_groups

    return probe_groups(plan, snapshots)


def _log_signals(adapters: Mapping[str, EngineAdapter], listing: RouterListing | None) -> dict[str, Sequence[LogSignal]]:
    signals: dict[str, Sequence[LogSignal]] = {url: a.log_signals for url, a in adapters.items()}
    if listing is not None:
        signals[listing.url] = router_class(listing.router).log_signals
    return signals

