"""The capacity prober on a fake engine: the exact prompt sizes it derives from a pool and a
context, the order it sends them in, and how each answer is attributed."""

from __future__ import annotations

from support.fake_adapter import FakeAdapter, FakeEngine, Sent, snapshot

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.capacity import CapacityProber, ProbeSettings, deployment_limits
from kvpreflight._internal.probes.results import Expect, Limits, ProbeName, transfer_moved
from kvpreflight._internal.probes.session import ProbeSession
from kvpreflight.model import Completion, Role, Status

URL = "http://engine:1"


def probe(engine: FakeEngine, *, concurrency: int = 2):
    adapter = FakeAdapter(engine.snap.url, HttpClient())
    settings = ProbeSettings(concurrency=concurrency)
    limits = deployment_limits(adapter, [engine.snap])
    assert limits is not None
    budget = Budget(timeout_s=5, fallback_tokens_per_second=20000)
    session = ProbeSession(entry=adapter, engines={engine.snap.url: adapter}, snapshots=(engine.snap,), limits=limits,
                           budget=budget)
    return CapacityProber(session, settings).run()


def shape(sent: list[Sent]) -> list[tuple[int, int, bool]]:
    return [(s.tokens, s.max_tokens, s.stream) for s in sent]


def test_pool_smaller_than_context_probes_over_the_pool_first():
    engine = FakeEngine(snapshot(URL, pool=4096, context=8192))
    run = probe(engine)
    # max accepted = min(8191, 4095) - 5 - 1 = 4089; over the pool = 4096 + (8192 - 4096) // 2
    assert run.limits == Limits(served_context=8192, pool_tokens=4096, max_accepted=4089)
    assert shape(engine.sent) == [
        (6144, 96, False), (6144, 96, True),  # over-pool, then streamed
        (8193, 96, False), (8193, 96, True),  # over-context: one token over the served context
        (4089, 1, True),  # boundary-accept: the stated maximum, streamed
        (4090, 1, False),  # boundary-reject: one more
        (4081, 8192 - 4081 + 8, False),  # clamp: prompt + max_tokens 8 over the context
        (4085, 4, False), (4085, 4, False),  # concurrent: leaves room for the 4 generated tokens
        (16, 4, False),  # the small request after the probes
    ]
    assert [(p.name, p.expect) for p in run.probes] == [
        ("over-pool", Expect.REJECT), ("over-pool-stream", Expect.REJECT),
        ("over-context", Expect.REJECT), ("over-context-stream", Expect.REJECT),
        ("boundary-accept", Expect.ACCEPT), ("boundary-reject", Expect.REJECT), ("clamp", Expect.REJECT),
        ("concurrent-1", Expect.ACCEPT), ("concurrent-2", Expect.ACCEPT),
    ]


def test_context_smaller_than_pool_has_no_over_pool_probe():
    engine = FakeEngine(snapshot(URL, pool=16384, context=8192))
    run = probe(engine, concurrency=3)
    assert run.limits == Limits(served_context=8192, pool_tokens=16384, max_accepted=8185)
    assert not run.of(ProbeName.OVER_POOL, ProbeName.OVER_POOL_STREAM)
    assert shape(engine.sent) == [(8193, 96, False), (8193, 96, True), (8185, 1, True), (8186, 1, False),
                                  (8177, 23, False), *[(8181, 4, False)] * 3, (16, 4, False)]


def test_answers_are_attributed_to_the_engine_whose_counters_moved():
    engine = FakeEngine(snapshot(URL, pool=4096, context=8192))
    run = probe(engine)
    accepted, refused = run.get(ProbeName.BOUNDARY_ACCEPT), run.get(ProbeName.BOUNDARY_REJECT)
    assert accepted is not None and refused is not None
    assert accepted.reached == (URL,) and accepted.counter_deltas[URL].prompt_tokens == 4089
    assert refused.reached == () and refused.completion.rejected
    assert run.healthy_after == {URL: True} and run.idle_after == {URL: True}
    assert run.small_request_after is not None and run.small_request_after.served


def test_a_well_behaved_engine_passes_every_probe_check():
    engine = FakeEngine(snapshot(URL, pool=4096, context=8192))
    ctx = CheckContext((engine.snap,), load_thresholds(), probes=probe(engine), entry=URL)
    ids = ["overcapacity-rejected", "prompt-integrity", "max-tokens-clamp", "concurrent-capacity", "engine-healthy-after"]
    results = run_checks(ctx, ids)
    assert [(r.id, r.status) for r in results] == [(i, Status.PASS) for i in ids], [r.message for r in results]


