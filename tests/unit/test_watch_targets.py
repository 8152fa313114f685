"""`kvpreflight watch` targets and full rounds on fake engines (tests/support/fake_adapter.py): a
boot spec's running engines at the URLs its port numbers fix, every attach deployment of a fleet
inventory under its own name, --entry-api, and --full-every (one near-context request and one
over-capacity request, sized by the capacity plan, judged by check's checks, counted and capped);
without --full-every no prompt comes near the context."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from support.cli import invoke
from support.fake_adapter import FakeEngine, snapshot

from kvpreflight.model import Completion, Role

URL = "http://engine:1"
CONTEXT, POOL = 8192, 4096  # the pool is smaller than the context: the over-capacity request is over the pool
CANARY_MAX = 160


def rounds(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def watch(*args: object, env: dict[str, str] | None = None):
    return invoke("watch", "--engine", "fake", "--listen", "off", *args, env=env)


# -- full rounds -------------------------------------------------------------------------------

def test_without_full_every_no_prompt_comes_near_the_context(fake_engines):
    engine = FakeEngine(snapshot(URL, pool=POOL, context=CONTEXT))
    proc = watch("--endpoint", URL, "--rounds", "3", "--interval", "0.01")
    assert proc.returncode == 0, proc.stderr
    assert [r["full"] for r in rounds(proc)] == [False] * 3
    sizes = [s.tokens for s in engine.sent]
    assert len(sizes) == 12 and max(sizes) <= min(CANARY_MAX, CONTEXT * 0.05), sizes
    assert "full round" not in proc.stderr


def test_full_every_sends_one_near_context_and_one_refused_request_judged_as_check_does(fake_engines):
    engine = FakeEngine(snapshot(URL, pool=POOL, context=CONTEXT))
    proc = watch("--endpoint", URL, "--rounds", "2", "--interval", "0.01", "--full-every", "6h")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    first, second = rounds(proc)
    assert (first["full"], first["outcome"], first["requests"]) == (True, "clean", 6), first
    assert (second["full"], second["requests"]) == (False, 4)  # the next full round is 6 h away
    big = [s for s in engine.sent if s.tokens > CANARY_MAX]
    assert len(big) == 2, [s.tokens for s in engine.sent]
    over, near = big
    assert POOL < over.tokens < CONTEXT  # over the pool, within the context: the incident's danger zone
    assert near.tokens == engine.limit and near.max_tokens == 1  # the longest prompt the stated limits accept
    # marked synthetic like the canaries: gateways and billing can leave them out
    assert [(s.extra or {}).get("user") for s in big] == ["kvpreflight-watch-synthetic-full"] * 2
    assert first["prompt_tokens"] == sum(s.tokens for s in engine.sent[:6])
    # said at start: how often, what each full round submits, and per hour
    each = over.tokens + near.tokens
    assert "a full round every 21600 s (--full-every): 2 more requests" in proc.stderr
    assert f"{each:,} prompt tokens, {-(-each // 6):,} prompt tokens per hour" in proc.stderr


def test_an_over_capacity_request_that_is_served_is_a_capacity_finding(fake_engines):
    def serves_anything(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                          elapsed_s=0.001, completion_tokens=sent.max_tokens, prompt_tokens=sent.tokens,
                          finish_reason="length", text=sent.seed * 3)

    FakeEngine(snapshot(URL, pool=POOL, context=CONTEXT), script=serves_anything)
    proc = watch("--endpoint", URL, "--once", "--full-every", "1d")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (line,) = rounds(proc)
    (finding,) = [f for f in line["findings"] if f["kind"] == "capacity"]
    assert finding["what"] == "overcapacity-rejected" and finding["endpoint"] == URL
    assert "over-pool" in finding["message"] and "served, not rejected" in finding["message"]


def test_a_full_round_over_the_hourly_cap_is_skipped_and_said(fake_engines):
    engine = FakeEngine(snapshot(URL, pool=POOL, context=CONTEXT))
    proc = watch("--endpoint", URL, "--once", "--full-every", "1h", "--max-tokens-per-hour", "2000")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)  # what it meant to measure was not: never clean
    (line,) = rounds(proc)
    assert line["outcome"] == "skipped" and line["full"] is False and line["requests"] == 4
    assert any("full round skipped" in n and "--max-tokens-per-hour 2,000" in n for n in line["notes"]), line["notes"]
    assert max(s.tokens for s in engine.sent) <= CANARY_MAX


def test_a_watch_round_and_a_check_judge_one_engine_alike(fake_engines, monkeypatch):
    """One engine that serves what it must refuse: `check` and a watch full round send it the same
    over-capacity and near-context requests and judge them through one code path (the deployment
    session's `judge`), to the same verdict and message."""
    from kvpreflight import preflight
    from kvpreflight._internal.check_ids import CheckId
    from kvpreflight._internal.probes.results import ProbeName
    from kvpreflight._internal.session import DeploymentSession
    from kvpreflight._internal.watch.budget import BudgetPlan
    from kvpreflight._internal.watch.loop import Watcher, WatchSettings
    from kvpreflight.check_options import CheckOptions, build_plan
    from kvpreflight.model import Status

    def serves_anything(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=200,
                          elapsed_s=0.001, completion_tokens=sent.max_tokens, prompt_tokens=sent.tokens,
                          finish_reason="length", text=sent.seed * 3)

    FakeEngine(snapshot(URL, pool=POOL, context=CONTEXT), script=serves_anything)
    judged: list[tuple[tuple[str, ...], object]] = []
    judge = DeploymentSession.judge

    def recording(self, group, run, ids, **kwargs):
        results = judge(self, group, run, ids, **kwargs)
        judged.append((tuple(ids), run))
        return results

    monkeypatch.setattr(DeploymentSession, "judge", recording)
    plan = build_plan(CheckOptions(endpoints=(URL,), engine="fake"))
    report = preflight.run(plan)
    ((check_ids, check_run),) = judged
    judged.clear()
    watcher = Watcher(WatchSettings(plan=replace(plan, capacity_only=True), canaries=False, full_every_s=3600,
                                    budget=BudgetPlan(interval_s=1, max_tokens_per_hour=10**9, full_every_s=3600)))
    line = watcher.round()
    ((watch_ids, watch_run),) = judged
    assert {CheckId.OVERCAPACITY_REJECTED, CheckId.PROMPT_INTEGRITY} <= set(check_ids) and set(watch_ids) < set(check_ids)

    def sent(run, name):
        (probe,) = run.of(name)
        return probe.completion.sent_tokens, probe.completion.max_tokens

    for name in (ProbeName.OVER_POOL, ProbeName.BOUNDARY_ACCEPT):  # the same requests
        assert sent(watch_run, name) == sent(check_run, name), name
    (failed,) = [r for r in report.checks if r.id == CheckId.OVERCAPACITY_REJECTED]
    (finding,) = line.findings
    assert failed.status is Status.FAIL and finding.what == str(CheckId.OVERCAPACITY_REJECTED)
    said = finding.message.removeprefix(f"{URL}: overcapacity-rejected (full round): ")
    # word for word what check says of the same request (check goes on about the requests it adds)
    first = said.split("; ")[0]
    assert first.startswith("over-pool (6,144 tokens): HTTP 200") and "served, not rejected" in first
    assert failed.message.split("; ")[0] == first, (said, failed.message)


@pytest.mark.parametrize(("args", "says"), [
    (("--full-every", "soon"), "--full-every: 'soon' is not a duration"),
    (("--full-every", "0"), "--full-every"),
    (("--full-every", "1h", "--no-canaries"), "--full-every sends requests and --no-canaries sends none"),
    (("--entry-api", "grpc"), "--entry-api 'grpc'"),
    (("--entry-api", "openai"), "--entry-api openai names the API of the --entry URL"),
    (("--spec", "s.yaml"), "--endpoint/--entry and --spec both name what to watch"),
])
def test_usage_errors_exit_2_in_one_line(args, says):
    proc = watch("--endpoint", URL, *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_with_entry_api_openai_the_canaries_go_to_the_gateways_openai_route(fake_engines, monkeypatch):
    """--entry-api openai, as for check: the canaries' requests are built for the gateway's
    /v1/completions, naming the model (the fake gateway answers them as the engine would)."""
    from support.fake_adapter import FakeAdapter

    FakeEngine(snapshot(URL, model="small"))
    FakeEngine(snapshot("http://gateway:4000", model="small"))
    built: list[tuple[str, str, object]] = []
    original = FakeAdapter.complete

    def spying(self, ids, *, max_tokens, stream, timeout_s, extra=None):
        request = self.build_request(ids, max_tokens=max_tokens, stream=stream, extra=extra)
        built.append((self.url, request.path, request.body.get("model")))
        return original(self, ids, max_tokens=max_tokens, stream=stream, timeout_s=timeout_s, extra=extra)

    monkeypatch.setattr(FakeAdapter, "complete", spying)
    proc = watch("--endpoint", URL, "--entry", "http://gateway:4000", "--entry-api", "openai", "--once")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert built == [("http://gateway:4000", "/v1/completions", "small")] * 4
    built.clear()
    assert watch("--endpoint", URL, "--entry", "http://gateway:4000", "--once").returncode == 0
    assert {path for _, path, _ in built} == {"/generate"}  # native: the engine's own route


# -- a boot spec's running engines -----------------------------------------------------------------

def spec_file(tmp_path: Path, engines: list[dict], **top: object) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"deployment": "chat-pd", "engines": engines, **top}))
    return path


