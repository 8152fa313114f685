"""`kvpreflight watch` on fake engines (tests/support/fake_adapter.py): drift against a signed
record with both values, hazard counters' and danger lines' deltas between rounds, the two
tenants' canaries (fresh, streamed and not, marked synthetic, small), the budget, HTTP 429 with
Retry-After, an unreachable engine, the Prometheus series and textfile, SIGTERM, no secret out."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.cli import invoke
from support.fake_adapter import FakeAdapter, FakeEngine, snapshot

from kvpreflight._internal.engines.interface import retry_after
from kvpreflight._internal.watch.budget import BudgetPlan, HourlySpend
from kvpreflight._internal.watch.canaries import SYNTHETIC_HEADER
from kvpreflight._internal.watch.drift import Baseline, drift_findings
from kvpreflight._internal.watch.findings import FindingKind, RoundOutcome
from kvpreflight._internal.watch.loop import Watcher, WatchSettings
from kvpreflight._internal.watch.metrics import WatchMetrics
from kvpreflight._internal.watch.service import ServiceOutputs, parse_listen, run_service
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import Completion, Role
from kvpreflight.targets import Target

URL = "http://engine:1"
SUBJECT = "image=sha256:" + "ab" * 32


def rounds(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def watcher(*, urls=(URL,), entry=None, baseline=None, cap=None, logs=None, canaries=True) -> Watcher:
    plan = CheckPlan(targets=tuple(Target(u) for u in urls), entry=entry, engine="fake", timeout_s=5, logs=logs or {})
    return Watcher(WatchSettings(plan=plan, budget=BudgetPlan(interval_s=1, max_tokens_per_hour=cap),
                                 baseline=baseline, canaries=canaries))


def kinds(round_) -> set[tuple[str, str]]:
    return {(f.kind.value, f.what) for f in round_.findings}


# -- drift -------------------------------------------------------------------------------------

def test_drift_names_each_difference_with_both_values():
    recorded = snapshot(URL, pool=8192, context=4096, settings={"max_total_tokens": 8192})
    gone = snapshot("http://gone:2", role=Role.DECODE)
    baseline = Baseline(source="rec.json", keyid="k", time="t", engines={URL: recorded, "http://gone:2": gone})
    now = [replace(snapshot(URL, pool=4096, context=8192, settings={"max_total_tokens": 4096}), version="2"),
           snapshot("http://new:3", role=Role.DECODE)]
    found = {(f.what, f.endpoint): f for f in drift_findings(baseline, now)}
    assert (found["smaller-pool", URL].recorded, found["smaller-pool", URL].found) == (8192, 4096)
    assert (found["larger-context", URL].recorded, found["larger-context", URL].found) == (4096, 8192)
    assert (found["version", URL].recorded, found["version", URL].found) == ("1", "2")
    assert "changed: max_total_tokens" in found["settings", URL].message
    assert found["unrecorded-engine", "http://new:3"].found == "decode"
    assert found["engine-gone", "http://gone:2"].recorded == "decode"
    assert all(f.kind is FindingKind.DRIFT for f in found.values())
    # the same engines as recorded: nothing, and a larger pool or a smaller context is no drift
    assert drift_findings(baseline, [recorded, gone]) == []
    assert drift_findings(baseline, [snapshot(URL, pool=16384, context=2048, settings={"max_total_tokens": 8192}), gone]) == []


@pytest.fixture
def signed_record(tmp_path: Path) -> tuple[Path, Path]:
    """A record `check --capacity-only` signed of the fake engine as it is now (pool 8192)."""
    FakeEngine(snapshot(URL, pool=8192, context=4096))
    invoke("keygen", "--out", tmp_path / "keys", check_ok=True)
    record = tmp_path / "rec.dsse.json"
    invoke("check", "--endpoint", URL, "--engine", "fake", "--capacity-only", "--record", record,
           "--sign-key", tmp_path / "keys" / "kvpreflight.key", "--subject", SUBJECT, "--format", "json", check_ok=True)
    return record, tmp_path / "keys" / "kvpreflight.pub"


def test_once_against_the_signed_record_passes_then_finds_a_smaller_pool(signed_record, fake_engines):
    record, public = signed_record
    clean = invoke("watch", "--endpoint", URL, "--engine", "fake", "--once", "--record", record, "--key", public)
    assert clean.returncode == 0, clean.stderr
    assert rounds(clean)[0]["outcome"] == "clean" and "drift against" in clean.stderr
    fake_engines[URL].snap = replace(snapshot(URL, pool=4096, context=4096), version="2")  # restarted smaller, upgraded
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", "--once", "--record", record, "--key", public)
    assert proc.returncode == 1, proc.stderr
    (line,) = rounds(proc)
    found = {f["what"]: f for f in line["findings"]}
    assert (found["smaller-pool"]["recorded"], found["smaller-pool"]["found"]) == (8192, 4096)
    assert (found["version"]["recorded"], found["version"]["found"]) == ("1", "2")
    assert line["outcome"] == "findings" and line["exit_code"] == 1


def test_a_record_signed_by_another_key_is_refused_before_any_round(signed_record, tmp_path):
    record, _ = signed_record
    invoke("keygen", "--out", tmp_path / "other", check_ok=True)
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", "--once", "--record", record,
                  "--key", tmp_path / "other" / "kvpreflight.pub")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "not by the --key" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("args", "says"), [
    (("--record", "r.json"), "--record FILE and --key PUB go together"),
    (("--interval", "0"), "--interval"),
    (("--once", "--rounds", "2"), "--once is --rounds 1"),
    (("--listen", "nowhere"), "--listen"),
    (("--max-tokens-per-hour", "-5"), "--max-tokens-per-hour"),
])
def test_usage_errors_exit_2_in_one_line(args, says):
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", *args)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_worker_the_router_lists_that_the_record_does_not_name_is_drift(fake_engines):
    """vllm-router 0.1.17's GET /workers (tests/unit/test_roles.py) lists a decode the record does
    not name (an autoscaler added it) with a smaller pool: drift naming it, its role and both pools;
    the recorded two are clean."""
    from static_server import static_server

    prefill = FakeEngine(snapshot("http://p:1", role=Role.PREFILL)).snap
    decode = FakeEngine(snapshot("http://d:2", role=Role.DECODE)).snap
    FakeEngine(snapshot("http://d:3", role=Role.DECODE, pool=1024))
    worker = {"model_id": "unknown", "worker_type": "decode", "is_healthy": True, "load": 0}
    listed = {"workers": [{**worker, "url": "http://p:1", "worker_type": "prefill"}, {**worker, "url": "http://d:2"},
                          {**worker, "url": "http://d:3"}]}
    routes = {"GET /workers": (200, "application/json", listed),
              "GET /list_workers": (200, "application/json", {"urls": ["http://p:1", "http://d:2", "http://d:3"]})}
    baseline = Baseline(source="rec.json", keyid="k", time="t", engines={"http://p:1": prefill, "http://d:2": decode})
    with static_server(routes) as router:
        r = watcher(urls=(), entry=router, baseline=baseline, canaries=False).round()
    found = {(f.what, f.endpoint): f for f in r.findings}
    assert set(found) == {("unrecorded-engine", "http://d:3"), ("smaller-pool", "http://d:3")}, r.findings
    assert found["unrecorded-engine", "http://d:3"].found == "decode"
    # its pool is smaller than every decode pool the record verified: the context was proved against those
    assert (found["smaller-pool", "http://d:3"].recorded, found["smaller-pool", "http://d:3"].found) == (4096, 1024)
    assert set(r.engines) == {"http://p:1", "http://d:2", "http://d:3"} and r.requests == 0


# -- hazards -----------------------------------------------------------------------------------

def test_danger_counters_are_findings_only_for_their_delta_since_the_last_round(fake_engines):
    engine = FakeEngine(snapshot(URL))
    engine.counters = replace(engine.counters, transfer_failures=5, stale_kv_reads=2, aborted_requests=1)
    w = watcher()
    assert w.round().findings == ()  # the first round sets the baseline: old failures are not news
    engine.counters = replace(engine.counters, transfer_failures=7, stale_kv_reads=2, aborted_requests=4)
    second = w.round()
    assert kinds(second) == {("hazard", "transfer-failures")}
    (f,) = second.findings
    assert f.found == 2 and "2 failed KV transfers since the last round" in f.message
    assert any("3 aborted requests" in n for n in second.notes)  # said, not a finding
    assert w.round().findings == ()  # nothing moved since
    engine.counters = replace(engine.counters, transfer_failures=0)  # restarted: counters start again
    assert w.round().findings == ()


def test_what_moved_while_the_metrics_were_unreadable_is_counted_when_they_answer_again(fake_engines, monkeypatch):
    from kvpreflight._internal.engines.errors import EngineError

    engine = FakeEngine(snapshot(URL))
    engine.counters = replace(engine.counters, stale_kv_reads=0)
    w = watcher(canaries=False)
    assert w.round().findings == ()
    original = FakeAdapter.counters

    def unreadable(self):
        raise EngineError("metrics unreadable")

    monkeypatch.setattr(FakeAdapter, "counters", unreadable)
    engine.counters = replace(engine.counters, stale_kv_reads=3)
    blind = w.round()
    assert blind.findings == () and blind.outcome is RoundOutcome.NOT_MEASURED and blind.exit_code == 3
    assert blind.not_measured == (f"hazards: {URL}'s counters could not be read",)
    monkeypatch.setattr(FakeAdapter, "counters", original)
    (found,) = w.round().findings
    assert (found.what, found.found) == ("stale-kv-reads", 3)


def test_a_danger_line_the_log_gains_between_rounds_is_a_finding(fake_engines, tmp_path):
    FakeEngine(snapshot(URL))
    log = tmp_path / "engine.log"
    log.write_text("Decode transfer failed for request rid=old-1\n")  # before the watch: not news
    w = watcher(logs={URL: log})
    assert w.round().findings == ()
    with log.open("a") as f:
        f.write("INFO all fine\nDecode transfer failed for request rid=req-42\n")
    (finding,) = w.round().findings
    assert finding.kind is FindingKind.HAZARD and "req-42" in finding.message and finding.endpoint == URL
    assert w.round().findings == ()


# -- canaries ----------------------------------------------------------------------------------

def test_canaries_are_fresh_small_streamed_and_not_and_marked_synthetic(fake_engines, monkeypatch):
    engine = FakeEngine(snapshot(URL, pool=16384, context=8192))
    headers: list[dict] = []
    original = FakeAdapter.complete

    def spying(self, ids, **kwargs):
        headers.append(dict(self.client.session.headers))
        return original(self, ids, **kwargs)

    monkeypatch.setattr(FakeAdapter, "complete", spying)
    w = watcher()
    first, second = w.round(), w.round()
    assert first.outcome is RoundOutcome.CLEAN and first.requests == 4 and second.outcome is RoundOutcome.CLEAN
    sent = engine.sent
    assert len(sent) == 8 and {s.stream for s in sent} == {True, False}
    assert all(s.tokens <= 8192 * 0.05 and s.tokens + s.max_tokens <= 8192 * 0.1 for s in sent)
    assert {s.extra["user"] for s in sent} == {"kvpreflight-watch-synthetic-a", "kvpreflight-watch-synthetic-b"}
    assert all(h[SYNTHETIC_HEADER] == "watch" for h in headers)
    seeds = [s.seed for s in sent]
    assert len(set(seeds[:4])) == 2 and not set(seeds[:4]) & set(seeds[4:])  # two tenants, new canaries next round
    assert first.prompt_tokens == sum(s.tokens for s in sent[:4])


def test_an_answer_holding_the_other_tenants_canary_is_a_finding_quoting_only_markers(fake_engines):
    last: dict[str, str] = {}

    def leaks(engine, sent):
        other = next((seed for salt, seed in last.items() if salt != sent.extra.get("cache_salt")), "")
        last[sent.extra.get("cache_salt")] = sent.seed
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                          elapsed_s=0.001, completion_tokens=sent.max_tokens, text=f"private text {other}")

    FakeEngine(snapshot(URL), script=leaks)
    r = watcher().round()
    crossings = [f for f in r.findings if f.what == "crossing"]
    assert len(crossings) == 3 and r.outcome is RoundOutcome.FINDINGS  # every request after the first
    assert all("private text" not in f.message and "KVPF-TENANT" in f.message for f in crossings)


def test_a_model_that_does_not_echo_makes_the_canaries_not_measured_never_clean(fake_engines):
    """Fail closed, as tenant-isolation does: an answer that does not repeat the tenant's own canary
    could not have shown the other tenant's either, so the round is not measured (exit 3)."""
    def fluent(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                          elapsed_s=0.001, completion_tokens=sent.max_tokens, text="a fluent answer about something else")

    FakeEngine(snapshot(URL), script=fluent)
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", "--once")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    (line,) = rounds(proc)
    assert line["outcome"] == "not-measured" and line["findings"] == []
    (said,) = line["not_measured"]
    assert "tenant A or B repeated its own canary" in said and "proves nothing" in said


