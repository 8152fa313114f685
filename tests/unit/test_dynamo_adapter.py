"""The Dynamo adapter and router on bodies copied from NVIDIA Dynamo 1.6.1 (tests/fixtures/dynamo,
captured by tests/capture_fixtures.py from examples/specs/dynamo-*-cpu.yaml): a worker's system port
read as the engine (its pool, its role as Dynamo states it, its context and version from its log),
the frontend as the entry (its refusals classified from their details, the probes' token ids from
its own tokenization) and as the router that states the served context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from static_server import static_server
from support.cli import invoke

from kvpreflight._internal.engines import open_adapter
from kvpreflight._internal.engines.dynamo import DynamoAdapter
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.routers import open_router
from kvpreflight._internal.routers.dynamo import DynamoFrontend
from kvpreflight.model import ErrorKind, Role, RoleSource

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "dynamo"
JSON = "application/json"


def body(name: str) -> str:
    return (FIX / name).read_text()


def worker_routes(kind: str, name: str) -> dict[str, Any]:
    return {"GET /health": (200, JSON, body(f"{kind}_{name}_health.json")),
            "GET /metrics": (200, "text/plain", body(f"{kind}_{name}_metrics.txt"))}


def frontend_routes(kind: str, completion: Any = None) -> dict[str, Any]:
    routes: dict[str, Any] = {"GET /health": (200, JSON, body(f"{kind}_frontend_health.json")),
                              "GET /v1/models": (200, JSON, body(f"{kind}_frontend_models.json")),
                              "GET /metrics": (200, "text/plain", body(f"{kind}_frontend_metrics.txt"))}
    if completion is not None:
        routes["POST /v1/completions"] = completion
    return routes


@pytest.mark.parametrize("kind,name,role,pool", [
    ("agg", "worker", Role.UNIFIED, 2304), ("pd", "prefill", Role.PREFILL, 4352), ("pd", "decode", Role.DECODE, 2304)])
def test_a_worker_is_read_from_its_system_port_and_log(kind: str, name: str, role: Role, pool: int) -> None:
    with static_server(worker_routes(kind, name)) as url:
        adapter = open_adapter(url, HttpClient())  # auto-detected
        snap = adapter.snapshot(log_text=body(f"{kind}_{name}_startup.log"))
        counters = adapter.counters()
    assert isinstance(adapter, DynamoAdapter) and snap.engine == "dynamo"
    assert (snap.role, snap.role_source) == (role, RoleSource.ENGINE)
    assert snap.pool_tokens() == pool and {r.origin.value for r in snap.pool_readings} == {"scheduler", "allocator"}
    assert snap.served_context == 1024 and snap.model == "tiny-llama" and snap.page_size == 128
    assert snap.settings["vllm_version"] == "0.32.0" and snap.prefix_caching is True
    assert counters.requests is not None and counters.used_tokens is not None
    # NIXL is named by its metrics (vLLM's start-up line under Dynamo names no connector); the
    # prefill holds a decode's KV for the NIXL lease
    assert ("kv_transfer_config" in snap.settings) is (kind == "pd")
    assert (snap.kv_lease is not None) is (role is Role.PREFILL)


def test_without_its_log_a_worker_has_no_context_and_the_frontend_states_it() -> None:
    with static_server(worker_routes("pd", "decode")) as worker, static_server(frontend_routes("pd")) as frontend:
        snap = DynamoAdapter(worker, HttpClient()).snapshot()
        router = open_router(frontend, HttpClient())
        assert isinstance(router, DynamoFrontend)
        listing = router.listing()
    assert snap.served_context is None and snap.role is Role.DECODE
    assert listing.workers == () and listing.served_context == 1024
    applied = listing.applied_to(snap)
    assert applied.served_context == 1024 and any("as stated by the dynamo router" in n for n in applied.notes)
    assert "DYN_SYSTEM_PORT" in (listing.unlisted or "")


def test_the_frontend_given_as_an_engine_says_where_it_belongs() -> None:
    with static_server(frontend_routes("pd")) as url, pytest.raises(EngineError, match="is a Dynamo frontend, not a worker"):
        DynamoAdapter(url, HttpClient()).snapshot()


@pytest.mark.parametrize("name", ["pd_overlength_400.json", "pd_overlength_stream_400.json",
                                  "pd_prompt_plus_max_tokens_400.json", "agg_overlength_400.json"])
def test_the_frontends_length_refusal_is_a_length_error_by_its_details(name: str) -> None:
    refusal = body(name)
    assert json.loads(refusal)["details"]["type"] == "context_length"  # the recorded body as Dynamo sent it
    with static_server(frontend_routes("pd", (400, JSON, refusal))) as url:
        c = DynamoAdapter(url, HttpClient(), model="tiny-llama").complete([65] * 1025, max_tokens=8, stream="stream" in name,
                                                                          timeout_s=5)
    assert c.rejected and c.error_kind is ErrorKind.LENGTH and not c.served, c


def test_an_invalid_token_refusal_says_nothing_of_length() -> None:
    refusal = body("pd_out_of_vocabulary_400.json")
    assert "details" not in json.loads(refusal)
    with static_server(frontend_routes("pd", (400, JSON, refusal))) as url:
        c = DynamoAdapter(url, HttpClient(), model="tiny-llama").complete([999999], max_tokens=4, stream=False, timeout_s=5)
    assert c.rejected and c.error_kind is not ErrorKind.LENGTH


def test_token_ids_are_the_frontends_own_tokenization() -> None:
    seen: list[dict[str, Any]] = []

    def tokenizing(request: dict[str, Any]) -> tuple[int, str, str]:
        seen.append(request)
        return 200, JSON, body("pd_tokenizing_200.json")

    with static_server(frontend_routes("pd", tokenizing)) as url:
        ids = DynamoAdapter(url, HttpClient(), model="tiny-llama").token_ids(40, "hello world hello")
    hello = [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 32, 104, 101, 108, 108, 111]
    assert ids == (hello * 3)[:40]
    assert seen[0]["nvext"] == {"extra_fields": ["engine_data"]} and seen[0]["prompt"] == "hello world hello"


def test_an_answer_without_engine_data_cannot_give_token_ids() -> None:
    plain = json.loads(body("pd_tokenizing_200.json"))
    del plain["nvext"]
    with static_server(frontend_routes("pd", (200, JSON, plain))) as url, pytest.raises(EngineError, match="prompt_token_ids"):
        DynamoAdapter(url, HttpClient(), model="tiny-llama").token_ids(10, "x")


def test_the_frontend_alone_is_exit_2_naming_the_workers_system_ports() -> None:
    with static_server(frontend_routes("pd")) as url:
        proc = invoke("check", "--entry", url, "--capacity-only")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Dynamo's frontend names its workers by instance id" in proc.stderr and "DYN_SYSTEM_PORT" in proc.stderr


def test_capacity_only_through_the_frontend_reads_both_workers_and_sends_nothing() -> None:
    with static_server(frontend_routes("pd")) as entry, static_server(worker_routes("pd", "prefill")) as prefill, \
            static_server(worker_routes("pd", "decode")) as decode:
        proc = invoke("check", "--entry", entry, "--endpoint", prefill, "--endpoint", decode, "--capacity-only",
                      "--format", "json")
    report = json.loads(proc.stdout)
    engines = {e["role"]: e for e in report["engines"]}
    assert set(engines) == {"prefill", "decode"} and {e["context_length"] for e in engines.values()} == {1024}, engines
    capacity = [c for c in report["checks"] if c["id"] == "kv-capacity"]
    assert [c["status"] for c in capacity] == ["pass", "pass"], capacity
    # Dynamo's open cancel hazard (checks/advisories/dynamo.yaml) holds for every P/D deployment: a warning
    advisories = [c for c in report["checks"] if c["id"] == "engine-advisories"]
    assert [c["status"] for c in advisories] == ["warn", "warn"] and "KVPF-DYNAMO-2026-001" in advisories[0]["message"]
    probes = {c["id"]: c["status"] for c in report["checks"] if c["id"] in ("overcapacity-rejected", "tenant-isolation")}
    assert probes == {"overcapacity-rejected": "skip", "tenant-isolation": "skip"} and proc.returncode == 0, report["checks"]


def test_a_worker_the_frontend_routes_to_and_nobody_named_is_inconclusive() -> None:
    with static_server(frontend_routes("pd")) as entry, static_server(worker_routes("pd", "decode")) as decode:
        proc = invoke("check", "--entry", entry, "--endpoint", decode, "--capacity-only", "--format", "json")
    report = json.loads(proc.stdout)
    unread = [c for c in report["checks"] if c["id"] == "kv-capacity" and c["status"] == "inconclusive"]
    assert len(unread) == 1 and "routes to the worker prefill " in unread[0]["message"], report["checks"]
    assert "DYN_SYSTEM_PORT" in unread[0]["message"] and proc.returncode == 3


def test_an_aggregated_deployment_carries_no_prefill_cancel_advisory() -> None:
    with static_server(frontend_routes("agg")) as entry, static_server(worker_routes("agg", "worker")) as worker:
        proc = invoke("check", "--entry", entry, "--endpoint", worker, "--capacity-only", "--format", "json")
    report = json.loads(proc.stdout)
    advisories = [c for c in report["checks"] if c["id"] == "engine-advisories"]
    assert [c["status"] for c in advisories] == ["pass"] and proc.returncode == 0, report["checks"]
