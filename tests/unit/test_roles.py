"""Roles without overrides: what each engine says (SGLang's disaggregation_mode, vLLM's kv_role
in its start-up log or its consumer-only metric), what the router in front of them lists
(GET /workers, the shape smg 1.13.0, vllm-router 0.1.17 and the builtin router were seen to
answer), and where each role came from, through the JSON report and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from static_server import static_server, vllm_routes

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.vllm import LEASE_SETTING, VllmAdapter
from kvpreflight._internal.routers import open_router
from kvpreflight._internal.routers.interface import RouterListing, RouterWorker, workers_listed
from kvpreflight.formats import get_format
from kvpreflight.model import EngineSnapshot, KvDeadline, Report, Role, RoleSource
from kvpreflight.schema import report_from_dict, report_to_dict

FIX = Path(__file__).resolve().parents[1] / "fixtures"
JSON = "application/json"
# vllm-router 0.1.17's GET /workers, seen live in front of a prefill/decode pair (URLs shortened).
VLLM_ROUTER_WORKERS = {"workers": [
    {"url": "http://d:2", "model_id": "unknown", "worker_type": "decode", "is_healthy": True, "load": 0,
     "connection_mode": "Http", "priority": 50, "cost": 1.0},
    {"url": "http://p:1", "model_id": "unknown", "worker_type": "prefill", "is_healthy": True, "load": 0,
     "connection_mode": "Http", "priority": 50, "cost": 1.0, "bootstrap_port": None}],
    "total": 2, "stats": {"prefill_count": 1, "decode_count": 1, "regular_count": 0}}


@pytest.mark.parametrize("line,role", [
    ("(APIServer pid=1) INFO 11-30 17:00:00 [utils.py:253] non-default args: {'model': 'tiny', 'kv_transfer_config': "
     "KVTransferConfig(kv_connector='NixlConnector', engine_id='x', kv_buffer_device='cpu', kv_role='kv_producer')}",
     Role.PREFILL),
    ("non-default args: {'kv_transfer_config': KVTransferConfig(kv_connector='NixlConnector', kv_role='kv_consumer')}",
     Role.DECODE),
    ('--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_both"}', Role.UNIFIED),
])
def test_vllm_role_comes_from_its_kv_role(line: str, role: Role) -> None:
    with static_server(vllm_routes()) as url:
        snap = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot(log_text=line + "\n")
    assert (snap.role, snap.role_source) == (role, RoleSource.ENGINE)


@pytest.mark.parametrize("line,lease", [
    # entrypoints/utils.py log_non_default_args prints the KVTransferConfig dataclass; nixl/base_scheduler.py
    # reads kv_connector_extra_config["kv_lease_duration"], default 30 (vLLM 0.32's wheel).
    ("non-default args: {'kv_transfer_config': KVTransferConfig(kv_connector='NixlConnector', engine_id='x', "
     "kv_role='kv_producer', kv_connector_extra_config={'kv_lease_duration': 6})}",
     KvDeadline(seconds=6, setting=LEASE_SETTING, stated=True)),
    ('--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
     KvDeadline(seconds=30, setting=LEASE_SETTING, stated=False)),
    ("non-default args: {'kv_transfer_config': KVTransferConfig(kv_connector='NixlConnector', kv_role='kv_consumer')}", None),
    ("non-default args: {'model': 'tiny'}", None),
])
def test_vllm_reads_the_prefills_kv_lease_from_its_start_up_line(line: str, lease: KvDeadline | None) -> None:
    with static_server(vllm_routes()) as url:
        snap = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot(log_text=line + "\n")
    assert snap.kv_lease == lease


def test_vllm_decode_is_told_by_its_consumer_only_metric_and_a_plain_one_is_assumed_unified() -> None:
    metrics = (FIX / "vllm" / "metrics.txt").read_text()
    consumer = metrics + ('# HELP vllm:num_requests_kv_fetch_by_stage Number of waiting requests by async KV load stage.\n'
                          '# TYPE vllm:num_requests_kv_fetch_by_stage gauge\n'
                          'vllm:num_requests_kv_fetch_by_stage{engine="0",model_name="tiny",stage="in_progress"} 0.0\n')
    with static_server(vllm_routes(consumer)) as url:
        decode = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot()
        overridden = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot(role=Role.PREFILL)
    with static_server(vllm_routes()) as url:
        plain = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot()
    assert (decode.role, decode.role_source) == (Role.DECODE, RoleSource.ENGINE)
    assert (plain.role, plain.role_source) == (Role.UNIFIED, RoleSource.ASSUMED)
    assert (overridden.role, overridden.role_source) == (Role.PREFILL, RoleSource.OVERRIDE)
    assert "role prefill given on the command line; the engine reports decode" in overridden.notes


def test_vllm_router_is_recognised_and_its_workers_read() -> None:
    routes = {"GET /workers": (200, JSON, VLLM_ROUTER_WORKERS),
              "GET /list_workers": (200, JSON, {"urls": ["http://d:2", "http://p:1"]})}
    with static_server(routes) as url:
        router = open_router(url, HttpClient(timeout_s=5))
        assert router is not None and router.kind == "vllm-router"
        listing = router.listing()
    assert listing.workers == (RouterWorker("http://d:2", Role.DECODE), RouterWorker("http://p:1", Role.PREFILL))


def test_an_engine_is_no_router() -> None:
    with static_server(vllm_routes()) as url:
        assert open_router(url, HttpClient(timeout_s=5)) is None


def test_a_worker_of_unknown_type_is_an_error_not_a_guess() -> None:
    with pytest.raises(EngineError, match="worker_type 'encode'"):
        workers_listed({"workers": [{"url": "http://e:1", "worker_type": "encode"}]}, "http://r:9")
    assert workers_listed({"workers": [{"url": "http://e:1/", "worker_type": "regular"}]}, "http://r:9") == (
        RouterWorker("http://e:1", Role.UNIFIED),)


def snap(url: str, role: Role, source: RoleSource) -> EngineSnapshot:
    return EngineSnapshot(url=url, engine="vllm", version="0.32.0", role=role, model="tiny", served_context=1024,
                          role_source=source)


def test_the_router_fills_an_assumed_role_and_never_overrides_a_stated_one() -> None:
    listing = RouterListing("vllm-router", "http://r:9", "GET /workers",
                            (RouterWorker("http://p:1", Role.PREFILL), RouterWorker("http://d:2", Role.DECODE)))
    filled = listing.applied_to(snap("http://p:1", Role.UNIFIED, RoleSource.ASSUMED))
    assert (filled.role, filled.role_source) == (Role.PREFILL, RoleSource.ROUTER)
    assert filled.notes == ("role prefill as listed by the vllm-router router at http://r:9 (GET /workers)",)
    kept = listing.applied_to(snap("http://d:2", Role.PREFILL, RoleSource.OVERRIDE))
    assert (kept.role, kept.role_source) == (Role.PREFILL, RoleSource.OVERRIDE)
    assert "lists it as decode; kept prefill (override)" in kept.notes[0]
    unlisted = snap("http://x:3", Role.UNIFIED, RoleSource.ASSUMED)
    assert listing.applied_to(unlisted) is unlisted


def test_role_source_travels_through_json_and_the_table() -> None:
    report = Report(tool_version="t", engines=(snap("http://p:1", Role.PREFILL, RoleSource.ROUTER),), checks=())
    data = report_to_dict(report)
    assert data["engines"][0]["role_source"] == "router"
    assert report_from_dict(json.loads(json.dumps(data))).engines[0].role_source is RoleSource.ROUTER
    del data["engines"][0]["role_source"]  # a report written before roles were inferred
    assert report_from_dict(data).engines[0].role_source is RoleSource.ASSUMED
    assert "prefill (router: the router lists it)" in get_format("table").render(report)
    assert "prefill (router: the router lists it)" in get_format("markdown").render(report)