def test_a_failed_canary_request_is_a_finding_and_no_secret_reaches_the_output(fake_engines):
    key = "sk-watch-secret-0123456789abcdef"

    def refuses(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=500,
                          elapsed_s=0.001, error_message=f"KV transfer failed (auth Bearer {key})")

    FakeEngine(snapshot(URL), script=refuses)
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", "--once", "--api-key-env", "WATCH_KEY",
                  env={"WATCH_KEY": key})
    assert proc.returncode == 1
    (line,) = rounds(proc)
    assert {f["what"] for f in line["findings"]} == {"request-failed"} and len(line["findings"]) == 4
    assert key not in proc.stdout + proc.stderr


# -- budget, throttling, unreachable -----------------------------------------------------------

def test_a_round_over_the_hourly_cap_sends_nothing_and_says_so(fake_engines):
    engine = FakeEngine(snapshot(URL))
    proc = invoke("watch", "--endpoint", URL, "--engine", "fake", "--rounds", "2", "--interval", "0.05",
                  "--listen", "off", "--max-tokens-per-hour", "700")
    first, second = rounds(proc)
    assert first["outcome"] == "clean" and first["prompt_tokens"] <= 700
    assert second["outcome"] == "skipped" and second["requests"] == 0
    assert "would pass --max-tokens-per-hour 700" in second["notes"][0]
    assert len(engine.sent) == first["requests"] and proc.returncode == 3  # a skipped round measured nothing
    assert "capped at 700 prompt tokens per hour" in proc.stderr and "requests and" in proc.stderr