def test_an_engine_that_serves_over_the_pool_fails_overcapacity_rejected():
    def serves_everything(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens <= 8192:  # within the context, past the pool: the incident
            return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                              elapsed_s=0.01, completion_tokens=sent.max_tokens, prompt_tokens=sent.tokens)
        return None

    engine = FakeEngine(snapshot(URL, pool=4096, context=8192, role=Role.UNIFIED), script=serves_everything)
    ctx = CheckContext((engine.snap,), load_thresholds(), probes=probe(engine), entry=URL)
    (result,) = run_checks(ctx, ["overcapacity-rejected"])
    assert result.status is Status.FAIL and "over-pool (6,144 tokens)" in result.message


def test_no_stated_context_derives_no_probe_size():
    engine = FakeEngine(snapshot(URL, pool=4096, context=None))
    assert deployment_limits(FakeAdapter(engine.snap.url, HttpClient()), [engine.snap]) is None
    assert engine.sent == []


def probe_pd(moves_on: int) -> tuple[FakeEngine, object]:
    """A prefill entry and a decode whose KV counters move while the prefill refuses the first
    `moves_on` over-pool prompts (another client's transfer landing, or a leaking engine)."""
    from dataclasses import replace

    prefill = FakeEngine(snapshot("http://prefill:1", pool=4096, context=8192, role=Role.PREFILL))
    decode = FakeEngine(snapshot("http://decode:2", pool=16384, context=8192, role=Role.DECODE))
    decode.counters = replace(decode.counters, kv_transfers=0, kv_transfer_tokens=0)
    refusals = []

    def transfer_lands(engine: FakeEngine, sent: Sent) -> Completion | None:
        if sent.tokens == 6144 and not sent.stream:
            refusals.append(sent)
            if len(refusals) <= moves_on:
                c = decode.counters
                decode.counters = replace(c, kv_transfers=c.kv_transfers + 1, kv_transfer_tokens=c.kv_transfer_tokens + 384)
        return None

    prefill.script = transfer_lands
    adapters = {e.snap.url: FakeAdapter(e.snap.url, HttpClient()) for e in (prefill, decode)}
    limits = deployment_limits(adapters[prefill.snap.url], [prefill.snap])
    assert limits is not None
    session = ProbeSession(entry=adapters[prefill.snap.url], engines=adapters, snapshots=(prefill.snap, decode.snap),
                           limits=limits, budget=Budget(timeout_s=5, fallback_tokens_per_second=20000))
    return prefill, CapacityProber(session, ProbeSettings()).run()


def test_a_refusal_whose_window_saw_the_decode_move_is_sent_again_in_a_window_of_its_own():
    prefill, run = probe_pd(moves_on=1)
    assert [s.tokens for s in prefill.sent if not s.stream].count(6144) == 2  # once more, and no more
    (over_pool,) = run.of(ProbeName.OVER_POOL)
    assert [transfer_moved(w, ["http://decode:2"]) for w in over_pool.earlier_windows] == [
        {"http://decode:2": {"kv_transfers": 1, "kv_transfer_tokens": 384}}]
    assert not transfer_moved(over_pool.counter_deltas, ["http://decode:2"])
    assert all(not p.earlier_windows for p in run.probes if p is not over_pool)


def test_a_decode_that_moves_on_every_refusal_is_sent_again_twice_then_judged_on_all_three_windows():
    prefill, run = probe_pd(moves_on=10)
    assert [s.tokens for s in prefill.sent if not s.stream].count(6144) == 3
    (over_pool,) = run.of(ProbeName.OVER_POOL)
    assert len(over_pool.earlier_windows) == 2 and over_pool.counter_deltas["http://decode:2"].kv_transfers == 1.0
    ctx = CheckContext(tuple(s for s in (prefill.snap, FakeAdapter("http://decode:2", HttpClient()).snapshot())),
                       load_thresholds(), probes=run, entry=prefill.snap.url)
    (result,) = [r for r in run_checks(ctx, ["overcapacity-rejected"]) if r.endpoint == prefill.snap.url]
    assert result.status is Status.FAIL and "in each of its 3 windows" in result.message, result.message


def test_the_plan_counts_the_resends_as_conditional_only_where_a_decode_is_read():
    from kvpreflight._internal.probes.capacity import QUIET_RESEND_CONDITION, QUIET_RESENDS, capacity_plan

    limits = Limits(served_context=8192, pool_tokens=4096, max_accepted=4089)
    assert not [p for p in capacity_plan(limits, 2) if p.only_if]
    extra = [p for p in capacity_plan(limits, 2, decode=True) if p.only_if]
    assert [(p.name, p.concurrent, p.only_if) for p in extra] == [
        (name, QUIET_RESENDS, QUIET_RESEND_CONDITION) for name in ("over-pool", "over-pool-stream", "over-context",
                                                                   "over-context-stream")]
