"""The isolation scenarios are declared once (kvpreflight/_internal/probes/scenarios.py): `check --plan` and
the prober both iterate that declaration, so changing one scenario's entry changes what the plan
says and what the prober sends, with no other edit."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from misbehaving_http import Sglang, fake_engine
from support.cli import invoke
from support.fake_adapter import FakeAdapter, FakeEngine, snapshot

from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.probes import scenarios
from kvpreflight._internal.probes.budget import Budget
from kvpreflight._internal.probes.isolation import IsolationSettings, run_isolation
from kvpreflight._internal.probes.isolation_sizes import LONGER_LEAVER_CONDITION, IsolationSizes
from kvpreflight._internal.probes.results import Limits, ScenarioName, Tenant
from kvpreflight._internal.probes.session import ProbeSession

URL = "http://engine:1"
LIMITS = Limits(served_context=8192, pool_tokens=4096, max_accepted=4089)
ODD = 77  # a prompt size no declared request has


def normal_first_request_of(size: int, declared=scenarios.declared):
    """The declaration, with the normal scenario's first request `size` tokens and streamed."""
    def changed(sizes: IsolationSizes) -> tuple[scenarios.ScenarioSpec, ...]:
        out = []
        for spec in declared(sizes):
            if spec.name is ScenarioName.NORMAL:
                first, *rest = spec.steps
                request = replace(first.requests[0], prompt_tokens=size, stream=True)
                spec = replace(spec, steps=(replace(first, requests=(request,)), *rest))
            out.append(spec)
        return tuple(out)
    return changed


def planned_normal(url: str) -> list[tuple[int, int]]:
    result = invoke("check", "--endpoint", url, "--engine", "sglang", "--plan", "--format", "json")
    assert result.returncode == 0, result.stderr
    (group,) = json.loads(result.stdout)["plan"]
    return [(r["prompt_tokens"], r["count"]) for r in group["requests"] if r["probe"] == "normal"]


def sent_by_normal() -> list[tuple[str, int, bool]]:
    engine = FakeEngine(snapshot(URL))
    adapter = FakeAdapter(URL, HttpClient())
    session = ProbeSession(entry=adapter, engines={URL: adapter}, snapshots=(engine.snap,), limits=LIMITS,
                           budget=Budget(timeout_s=5, fallback_tokens_per_second=20000))
    run = run_isolation(session, IsolationSettings())
    (normal,) = [s for s in run.scenarios if s.name is ScenarioName.NORMAL]
    return [(r.name, r.completion.sent_tokens if r.completion else 0, bool(r.completion and r.completion.streamed))
            for r in normal.requests]


def test_one_changed_scenario_entry_changes_both_the_plan_and_what_the_prober_sends(monkeypatch: pytest.MonkeyPatch):
    with fake_engine(Sglang()) as url:
        before_plan = planned_normal(url)
        before_sent = sent_by_normal()
        monkeypatch.setattr(scenarios, "declared", normal_first_request_of(ODD))
        after_plan = planned_normal(url)
        after_sent = sent_by_normal()
    (size, count), = before_plan  # twenty-eight short requests of one size
    assert count == len(scenarios.NORMAL_ORDER) == 28 and ODD not in (s for s, _ in before_plan)
    assert sorted(after_plan) == sorted([(size, 27), (ODD, 1)])
    short = IsolationSizes.of(LIMITS, []).normal_tokens
    assert before_sent[0] == (f"normal-{Tenant.A.value}1", short, False)
    assert after_sent[0] == (f"normal-{Tenant.A.value}1", ODD, True)
    assert after_sent[1:] == before_sent[1:]


def test_the_plan_counts_each_declared_request_once_and_the_carried_scenarios_none():
    sizes = IsolationSizes.of(LIMITS, [snapshot(URL)], 2)
    declared = scenarios.declared(sizes)
    plan = scenarios.isolation_sizes(sizes, churn=True, timing_samples=0)
    for spec in declared:
        own = [p for p in plan if p.name == spec.name and p.only_if != LONGER_LEAVER_CONDITION]
        sent = sum(len(step.requests) for step in spec.steps)
        assert sum(p.concurrent for p in own) == (0 if spec.carried_by else sent), spec.name
        # a unified engine's leaver may go longer, in place of the short one: listed apart, conditional
        in_place = [p for p in plan if p.name == spec.name and p.only_if == LONGER_LEAVER_CONDITION]
        longer = [r for step in spec.steps for r in step.requests if r.longer]
        assert [p.prompt_tokens for p in in_place] == [r.longer for r in longer], spec.name
    assert [p.name for p in plan if p.only_if == LONGER_LEAVER_CONDITION] == [ScenarioName.CANCEL_TRANSFER] * 2
    without_churn = scenarios.isolation_sizes(sizes, churn=False, timing_samples=0)
    assert {p.name for p in without_churn} == {ScenarioName.NORMAL, ScenarioName.OVER_CAPACITY, "prefix-cache", "health-after"}
