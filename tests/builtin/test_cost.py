"""The cost block against a real builtin engine: what a check cost it, in the JSON report and the
signed record, matched against the engine's own counters read independently."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from support.builtin_testbed import RunningEngine, unified_engine
from support.schemas import parsed


def counters(url: str) -> dict[str, float]:
    """The builtin engine's own counters, read straight from /metrics (not through kvpreflight)."""
    out: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        name = name.split("{")[0]
        if name in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:generation_tokens_total"):
            out[name] = out.get(name, 0.0) + float(value)
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with unified_engine(tmp_path_factory.mktemp("cost"), context_length=2048, pool_tokens=4096) as running:
        yield running


def test_the_cost_block_matches_the_engines_own_counters_in_every_output(engine: RunningEngine, tmp_path: Path) -> None:
    planned = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--plan",
                              "--format", "json"], capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr
    (plan,) = json.loads(planned.stdout)["plan"]
    before = counters(engine.url)
    record = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--format", "json",
                           "--record", str(record), "--unsigned", "--subject", "image=sha256:" + "ab" * 32],
                          capture_output=True, text=True, timeout=600)
    after = counters(engine.url)
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    cost = parsed(proc.stdout)["cost"]
    prompt = after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"]
    cached = after["sglang:cached_tokens_total"] - before["sglang:cached_tokens_total"]
    (mine,) = cost["engines"]
    assert mine["prompt_tokens"] == prompt
    assert mine["prefilled_tokens"] == cost["prefilled_tokens"] == prompt - cached
    assert mine["generated_tokens"] == after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    assert cost["prefilled_measured"] is True
    assert cost["context_equivalents_prefilled"] == round((prompt - cached) / 2048, 2)
    # kvpreflight's own count: the engine never counts the prompts it refused, so more was submitted
    assert cost["requests"] > 20 and cost["prompt_tokens_submitted"] > prompt
    statement = json.loads(base64.b64decode(json.loads(record.read_text())["payload"]))
    assert statement["predicate"]["cost"] == cost
    # --plan said what check then sent: the builtin engine reports cache hits, so the conditional
    # timing audit was not sent and the figures are equal (it was 131 planned for 44 sent).
    assert plan["conditional_requests"] > 0 and "the engine reports no prefix-cache hits" in str(plan["requests"])
    assert (plan["requests_sent"], plan["prompt_tokens_submitted"]) == (cost["requests"], cost["prompt_tokens_submitted"])
    assert plan["context_equivalents_submitted"] == cost["context_equivalents_submitted"]


def requests_served(url: str) -> float:
    return sum(float(line.split()[-1]) for line in requests.get(url + "/metrics", timeout=10).text.splitlines()
               if line.startswith("sglang:num_requests_total"))


@pytest.mark.parametrize(("flags", "sent"), [((), 1), (("--no-calibrate",), 0)])
def test_plan_prints_the_probes_and_sends_only_the_calibration(engine: RunningEngine, flags: tuple[str, ...],
                                                               sent: int) -> None:
    before = requests_served(engine.url)
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url, "--plan", "--format", "json",
                           *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert requests_served(engine.url) - before == sent
    (group,) = json.loads(proc.stdout)["plan"]
    assert {"boundary-accept", "over-context", "concurrent", "normal", "prefix-cache"} <= {r["probe"] for r in group["requests"]}
    assert group["prompt_tokens_submitted"] == sum(r["prompt_tokens"] * r["count"] for r in group["requests"] if not r["only_if"])
    assert group["conditional_prompt_tokens"] == sum(r["prompt_tokens"] * r["count"] for r in group["requests"] if r["only_if"])
    assert group["context_equivalents_submitted"] == round(group["prompt_tokens_submitted"] / 2048, 2)
    if sent:
        # the one request is named, and the duration says it is an upper estimate
        assert group["expected_duration_s"] > 0 and group["calibration"] == "sent 127-token request, max_tokens 8 (streamed)"
        assert "one 127-token request through the entry; an upper estimate" in group["speed"]
    else:
        assert group["expected_duration_s"] is None and group["calibration"] == "not sent (--no-calibrate)"


@pytest.mark.parametrize("plan_only", [True, False])
def test_a_plan_above_max_context_equivalents_is_refused_before_any_request(engine: RunningEngine, plan_only: bool) -> None:
    before = requests_served(engine.url)
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", engine.url,
                           "--max-context-equivalents", "3", *(["--plan"] if plan_only else [])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "above --max-context-equivalents 3; nothing was sent" in proc.stderr and "Traceback" not in proc.stderr
    assert requests_served(engine.url) == before


def test_the_default_check_prefills_at_most_3_5_contexts_with_the_cache_off(tmp_path: Path) -> None:
    """Issue 26's bound: reading every tenant's answers both streamed and not must not cost more
    prefill. At 8,192 with the prefix cache off, what the engine itself counts as prompt tokens
    (sglang:prompt_tokens_total, a second source beside kvpreflight's cost block) is at most 3.5
    context-equivalents (3.45 when the bound was set: benchmarks/bench_cost.py)."""
    context = 8192
    with unified_engine(tmp_path, context_length=context, pool_tokens=2 * context,
                        extra_args=["--disable-radix-cache"], wait_s=120) as running:
        before = counters(running.url)
        proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", running.url, "--format", "json",
                               "--timeout", "60"], capture_output=True, text=True, timeout=600)
        after = counters(running.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cost = parsed(proc.stdout)["cost"]
    engine_counted = after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"]
    assert after["sglang:cached_tokens_total"] == before["sglang:cached_tokens_total"]  # the cache really was off
    assert cost["prefilled_tokens"] == engine_counted  # so the report's own figure is bound as well
    assert engine_counted / context <= 3.5, cost
