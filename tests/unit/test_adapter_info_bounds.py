"""What every adapter reads before it probes (/server_info, /version, /v1/models, /props, /slots,
/info, /health, /metrics) is bounded like every other reply (issue 12): each JSON info body by the
JSON-info cap and each /metrics by the metrics cap, naming the cap; every wait by the client's
--timeout, not a constant of the adapter's; and a 200 of the wrong shape is one line naming the
field (nothing measured: inconclusive), never a traceback and never a number made up from it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from static_server import static_server
from support.cli import invoke
from support.engine_routes import FIXTURES, JSON, KINDS, METRICS, info_paths, info_routes

from kvpreflight._internal.engines import adapter_class, open_adapter
from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.engines.http import BodyTooLarge, EngineTimeout, HttpClient
from kvpreflight.model import EngineSnapshot

TIMEOUT_S = 1.0
GRACE_S = 2.0
HANG_S = 30  # longer than any of the adapters' old fixed timeouts (10-15 s)
MiB = 1 << 20


def snapshot(kind: str, url: str, timeout_s: float = 5.0) -> EngineSnapshot:
    return adapter_class(kind)(url, HttpClient(timeout_s=timeout_s)).snapshot()


def _json(path: str) -> Any:
    return json.loads((FIXTURES / path).read_text())


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_reads_its_honest_fixtures(kind: str) -> None:
    """The baseline the tests below break one route of."""
    with static_server(info_routes(kind)) as url:
        assert open_adapter(url, HttpClient(timeout_s=5)).kind == kind
        snap = snapshot(kind, url)
    if kind == "trtllm":  # it states its max_seq_len and its GPU pool only in its start-up log
        assert snap.served_context is None and not snap.pool_readings and any("--log" in n for n in snap.notes)
    else:
        assert snap.served_context and snap.pool_readings


# -- size: the cap of each kind of body ------------------------------------------------------------

@pytest.mark.parametrize("kind,route", [(k, r) for k in KINDS for r in info_paths(k) if (k, r) != ("llamacpp", "GET /v1/models")])
def test_a_json_info_body_over_4_mib_is_refused_naming_the_json_info_cap(kind: str, route: str) -> None:
    huge = b'{"padding": "' + b"x" * (5 * MiB) + b'"}'
    with static_server(info_routes(kind, **{route: (200, JSON, huge)})) as url:
        with pytest.raises(BodyTooLarge) as caught:
            snapshot(kind, url)
    assert "4.0 MiB limit for JSON info" in str(caught.value), caught.value
    assert caught.value.exit_code == 3


def test_llamacpp_model_list_over_its_cap_only_costs_the_model_name() -> None:
    huge = b'{"padding": "' + b"x" * (5 * MiB) + b'"}'
    with static_server(info_routes("llamacpp", **{"GET /v1/models": (200, JSON, huge)})) as url:
        snap = snapshot("llamacpp", url)
    assert snap.model is None and "/v1/models unreadable" in snap.notes


@pytest.mark.parametrize("kind", KINDS)
def test_metrics_over_16_mib_are_refused_naming_the_metrics_cap(kind: str) -> None:
    huge = b"# HELP padding\n" * (17 * MiB // 15)
    route = f"GET {adapter_class(kind).metrics_path}"  # trtllm-serve: /prometheus/metrics
    with static_server(info_routes(kind, **{route: (200, METRICS, huge)})) as url:
        with pytest.raises(BodyTooLarge) as caught:
            adapter_class(kind)(url, HttpClient(timeout_s=5)).counters()  # what every probe reads, before and after
    assert "16.0 MiB limit for metrics text" in str(caught.value), caught.value


# -- time: every read waits --timeout, no longer ---------------------------------------------------

def _hanging(release: threading.Event) -> Callable[[dict], tuple]:
    def answer(_body: dict) -> tuple:
        release.wait(HANG_S)
        return 200, JSON, b"{}"
    return answer


@pytest.mark.parametrize("kind,route", [("sglang", "GET /server_info"), ("llamacpp", "GET /slots"), ("tgi", "GET /info"),
                                        ("vllm", "GET /metrics")])
def test_an_info_endpoint_that_hangs_is_given_the_timeout_not_a_fixed_15_s(kind: str, route: str) -> None:
    release = threading.Event()
    try:
        with static_server(info_routes(kind, **{route: _hanging(release)})) as url:
            start = time.monotonic()
            with pytest.raises(EngineTimeout) as caught:
                snapshot(kind, url, timeout_s=TIMEOUT_S)
            elapsed = time.monotonic() - start
    finally:
        release.set()
    assert f"within {TIMEOUT_S:g}s" in str(caught.value)
    assert elapsed <= TIMEOUT_S + GRACE_S, elapsed


def test_detection_stops_at_the_first_endpoint_that_hangs() -> None:
    """Asking each kind in turn would wait once per kind (and once per path): one timeout ends it,
    and the message says how to skip detection."""
    release = threading.Event()
    try:
        with static_server(info_routes("sglang", **{"GET /server_info": _hanging(release)})) as url:
            start = time.monotonic()
            with pytest.raises(EngineTimeout) as caught:
                open_adapter(url, HttpClient(timeout_s=TIMEOUT_S))
            elapsed = time.monotonic() - start
    finally:
        release.set()
    assert "--engine KIND" in str(caught.value)
    assert elapsed <= TIMEOUT_S + GRACE_S, elapsed


def test_a_health_check_that_hangs_is_unhealthy_within_the_timeout() -> None:
    release = threading.Event()
    try:
        with static_server(info_routes("vllm", **{"GET /health": _hanging(release)})) as url:
            adapter = adapter_class("vllm")(url, HttpClient(timeout_s=TIMEOUT_S))
            start = time.monotonic()
            assert adapter.healthy() is False
            elapsed = time.monotonic() - start
    finally:
        release.set()
    assert elapsed <= TIMEOUT_S + GRACE_S, elapsed


# -- shape: a 200 of the wrong shape names the field -----------------------------------------------

SGLANG_INFO = _json("sglang/server_info_prefill.json")
TGI_INFO = _json("tgi/info.json")

WRONG_SHAPES = [
    ("sglang", "GET /server_info", [], "/server_info answer is a list, not a JSON object"),
    ("sglang", "GET /server_info", {**SGLANG_INFO, "internal_states": "busy"}, "/server_info internal_states is a string"),
    ("sglang", "GET /server_info", {**SGLANG_INFO, "internal_states": [{"memory_usage": [4096]}]},
     "/server_info internal_states[0].memory_usage is a list"),
    ("sglang", "GET /server_info", {**SGLANG_INFO, "max_total_num_tokens": True}, "max_total_num_tokens is true/false"),
    ("sglang", "GET /v1/models", {"object": "list", "data": ["default"]}, "/v1/models data[0] is a string"),
    ("sglang", "GET /v1/models", {"object": "list", "data": [{"id": 7}]}, "/v1/models data[0].id is a number"),
    ("sglang", "GET /metrics", 'sglang:max_total_num_tokens{tp_rank="0"} +Inf\n', "sglang:max_total_num_tokens is not a number"),
    ("vllm", "GET /version", ["0.32.0"], "/version answer is a list"),
    ("vllm", "GET /v1/models", {"object": "list", "data": {"id": "m"}}, "/v1/models data is an object, not a JSON list"),
    ("vllm", "GET /metrics", 'vllm:cache_config_info{kv_cache_size_tokens="1e999"} 1.0\n', "kv_cache_size_tokens is not a number"),
    ("llamacpp", "GET /props", '"ready"', "/props answer is a string"),
    ("llamacpp", "GET /props", {"default_generation_settings": [1024]}, "/props default_generation_settings is a list"),
    ("llamacpp", "GET /slots", {"slots": []}, "/slots answer is an object, not a JSON list"),
    ("llamacpp", "GET /slots", [{"id": 0, "n_ctx": True}], "/slots[0].n_ctx is true/false"),
    ("llamacpp", "GET /slots", [{"id": "zero", "n_ctx": 1024}], "/slots[0].id = 'zero' is not a slot number"),
    ("tgi", "GET /info", [TGI_INFO], "/info answer is a list"),
    ("tgi", "GET /info", {**TGI_INFO, "model_id": ["a", "b"]}, "/info model_id is a list, not a string"),
    ("tgi", "GET /metrics", "tgi_batch_max_total_tokens NaN\n", "tgi_batch_max_total_tokens is not a number"),
]


@pytest.mark.parametrize("kind,route,body,fragment", WRONG_SHAPES,
                         ids=[f"{k}-{r.split()[1]}-{i}" for i, (k, r, _, _) in enumerate(WRONG_SHAPES)])
def test_a_200_of_the_wrong_shape_is_one_line_naming_the_field(kind: str, route: str, body: Any, fragment: str) -> None:
    ctype = METRICS if route.endswith("/metrics") else JSON
    with static_server(info_routes(kind, **{route: (200, ctype, body)})) as url:
        with pytest.raises(EngineError) as caught:
            snapshot(kind, url)
    message = str(caught.value)
    assert fragment in message, message
    assert caught.value.exit_code == 3 and "\n" not in message and len(message) < 300


def test_a_value_quoted_in_a_message_is_cut_short() -> None:
    info = {**TGI_INFO, "max_total_tokens": "9" * 100_000}
    with static_server(info_routes("tgi", **{"GET /info": (200, JSON, info)})) as url:
        with pytest.raises(EngineError) as caught:
            snapshot("tgi", url)
    assert "/info max_total_tokens" in str(caught.value) and len(str(caught.value)) < 300


def test_check_reports_a_wrong_shape_as_inconclusive_naming_the_field() -> None:
    """As a user sees it: `kvpreflight check` exits 3 with the field in the report, no traceback."""
    routes = info_routes("vllm", **{"GET /version": (200, JSON, ["0.32.0"])})
    with static_server(routes) as url:
        proc = invoke("check", "--endpoint", url, "--engine", "vllm", "--capacity-only",
                               "--format", "json", "--timeout", "5")
    assert proc.returncode == 3, proc.stderr[-800:]
    assert "Traceback" not in proc.stderr
    messages = " ".join(c["message"] for c in json.loads(proc.stdout)["checks"])
    assert "/version answer is a list, not a JSON object" in messages
