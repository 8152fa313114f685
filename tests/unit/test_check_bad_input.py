"""Bad input never passes and never shows a traceback: one line, exit 2 (usage) or 3 (could not measure)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from static_server import static_server
from support.cli import invoke

FIX = Path(__file__).parents[1] / "fixtures" / "sglang"
JSON = "application/json"


def run(*args: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:

    return invoke(*args, env=(env or {}))


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-800:], proc.stderr[-800:])
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kvpreflight: error:")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0]


def sglang_routes(**overrides):
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    routes = {
        "GET /health": (200, JSON, b""),
        "GET /server_info": (200, JSON, info),
        "GET /v1/models": (200, JSON, (FIX / "v1_models.json").read_text()),
        "GET /metrics": (200, "text/plain", (FIX / "metrics_prefill.txt").read_text()),
    }
    routes.update(overrides)
    return routes


def report_of(proc) -> dict:
    return json.loads(proc.stdout)


@pytest.mark.parametrize("args,fragments", [
    (["check"], ["--endpoint"]),
    (["check", "--endpoint", "prefil=http://x:1"], ["unknown role"]),
    (["check", "--endpoint", "ftp://x"], ["http(s) URL"]),
    (["check", "--endpoint", "http://x:1", "--skip", "kv-capacity"], ["--reason"]),
    (["check", "--endpoint", "http://x:1", "--skip", "no-such-check", "--reason", "r"], ["no such check"]),
    (["check", "--endpoint", "http://x:1", "--api-key-env", "KVPF_TEST_UNSET_VAR"], ["KVPF_TEST_UNSET_VAR"]),
    (["check", "--endpoint", "http://x:1", "--log", "http://x:1=/no/such/file"], ["not a readable file"]),
    (["check", "--endpoint", "http://x:1", "--format", "yaml"], ["--format"]),
    (["check", "--endpoint", "http://x:1", "--timeout", "-1"], ["--timeout"]),
    (["check", "--endpoint", "http://x:1", "--scenario", "late"], ["--scenario 'late'", "late-decode"]),
    (["check", "--endpoint", "http://x:1", "--record", "r.json"], ["--sign-key"]),
])
def test_usage_errors_exit_2_before_anything_is_sent(args, fragments):
    assert_one_line_error(run(*args), 2, *fragments)


def test_unreachable_endpoint_is_inconclusive_with_the_reason():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = run("check", "--endpoint", f"http://127.0.0.1:{port}", "--format", "json")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    (result,) = report_of(proc)["checks"]
    assert result["status"] == "inconclusive" and "Connection refused" in result["message"]


def test_redirect_to_another_host_is_not_followed():
    with static_server({"GET /health": (302, JSON, b"")}) as url:
        proc = run("check", "--endpoint", url, "--format", "json")
    assert proc.returncode == 3
    assert "not followed" in report_of(proc)["checks"][0]["message"]


def test_tls_error_names_the_fix():
    with static_server(sglang_routes()) as url:
        proc = run("check", "--endpoint", url.replace("http://", "https://"), "--format", "json")
    assert proc.returncode == 3
    assert "TLS" in report_of(proc)["checks"][0]["message"]


@pytest.mark.parametrize("route,body,fragment", [
    ("GET /server_info", (200, JSON, b"<html>not json</html>"), "not JSON"),
    ("GET /metrics", (200, "text/plain", "sglang:max_total_num_tokens{tp_rank=\"0\" 681280\n"), "malformed Prometheus"),
    ("GET /v1/models", (200, JSON, b'{"object": "list", "data": [{"id": "m", "max_model_len": -5}]}'), "not a plausible token count"),
])
def test_broken_engine_answers_are_inconclusive_never_pass(route, body, fragment):
    routes = sglang_routes(**{route: body})
    with static_server(routes) as url:
        proc = run("check", "--endpoint", url, "--engine", "sglang", "--capacity-only", "--format", "json")
    assert proc.returncode == 3, proc.stdout[-500:]
    assert "Traceback" not in proc.stderr
    assert any(fragment in c["message"] for c in report_of(proc)["checks"])


def test_absurd_pool_is_refused():
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    info["max_total_num_tokens"] = 10**15
    with static_server(sglang_routes(**{"GET /server_info": (200, JSON, info)})) as url:
        proc = run("check", "--endpoint", url, "--capacity-only", "--format", "json")
    assert proc.returncode == 3
    assert "plausible" in report_of(proc)["checks"][0]["message"]


def test_an_engine_that_hangs_on_the_probe_fails_within_the_timeout(tmp_path):
    """/generate accepts the connection and never answers: a hang is a failure, bounded by --timeout."""
    hang = threading.Event()

    def never(_body):
        hang.wait(20)
        return (200, JSON, b"{}")

    info = json.loads((FIX / "server_info_prefill.json").read_text())
    info.update({"disaggregation_mode": None, "max_total_num_tokens": 4096, "max_req_input_len": 4090,
                 "context_length": 2048, "internal_states": []})
    models = {"object": "list", "data": [{"id": "m", "max_model_len": 2048}]}
    tokens = {"tokens": [5, 6, 7, 8], "count": 4, "max_model_len": 2048}
    routes = sglang_routes(**{"GET /server_info": (200, JSON, info), "GET /v1/models": (200, JSON, models),
                              "POST /tokenize": (200, JSON, tokens), "POST /generate": never})
    routes.pop("GET /metrics")
    try:
        with static_server(routes) as url:
            proc = run("check", "--endpoint", url, "--timeout", "1", "--accepted-tokens-per-second", "100000",
                       "--format", "json", timeout=120)
    finally:
        hang.set()
    assert proc.returncode == 1
    over = next(c for c in report_of(proc)["checks"] if c["id"] == "overcapacity-rejected")
    assert over["status"] == "fail" and "hang" in over["message"]


# -- --entry alone: the router names the engines, or the user must ------------------------------

def test_entry_alone_that_is_no_router_is_a_usage_error_naming_endpoint():
    with static_server(sglang_routes()) as url:
        proc = run("check", "--entry", url, "--timeout", "5")
    assert_one_line_error(proc, 2, f"--entry {url} is not a router kvpreflight can ask for its workers",
                          "add --endpoint URL (or ROLE=URL)")


def test_entry_alone_whose_router_lists_no_workers_is_a_usage_error_naming_endpoint():
    with static_server({"GET /workers": (200, JSON, {"workers": [], "total": 0})}) as url:
        proc = run("check", "--entry", url, "--timeout", "5")
    assert_one_line_error(proc, 2, "router lists no workers (GET /workers)",
                          "add --endpoint prefill=URL and --endpoint decode=URL")


def test_neither_endpoint_nor_entry_names_both():
    proc = run("check")
    assert_one_line_error(proc, 2, "no --endpoint given", "--entry ROUTER")


def test_a_wrong_engine_kind_names_the_engine_that_answered():
    with static_server(sglang_routes()) as url:
        proc = run("check", "--endpoint", url, "--engine", "vllm", "--capacity-only", "--format", "json")
    assert proc.returncode == 3
    (result,) = report_of(proc)["checks"]
    assert "it answers as sglang, not vllm: pass --engine sglang or drop --engine" in result["message"], result["message"]