def test_a_spec_is_watched_at_the_urls_its_ports_fix(fake_engines, tmp_path):
    prefill = FakeEngine(snapshot("http://127.0.0.1:31001", role=Role.PREFILL))
    decode = FakeEngine(snapshot("http://127.0.0.1:31002", role=Role.DECODE))
    router = FakeEngine(snapshot("http://127.0.0.1:31000"), forwards_to=(prefill, decode))
    command = ["python", "-m", "server"]
    spec = spec_file(tmp_path, [
        {"name": "prefill", "role": "prefill", "command": command, "port": 31001},
        {"name": "decode", "role": "decode", "command": command, "url": "http://127.0.0.1:31002"},
        {"name": "router", "role": "router", "command": command, "port": 31000},
    ])
    proc = watch("--spec", spec, "--once")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    (line,) = rounds(proc)
    assert line["deployment"] == "chat-pd" and line["outcome"] == "clean"
    assert set(line["engines"]) == {"http://127.0.0.1:31001", "http://127.0.0.1:31002"}
    assert {s.url for s in router.sent} == {"http://127.0.0.1:31000"} and len(router.sent) == 4  # through the entry


def test_a_spec_whose_ports_are_chosen_at_boot_is_refused_in_one_line(fake_engines, tmp_path):
    spec = spec_file(tmp_path, [{"name": "engine", "role": "unified", "command": ["python", "-m", "server"], "port": "auto"}])
    proc = watch("--spec", spec, "--once")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (said,) = proc.stderr.strip().splitlines()
    assert "--spec" in said and "engines[0] (engine) has port: auto" in said and "give it a port number" in said