def test_hourly_spend_forgets_what_is_older_than_an_hour():
    now = [0.0]
    spend = HourlySpend(clock=lambda: now[0])
    spend.add(4, 600)
    now[0] = 1800
    spend.add(4, 600)
    assert spend.last_hour() == (8, 1200) and not spend.allows(1, 1200) and spend.allows(1, None)
    now[0] = 3661
    assert spend.last_hour() == (4, 600)
    assert BudgetPlan(interval_s=60).requests_per_hour == 240


def test_http_429_is_a_throttled_round_that_waits_its_retry_after(fake_engines):
    def throttles(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=429,
                          elapsed_s=0.001, error_message="rate limited", retry_after_s=7.0)

    engine = FakeEngine(snapshot(URL), script=throttles)
    waits: list[float] = []

    class Stop(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return False

    emitted = []
    last = watcher().run(Stop(), emitted.append, interval_s=1, max_rounds=2)
    assert [r.outcome for r in emitted] == [RoundOutcome.THROTTLED] * 2 and last.exit_code == 3
    assert len(engine.sent) == 2 and waits == [7.0]  # one request per round, then the Retry-After
    assert "HTTP 429" in emitted[0].notes[0] and emitted[0].findings == ()
    assert retry_after("120") == 120 and retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None
    assert retry_after("999999") == 3600


def test_an_unreachable_engine_is_a_finding_and_the_next_round_tries_again():
    w = Watcher(WatchSettings(plan=CheckPlan(targets=(Target("http://127.0.0.1:9"),), engine="vllm", timeout_s=2),
                              budget=BudgetPlan(interval_s=1)))
    first, second = w.round(), w.round()
    for r in (first, second):
        assert [(f.kind, f.endpoint) for f in r.findings] == [(FindingKind.UNREACHABLE, "http://127.0.0.1:9")]
        # not measured, as `check` says of an engine it cannot read (the README's `--once` exit codes)
        assert r.exit_code == 3 and r.to_dict()["exit_code"] == 3
    assert second.number == 2


# -- output and service ------------------------------------------------------------------------

def test_metrics_parse_with_prometheus_client_and_the_textfile_is_written(fake_engines, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    engine = FakeEngine(snapshot(URL))
    engine.counters = replace(engine.counters, transfer_failures=0)
    w = watcher()
    metrics = WatchMetrics("prod-eu-1")
    metrics.record(w.round())
    engine.counters = replace(engine.counters, transfer_failures=3)
    metrics.record(w.round())
    path = metrics.write_textfile(tmp_path)
    assert path.name == "kvpreflight-watch-prod-eu-1.prom"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(path.read_text()) for s in family.samples}
    d = ("deployment", "prod-eu-1")
    assert samples["kvpreflight_watch_last_round_findings", (d, ("kind", "hazard"))] == 1
    assert samples["kvpreflight_watch_findings_total", (d, ("kind", "hazard"))] == 1
    assert samples["kvpreflight_watch_rounds_total", (d, ("outcome", "clean"))] == 1
    assert samples["kvpreflight_watch_last_round_outcome", (d, ("outcome", "findings"))] == 1
    assert samples["kvpreflight_watch_finding", (d, ("endpoint", URL), ("kind", "hazard"), ("what", "transfer-failures"))] == 1
    assert samples["kvpreflight_watch_requests_total", (d,)] == 8


def test_sigterm_stops_the_loop_within_seconds_even_with_a_request_in_flight(fake_engines):
    release = threading.Event()

    def hangs(engine, sent):
        release.wait(30)
        return None

    FakeEngine(snapshot(URL), script=hangs)
    lines: list[str] = []
    outputs = ServiceOutputs(write_line=lines.append, progress=lambda _: None, scrub=str, metrics=WatchMetrics("d"))
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    try:
        (last,) = run_service([watcher()], outputs, interval_s=60)
    finally:
        release.set()
        stopped = time.monotonic() - started
        for worker in [t for t in threading.enumerate() if t.name == "kvpreflight-watch-round"]:
            worker.join(5)  # the abandoned round ends before the fixture removes its engine
    assert stopped < 10
    assert last is not None and last.outcome is RoundOutcome.CUT_SHORT
    assert json.loads(lines[-1])["outcome"] == "cut-short"
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_listen_takes_host_port_or_off():
    assert parse_listen("127.0.0.1:0") is not None and parse_listen("off") is None
    assert parse_listen("[::1]:9478").host == "::1"


# -- the builtin engine's run-time fault switch --------------------------------------------------

class _Handler:
    """What admin.set_faults reads of the engine's HTTP handler."""

    def __init__(self, host: str) -> None:
        from types import SimpleNamespace

        from kvpreflight._internal.builtin_engine.config import EngineConfig
        from kvpreflight.model import ProcessRole

        self.server = SimpleNamespace(server_address=(host, 1))
        self.engine = SimpleNamespace(faults=frozenset(), config=EngineConfig(role=ProcessRole.PREFILL, host=host, port=1))
        self.replies: list[tuple[int, object]] = []

    def reply_json(self, status: int, obj: object) -> None:
        self.replies.append((status, obj))


def test_the_fault_switch_is_refused_unless_the_engine_listens_on_loopback():
    from kvpreflight._internal.builtin_engine.admin import set_faults
    from kvpreflight._internal.builtin_engine.config import Fault

    public = _Handler("0.0.0.0")
    set_faults(public, {"faults": ["leak-streamed"]})
    assert public.replies[0][0] == 403 and public.engine.faults == frozenset()
    local = _Handler("127.0.0.1")
    set_faults(local, {"faults": ["leak-streamed"], "transfer_fail_every": 1})
    assert local.replies[-1][0] == 200 and local.engine.faults == {Fault.LEAK_STREAMED}
    assert local.engine.config.transfer_fail_every == 1
    set_faults(local, {"faults": ["no-such-fault"]})
    assert local.replies[-1][0] == 400 and local.engine.faults == {Fault.LEAK_STREAMED}
    set_faults(local, {})
    assert local.engine.faults == frozenset() and local.engine.config.transfer_fail_every == 0


def test_an_engines_429_over_http_carries_its_retry_after():
    """The adapter keeps a 429's Retry-After (vLLM's /v1/completions shape, in-process HTTP)."""
    from static_server import static_server

    from kvpreflight._internal.engines.http import HttpClient
    from kvpreflight._internal.engines.vllm import VllmAdapter

    routes = {"POST /v1/completions": (429, "application/json", {"error": {"message": "too many requests"}},
                                       {"Retry-After": "12"})}
    with static_server(routes) as url:
        client = HttpClient(timeout_s=5)
        try:
            done = VllmAdapter(url, client, model="m").complete([1, 2, 3], max_tokens=1, stream=False, timeout_s=5)
        finally:
            client.close()
    assert (done.status, done.retry_after_s) == (429, 12.0)


def test_an_entry_that_cannot_be_asked_for_its_limits_is_a_finding_not_a_lost_round(fake_engines, monkeypatch):
    """The canaries are sized from the entry's limits; an entry that cannot be asked is unreachable
    this round (a finding naming why), never a round that looks stopped by a signal."""
    from kvpreflight._internal.engines.errors import EngineError

    FakeEngine(snapshot(URL))

    def gone(self, snapshot):
        raise EngineError("GET /tokenize: connection refused")

    monkeypatch.setattr(FakeAdapter, "max_accepted_prompt", gone)
    line = watcher().timed_round(threading.Event())
    assert line.outcome is RoundOutcome.FINDINGS and kinds(line) == {("unreachable", "entry")}, line
    (finding,) = line.findings
    assert "connection refused" in finding.message and URL in finding.message and not line.notes
