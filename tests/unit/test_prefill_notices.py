"""A prefill that reads its decodes' transfer notifications only when it steps (vLLM's NIXL
prefill: its "Potentially invalid KV blocks ..." line and its notifications-after-expiry counter
come when it next serves a request) would keep a late read on the check's last request to itself
until after the check: a false pass. The isolation probes end with one tiny plain request straight
to such a prefill, before their last read of the logs, and count it in the plan."""

from __future__ import annotations

from pathlib import Path

from support.fake_adapter import FakeAdapter, FakeEngine, FakeSplitLegsAdapter, Sent, snapshot

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.vllm import VllmAdapter
from kvpreflight._internal.probes.budget import TINY_TOKENS, Budget
from kvpreflight._internal.probes.isolation import IsolationSettings, run_isolation
from kvpreflight._internal.probes.isolation_sizes import IsolationSizes
from kvpreflight._internal.probes.logs import LogWatch
from kvpreflight._internal.probes.results import IsolationRun, Limits, ScenarioName
from kvpreflight._internal.probes.scenarios import NOTICES_CONDITION, NOTICES_REQUEST, declared, isolation_sizes
from kvpreflight._internal.probes.session import Connection, ProbeSession
from kvpreflight.model import Completion, Role

ROUTER, PREFILL, DECODE = "http://router:1", "http://prefill:1", "http://decode:1"
LIMITS = Limits(served_context=1024, pool_tokens=2304, max_accepted=1023)


class NoticingAdapter(FakeSplitLegsAdapter):
    notices_late_reads_when_stepping = True


class SteppingPrefill:
    """Each request the prefill serves makes it notice the decode's late read of the previous one:
    its line names that request, as vLLM's does."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.pending: str | None = None
        self.direct: list[Sent] = []

    def __call__(self, engine: FakeEngine, sent: Sent) -> Completion | None:
        if self.pending:
            with self.log.open("a") as fh:
                fh.write(f"(Worker pid=1) ERROR 12-03 15:29:27 [pull_worker.py:667] Potentially invalid KV blocks for "
                         f"unrecognized request cmpl-{self.pending}-0-8b182869 were retrieved by a decode worker. "
                         "They may have expired.\n")
            self.pending = None
        if sent.url == PREFILL:
            self.direct.append(sent)
        else:
            self.pending = sent.request_id
        return None


def run(tmp_path: Path, adapter: type[FakeAdapter]) -> tuple[IsolationRun, SteppingPrefill]:
    log = tmp_path / "prefill.log"
    log.write_text("started\n")
    stepping = SteppingPrefill(log)
    prefill = FakeEngine(snapshot(PREFILL, pool=2304, context=1024, role=Role.PREFILL, page_size=128), script=stepping)
    decode = FakeEngine(snapshot(DECODE, pool=2304, context=1024, role=Role.DECODE, page_size=128))
    FakeEngine(snapshot(ROUTER, pool=None, context=1024), forwards_to=(prefill, decode))
    client = HttpClient()
    snaps = (prefill.snap, decode.snap)
    engines = {e.snap.url: adapter(e.snap.url, client) for e in (prefill, decode)}
    only = [s for s in declared(IsolationSizes.of(LIMITS, snaps)) if s.name == ScenarioName.NORMAL]
    session = ProbeSession(entry=FakeAdapter(ROUTER, client), engines=engines, snapshots=snaps, limits=LIMITS,
                           budget=Budget(timeout_s=5, fallback_tokens_per_second=20000), connection=Connection(timeout_s=5),
                           logs=LogWatch({PREFILL: (log, VllmAdapter.log_signals)}))
    return run_isolation(session, IsolationSettings(churn_allowed=True), scenarios=only), stepping


def test_the_late_read_on_the_last_request_shows_because_the_prefill_is_asked_once_more(tmp_path: Path) -> None:
    iso, stepping = run(tmp_path, NoticingAdapter)
    (notice,) = stepping.direct  # straight to the prefill: tiny, plain, no transfer asked for
    assert notice.tokens == TINY_TOKENS and notice.max_tokens == 1 and "kv_transfer_params" not in notice.extra
    last = [line for line in iso.untied_danger_lines if "kvpreflight" in (line.request_id or "")]
    assert last, iso.untied_danger_lines  # the last probe's late read, noticed only at the extra request
    assert all(line.source == PREFILL for line in last)


def test_a_prefill_that_notices_without_stepping_is_sent_nothing_extra(tmp_path: Path) -> None:
    iso, stepping = run(tmp_path, FakeSplitLegsAdapter)
    assert stepping.direct == []
    # the same engine's last late read then stays unseen: what the extra request is for
    seen = {line.request_id for line in iso.untied_danger_lines}
    assert stepping.pending is not None and stepping.pending not in seen


def test_the_plan_counts_it_with_its_condition() -> None:
    sizes = IsolationSizes.of(LIMITS, (snapshot(PREFILL, pool=2304, context=1024, role=Role.PREFILL),))
    (planned,) = [p for p in isolation_sizes(sizes, churn=True) if p.name == NOTICES_REQUEST]
    assert (planned.prompt_tokens, planned.max_tokens, planned.only_if) == (TINY_TOKENS, 1, NOTICES_CONDITION)
