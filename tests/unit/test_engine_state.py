"""The engine state the probes share: counter deltas, the bounded wait for idle pools (an engine
found stuck is not waited for again), and request time budgets."""

from __future__ import annotations

import time
from dataclasses import replace

from support.fake_adapter import FakeAdapter, FakeEngine, snapshot

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.interface import Counters
from kvpreflight._internal.probes import engine_state
from kvpreflight._internal.probes.engine_state import EngineState, counter_deltas
from kvpreflight.model import CounterDelta


def test_deltas_cover_counters_known_at_both_moments_only():
    before = {"u": Counters(requests=1, prompt_tokens=100, kv_transfers=None, extra={"queue": 2}), "gone": Counters(requests=1)}
    after = {"u": Counters(requests=3, prompt_tokens=100, kv_transfers=5, used_tokens=64, extra={"queue": 1}), "gone": None}
    assert counter_deltas(before, after) == {"u": CounterDelta(requests=2, prompt_tokens=0, extra={"queue": -1})}


def test_a_stuck_engine_is_waited_for_once(monkeypatch):
    monkeypatch.setattr(engine_state, "IDLE_POLL_S", 0.01)
    idle, stuck = FakeEngine(snapshot("http://idle:1")), FakeEngine(snapshot("http://stuck:2"))
    stuck.counters = replace(stuck.counters, used_tokens=48)
    client = HttpClient()
    state = EngineState({e.snap.url: FakeAdapter(e.snap.url, client) for e in (idle, stuck)})
    start = time.monotonic()
    assert state.wait_idle(0.2) == {"http://idle:1": True, "http://stuck:2": False}
    assert time.monotonic() - start >= 0.2
    start = time.monotonic()
    assert state.wait_idle(5.0) == {"http://idle:1": True, "http://stuck:2": False}
    assert time.monotonic() - start < 1.0  # still holding no more than before: not waited for again

