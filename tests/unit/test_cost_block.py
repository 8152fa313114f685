"""The cost block on fake engines: estimated (and saying so) where an engine counts no prefilled
tokens, shown in the table and Markdown, read back from JSON unchanged, absent when nothing was sent."""

from __future__ import annotations

from support.fake_adapter import FakeEngine, snapshot

from kvpreflight._internal.pipeline import run_check
from kvpreflight.check_plan import CheckPlan
from kvpreflight.formats import get_format
from kvpreflight.schema import report_from_dict, report_to_dict
from kvpreflight.targets import Target


def test_an_engine_without_a_prefilled_counter_gets_an_estimate_that_says_so() -> None:
    FakeEngine(snapshot("http://one:1", pool=16384))
    report = run_check(CheckPlan(targets=(Target("http://one:1"),), engine="fake", timeout_s=5))
    cost = report.cost
    assert cost is not None and not cost.measured and cost.basis.startswith("estimated")
    assert cost.prefilled_tokens < cost.prompt_tokens_submitted  # the fake engine reports its cache hits
    assert report_from_dict(report_to_dict(report)).cost == cost
    for name in ("table", "markdown"):
        text = get_format(name).render(report)
        assert "context-equivalents" in text and f"{cost.prompt_tokens_submitted:,} prompt tokens submitted" in text


def test_capacity_only_sends_nothing_and_has_no_cost() -> None:
    FakeEngine(snapshot("http://one:1", pool=16384))
    report = run_check(CheckPlan(targets=(Target("http://one:1"),), engine="fake", capacity_only=True))
    assert report.cost is None and report_to_dict(report)["cost"] is None