def test_a_spec_is_read_as_boot_mode_launches_it_one_kind_or_auto(tmp_path):
    """`watch --spec` takes its plan from the spec's launch as boot mode does (preflight.launched_plan):
    the workers' URLs and roles, the router as the entry, and the engines' kind only where all say one."""
    from kvpreflight.boot import load_spec
    from kvpreflight.check_options import CheckOptions, build_plan
    from kvpreflight.preflight import running_plan
    from kvpreflight.targets import Target

    sglang = ["python", "-m", "sglang.launch_server", "--port", "{port}"]
    engines = [{"name": "prefill", "role": "prefill", "command": sglang, "port": 31001},
               {"name": "decode", "role": "decode", "command": sglang, "port": 31002},
               {"name": "router", "role": "router", "command": ["python", "-m", "server"], "port": 31000}]
    plan = running_plan(build_plan(CheckOptions()), load_spec(spec_file(tmp_path, engines, context_length=4096)))
    assert plan.targets == (Target("http://127.0.0.1:31001", Role.PREFILL), Target("http://127.0.0.1:31002", Role.DECODE))
    assert (plan.entry, plan.engine, plan.context_length, plan.booted) == ("http://127.0.0.1:31000", "sglang", 4096, False)
    engines[1]["command"] = ["python", "-m", "server"]  # a kind the command does not say: each engine is detected
    assert running_plan(build_plan(CheckOptions()), load_spec(spec_file(tmp_path, engines))).engine == "auto"
    named = running_plan(build_plan(CheckOptions(engine="vllm")), load_spec(spec_file(tmp_path, engines)))
    assert named.engine == "vllm"  # --engine wins


