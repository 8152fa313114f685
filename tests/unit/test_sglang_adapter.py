"""The SGLang adapter against bodies and log lines copied from SGLang 0.5.23's source
(tests/fixtures/sglang/README.md says where each comes from), and against metrics recorded from
the live engine on CPU (tests/fixtures/sglang/live; the live engine itself: tests/real/test_sglang_live.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from static_server import static_server
from support.cli import invoke

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.checks.advisory_data import load_advisories
from kvpreflight._internal.engines import HttpClient, open_adapter
from kvpreflight.model import ErrorKind, Origin, Role, Status

FIX = Path(__file__).parents[1] / "fixtures" / "sglang"
JSON = "application/json"


def routes(server_info: dict | None = None, generate=None):
    info = server_info or json.loads((FIX / "server_info_prefill.json").read_text())
    r = {
        "GET /health": (200, JSON, b""),
        "GET /server_info": (200, JSON, info),
        "GET /v1/models": (200, JSON, (FIX / "v1_models.json").read_text()),
        "GET /metrics": (200, "text/plain; version=0.0.4", (FIX / "metrics_prefill.txt").read_text()),
    }
    if generate:
        r["POST /generate"] = generate
    return r


def test_snapshot_reads_every_source_with_its_origin_and_skips_the_draft_pool():
    with static_server(routes()) as url:
        adapter = open_adapter(url, HttpClient())
        assert adapter.kind == "sglang"
        snap = adapter.snapshot(log_text=(FIX / "prefill.log").read_text())
    assert snap.role is Role.PREFILL  # from disaggregation_mode
    assert snap.version == "0.5.20"
    assert snap.served_context == 1_048_576
    assert snap.page_size == 64
    by_source = {(r.source, r.rank): (r.origin, r.tokens) for r in snap.pool_readings}
    assert by_source[("/server_info max_total_num_tokens", None)] == (Origin.SCHEDULER, 681_280)
    assert by_source[("metrics sglang:max_total_num_tokens", "tp1 pp0")] == (Origin.SCHEDULER, 681_280)
    assert by_source[("log: KV Cache is allocated #tokens", "tp0")] == (Origin.ALLOCATOR, 681_280)
    assert by_source[("log: KV Cache is allocated #tokens", "tp1")] == (Origin.ALLOCATOR, 681_280)
    assert all(r.tokens != 9_999_999 for r in snap.pool_readings), "the draft model's pool is not the main pool"
    assert snap.pool_tokens() == 681_280
    assert any("fewer than --context-length 1048576" in n for n in snap.notes)


def test_incident_config_fails_capacity_and_the_advisory_but_sources_agree():
    with static_server(routes()) as url:
        snap = open_adapter(url, HttpClient()).snapshot(log_text=(FIX / "prefill.log").read_text())
    ctx = CheckContext((snap,), load_thresholds(), None, None, None, load_advisories())
    results = {r.id: r for r in run_checks(ctx, ["kv-capacity", "kv-sources-agree", "engine-advisories"])}
    assert results["kv-capacity"].status is Status.FAIL
    assert "681,280" in results["kv-capacity"].message and "0.65x" in results["kv-capacity"].message
    assert results["kv-sources-agree"].status is Status.PASS
    assert results["engine-advisories"].status is Status.FAIL
    assert "KVPF-SGLANG-2026-001" in results["engine-advisories"].message


def test_one_origin_only_is_a_warning_naming_the_missing_log():
    with static_server(routes()) as url:
        snap = open_adapter(url, HttpClient()).snapshot()
    ctx = CheckContext((snap,), load_thresholds())
    (result,) = run_checks(ctx, ["kv-sources-agree"])
    assert result.status is Status.WARN
    assert "--log" in result.message


def test_allocator_and_scheduler_disagreeing_fails():
    log = (FIX / "prefill.log").read_text().replace("#tokens: 681280", "#tokens: 340640")
    with static_server(routes()) as url:
        snap = open_adapter(url, HttpClient()).snapshot(log_text=log)
    (result,) = run_checks(CheckContext((snap,), load_thresholds()), ["kv-sources-agree"])
    assert result.status is Status.FAIL
    assert "340,640" in result.message and "681,280" in result.message


def test_error_inside_a_200_stream_is_read_as_a_length_rejection():
    over_pool = json.loads((FIX / "error_over_pool.json").read_text())
    stream = f"data: {json.dumps(over_pool)}\n\ndata: [DONE]\n\n"
    with static_server(routes(generate=(200, "text/event-stream", stream))) as url:
        adapter = open_adapter(url, HttpClient())
        c = adapter.complete([1, 2, 3], max_tokens=4, stream=True, timeout_s=5)
    assert c.status == 200
    assert c.rejected and c.error_kind == ErrorKind.LENGTH
    assert "exceeds the maximum allowed length (681274 tokens)" in c.error_message


@pytest.mark.parametrize("fixture", ["error_over_pool.json", "error_over_context.json"])
def test_both_sglang_length_messages_classify_as_length(fixture):
    body = (FIX / fixture).read_text()
    with static_server(routes(generate=(400, JSON, body))) as url:
        c = open_adapter(url, HttpClient()).complete([1, 2], max_tokens=1, stream=False, timeout_s=5)
    assert c.status == 400 and c.error_kind == ErrorKind.LENGTH and c.completion_tokens is None


def test_http_200_with_generated_text_is_not_a_rejection():
    served = {"text": "fluent text", "output_ids": [5, 6, 7],
              "meta_info": {"prompt_tokens": 1, "completion_tokens": 3, "finish_reason": {"type": "length", "length": 3}}}
    with static_server(routes(generate=(200, JSON, served))) as url:
        c = open_adapter(url, HttpClient()).complete(list(range(100)), max_tokens=3, stream=False, timeout_s=5)
    assert not c.rejected
    assert c.prompt_tokens == 1 and c.completion_tokens == 3  # the placeholder: 1 of 100 tokens


def test_check_cli_capacity_only_on_the_incident_config_exits_1(tmp_path):
    with static_server(routes()) as url:
        proc = invoke("check", "--endpoint", url, "--capacity-only",
             "--log", f"{url}={FIX / 'prefill.log'}", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "fail"
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses["kv-capacity"] == "fail"
    assert statuses["overcapacity-rejected"] == "skip"  # read-only mode sends nothing
    assert report["engines"][0]["kv_pool_tokens"] == 681_280
    assert report["engines"][0]["role"] == "prefill"


def test_pd_without_entry_checks_capacity_and_says_why_no_probe_ran():
    with static_server(routes()) as url:
        proc = invoke("check", "--endpoint", url, "--format", "json")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1  # the incident's pool fails; the probes were not sent
    report = json.loads(proc.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["kv-capacity"]["status"] == "fail"
    for probe_check in ("overcapacity-rejected", "tenant-isolation"):
        assert by_id[probe_check]["status"] == "inconclusive"
        assert "--entry" in by_id[probe_check]["message"]


def test_kv_canary_setting_is_read_from_server_info_and_off_is_recommended_on():
    """srt/arg_groups/fields/observability.py (0.5.23): kv_canary none|log|raise, default none.
    Off, the report names the flag and the first release that ships it (0.5.13, from the wheels)."""
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    for mode, noted in (("none", True), ("log", False)):
        body = {**info, "version": "0.5.23", "kv_canary": mode, "kv_canary_real_data": "none", "kv_canary_sweep_interval": 0}
        with static_server(routes(body)) as url:
            snap = open_adapter(url, HttpClient()).snapshot()
        assert snap.kv_canary == mode
        ctx = CheckContext((snap,), load_thresholds(), None, None, None, load_advisories())
        (r,) = run_checks(ctx, ["engine-advisories"])
        notes = [n["id"] for n in r.evidence["notes"]]
        assert ("KVPF-SGLANG-2026-008" in notes) is noted, r.evidence
    old = {k: v for k, v in info.items() if not k.startswith("kv_canary")} | {"version": "0.5.12"}
    with static_server(routes(old)) as url:
        snap = open_adapter(url, HttpClient()).snapshot()
    assert snap.kv_canary is None
    (r,) = run_checks(CheckContext((snap,), load_thresholds(), None, None, None, load_advisories()), ["engine-advisories"])
    (note,) = [n for n in r.evidence["notes"] if n["id"] == "KVPF-SGLANG-2026-009"]
    assert "0.5.13 is the first release that ships it" in note["title"]


def test_kv_canary_violation_and_stats_lines_become_danger_lines_with_slot_position_and_reason(tmp_path):
    from kvpreflight._internal.engines.sglang import SglangAdapter
    from kvpreflight._internal.probes.logs import LogWatch
    from kvpreflight.model import Hazard

    log = tmp_path / "decode.log"
    log.write_text("")
    watch = LogWatch({"http://d:2": (log, SglangAdapter.log_signals)})
    log.write_text((FIX / "kv_canary.log").read_text())
    lines = watch.take()
    assert [(d.hazard, d.what, d.detail) for d in lines] == [
        (Hazard.KV_CANARY, "kv_canary violation", "slot_idx=4123 position=17 fail_reason=verify_chain_hash+verify_token "
         "stored_token=881 expected_token=42 launch_tag=HEAD_K_FULL"),
        (Hazard.KV_CANARY, "[canary] ... violations=N (counted so far)", "violations=1"),
    ]  # the stats line with violations=0 and the header/body lines of the same violation are no signal


LIVE = FIX / "live"  # recorded from live SGLang 0.5.23 on CPU (README.md there)


@pytest.mark.parametrize(("role", "computed", "cached"), [("prefill", 5_007, 6_999), ("decode", 0, 0)])
def test_counters_take_each_engines_own_compute_from_realtime_tokens_not_the_prompt_counts_a_decode_repeats(role, computed, cached):
    """Live P/D (Mooncake): the decode's prompt_tokens_total and cached_tokens_total repeat the
    prefill's (12,004 and 6,999) though it computed none of those prompts; what each engine computed
    and found cached is its realtime_tokens_total (prefill_compute, prefill_cache). Read as
    prompt - cached, the decode 'computed' 5,005 tokens, and pd-transfer failed every honest pair."""
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    r = {**routes({**info, "disaggregation_mode": role}),
         "GET /metrics": (200, "text/plain; version=0.0.4", (LIVE / f"metrics_{role}.txt").read_text())}
    with static_server(r) as url:
        counters = open_adapter(url, HttpClient()).counters()
    assert counters.prompt_tokens == 12_004
    assert (counters.prefilled_tokens, counters.cached_prompt_tokens) == (computed, cached)


def test_counters_without_realtime_tokens_fall_back_to_prompt_less_cached():
    """Builds (and the builtin engine) without realtime_tokens_total: prompt - cached, as before."""
    text = (LIVE / "metrics_prefill.txt").read_text()
    text = "\n".join(line for line in text.splitlines() if "realtime_tokens_total" not in line) + "\n"
    with static_server({**routes(), "GET /metrics": (200, "text/plain; version=0.0.4", text)}) as url:
        counters = open_adapter(url, HttpClient()).counters()
    assert (counters.prefilled_tokens, counters.cached_prompt_tokens) == (12_004 - 6_999, 6_999)


def test_a_handoff_timeout_warning_becomes_a_danger_line_naming_the_setting_to_raise(tmp_path):
    from kvpreflight._internal.engines.sglang import SglangAdapter
    from kvpreflight._internal.probes.logs import LogWatch
    from kvpreflight.model import Hazard

    log = tmp_path / "decode.log"
    log.write_text("")
    watch = LogWatch({"http://d:2": (log, SglangAdapter.log_signals)})
    log.write_text((FIX / "handoff_timeout.log").read_text())
    assert [(d.hazard, d.request_id, d.detail) for d in watch.take()] == [
        (Hazard.HANDOFF_TIMEOUT, None, "setting=SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
        (Hazard.HANDOFF_TIMEOUT, "kvpreflight-0a5f117d71c2bef0", "setting=SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
        (Hazard.TRANSFER, "kvpreflight-1b6e228e82d3cf01", None),  # failed for another reason: no timeout to raise
        (Hazard.HANDOFF_TIMEOUT, None, "setting=SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"),
        (Hazard.HANDOFF_TIMEOUT, "kvpreflight-2c7f339f93e4d012", "setting=SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"),
    ]


def test_a_failure_counter_sglang_has_not_sent_yet_counts_from_zero_so_its_first_failure_is_a_delta():
    """Live 0.5.23 sends num_transfer_failed_reqs_total (and the bootstrap, abort and deferred-release
    counters) only from its first increment (tests/fixtures/sglang/live/ has none of them): read as
    unknown, a failure during the check moved nothing kvpreflight could see."""
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    before_text = (LIVE / "metrics_decode.txt").read_text()
    after_text = before_text + ('sglang:num_transfer_failed_reqs_total{engine_type="decode",model_name="tiny-llama",'
                                'moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1.0\n')
    counters = []
    for text in (before_text, after_text):
        r = {**routes({**info, "disaggregation_mode": "decode"}), "GET /metrics": (200, "text/plain; version=0.0.4", text)}
        with static_server(r) as url:
            counters.append(open_adapter(url, HttpClient()).counters())
    before, after = counters
    assert (before.transfer_failures, before.bootstrap_failures, before.deferred_releases) == (0.0, 0.0, 0.0)
    assert after.deltas_since(before).transfer_failures == 1.0
    # a page that is not SGLang's (no pool gauge on it) says nothing of them
    with static_server({**routes(), "GET /metrics": (200, "text/plain; version=0.0.4", "other_total 1\n")}) as url:
        assert open_adapter(url, HttpClient(), "sglang").counters().transfer_failures is None