# -- a fleet inventory ---------------------------------------------------------------------------------

def inventory_file(tmp_path: Path, deployments: list[dict]) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"fleet": "prod", "deployments": deployments}))
    return path


def test_every_attach_deployment_is_watched_under_its_own_name(fake_engines, tmp_path):
    def refuses(engine, sent):
        return Completion(sent_tokens=sent.tokens, max_tokens=sent.max_tokens, streamed=sent.stream, status=500,
                          elapsed_s=0.001, error_message="KV transfer failed")

    FakeEngine(snapshot("http://a:1"))
    FakeEngine(snapshot("http://b:2"), script=refuses)
    fleet = inventory_file(tmp_path, [{"name": "chat-a", "attach": {"endpoints": ["http://a:1"], "engine": "fake"}},
                                      {"name": "chat-b", "attach": {"endpoints": ["http://b:2"], "engine": "fake"}}])
    proc = invoke("watch", "--inventory", fleet, "--rounds", "2", "--interval", "0.01", "--listen", "off",
                  "--textfile", tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)  # one deployment's finding fails the run
    lines = rounds(proc)
    assert [(r["deployment"], r["round"]) for r in lines] == [("chat-a", 1), ("chat-b", 1), ("chat-a", 2), ("chat-b", 2)]
    assert all(r["outcome"] == "clean" for r in lines if r["deployment"] == "chat-a")
    assert all({f["what"] for f in r["findings"]} == {"request-failed"} for r in lines if r["deployment"] == "chat-b")
    assert "watching 2 deployment(s)" in proc.stderr and "per round and deployment, 2 deployments" in proc.stderr
    from prometheus_client.parser import text_string_to_metric_families

    text = (tmp_path / "kvpreflight-watch-prod.prom").read_text()
    canary = {s.labels["deployment"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == "kvpreflight_watch_last_round_findings" and s.labels["kind"] == "canary"}
    assert canary == {"chat-a": 0, "chat-b": 4}


def test_a_boot_or_builtin_deployment_in_the_inventory_is_refused_naming_it(fake_engines, tmp_path):
    fleet = inventory_file(tmp_path, [{"name": "chat-a", "attach": {"endpoints": ["http://a:1"]}},
                                      {"name": "demo", "builtin": {"context_length": 8192}}])
    proc = invoke("watch", "--inventory", fleet, "--once")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (said,) = proc.stderr.strip().splitlines()
    assert "deployments[1] (demo) is a builtin deployment" in said and "attach" in said


def test_the_inventory_names_each_deployments_engines_so_target_flags_are_refused(tmp_path):
    fleet = inventory_file(tmp_path, [{"name": "chat-a", "attach": {"endpoints": ["http://a:1"]}}])
    proc = invoke("watch", "--inventory", fleet, "--model", "m", "--name", "x", "--once")
    assert proc.returncode == 2 and "drop --model, --name" in proc.stderr


def test_a_capacity_only_deployment_is_read_and_sent_nothing(fake_engines, tmp_path):
    frozen = FakeEngine(snapshot("http://a:1"))
    live = FakeEngine(snapshot("http://b:2"))
    fleet = inventory_file(tmp_path, [
        {"name": "frozen", "attach": {"endpoints": ["http://a:1"], "engine": "fake", "capacity_only": True}},
        {"name": "live", "attach": {"endpoints": ["http://b:2"], "engine": "fake"}}])
    proc = invoke("watch", "--inventory", fleet, "--once", "--full-every", "1h")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    by_name = {r["deployment"]: r for r in rounds(proc)}
    assert by_name["frozen"]["requests"] == 0 and by_name["frozen"]["engines"] == ["http://a:1"] and frozen.sent == []
    assert by_name["live"]["requests"] == 6 and by_name["live"]["full"] is True and len(live.sent) == 6
    assert "frozen: capacity_only in the inventory: read only" in proc.stderr
