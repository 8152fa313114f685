"""Boot specs: every shipped example parses; every bad input is one line naming the field, exit 2;
placeholders and defaults come out as a user would expect."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from kvpreflight.boot import BootError, load_spec, parse_spec
from kvpreflight.boot import launch as plan_module
from kvpreflight.boot.launch import plan_deployment
from kvpreflight.boot.spec import PLACEHOLDER

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "specs").glob("*.yaml"))

GOOD_ENGINE = {"name": "e", "role": "unified", "port": 8000, "command": "srv --port {port}"}


def spec(**top):
    data = {"deployment": "d", "engines": [GOOD_ENGINE]}
    data.update(top)
    return data


def with_engine(**fields):
    return spec(engines=[{**GOOD_ENGINE, **fields}])


def test_examples_ship_for_every_engine_kind():
    names = {path.name for path in EXAMPLES}
    assert {"sglang-pd-8gpu.yaml", "vllm-single.yaml", "llamacpp.yaml", "builtin-pd.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_and_plans(path, monkeypatch):
    monkeypatch.setattr("kvpreflight.boot.launch.port_in_use", lambda port, host="127.0.0.1": False)
    parsed = load_spec(path)
    plan = plan_deployment(parsed)
    assert parsed.deployment and parsed.engines
    assert plan.entry_url.startswith("http://127.0.0.1:")
    for launch in plan.engines:
        left = [text for text in (*launch.argv, *launch.env.values(), launch.url, launch.ready_url)
                if PLACEHOLDER.search(text)]
        assert not left, f"placeholders not filled in: {left}"


def test_sglang_pd_example_is_the_incident_shape(monkeypatch):
    monkeypatch.setattr("kvpreflight.boot.launch.port_in_use", lambda port, host="127.0.0.1": False)
    parsed = load_spec(next(p for p in EXAMPLES if p.name == "sglang-pd-8gpu.yaml"))
    prefill, decode, router = parsed.engines
    assert (prefill.role, decode.role, router.role) == ("prefill", "decode", "router")
    assert prefill.gpus == ("0", "1", "2", "3") and decode.gpus == ("4", "5", "6", "7")
    assert "mooncake" in prefill.command and "--tp-size" in prefill.command
    assert parsed.entry == "router" and parsed.context_length == 131072
    launch = {e.name: e for e in plan_deployment(parsed).engines}
    assert launch["router"].argv[-9:-3] == ("--prefill", "http://127.0.0.1:30000", "8998",
                                            "--decode", "http://127.0.0.1:30001", "--host")
    assert launch["decode"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_vllm_pd_example_runs_nixl_producer_and_consumer_behind_vllm_router(monkeypatch):
    monkeypatch.setattr("kvpreflight.boot.launch.port_in_use", lambda port, host="127.0.0.1": False)
    parsed = load_spec(next(p for p in EXAMPLES if p.name == "vllm-pd-nixl.yaml"))
    launch = {e.name: e for e in plan_deployment(parsed).engines}
    assert parsed.entry == "router" and parsed.context_length == 1024
    roles = {}
    for name in ("prefill", "decode"):
        argv = launch[name].argv
        roles[name] = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"]
        assert argv[argv.index("--max-model-len") + 1] == "1024"
        # the decode's pool 18 x 128 tokens, the prefill's 16 blocks more for the KV abandoned
        # requests pin for its lease; VLLM_CPU_KVCACHE_SPACE would silently override them (see the spec)
        blocks = {"prefill": 34, "decode": 18}[name]
        assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(blocks * 128 * 512)
        assert "VLLM_CPU_KVCACHE_SPACE" not in launch[name].env
    assert roles == {"prefill": "kv_producer", "decode": "kv_consumer"}
    # the prefill's KV lease, stated: vLLM's 30 s default (a longer one lengthened this host's decode waits: see the spec)
    prefill = launch["prefill"].argv
    config = json.loads(prefill[prefill.index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"] == {"kv_lease_duration": 30}
    # two NIXL side channels on one host need two ports; one OpenMP thread each (see the spec)
    env = {name: launch[name].env for name in ("prefill", "decode")}
    assert env["prefill"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] != env["decode"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert env["prefill"]["OMP_NUM_THREADS"] == env["decode"]["OMP_NUM_THREADS"] == "1"
    router = launch["router"].argv
    assert router[0] == "vllm-router" and "--vllm-pd-disaggregation" in router
    assert router[router.index("--prefill") + 1] == launch["prefill"].url
    assert router[router.index("--decode") + 1] == launch["decode"].url


def test_placeholders_defaults_and_gpus(tmp_path):
    parsed = parse_spec({
        "deployment": "pd",
        "context_length": 4096,
        "engines": [
            {"name": "p", "role": "prefill", "port": "auto", "gpus": [0, 1],
             "command": ["{python}", "-m", "srv", "--port", "{port}", "--json", '{"a": 1}']},
            {"name": "d", "role": "decode", "port": "auto", "gpus": "2, 3", "ready_url": "/ready",
             "command": "srv --port {port} --host {host}", "env": {"PEER": "{p.url}", "N": 4}},
            {"name": "r", "role": "router", "url": "http://127.0.0.1:{port}", "port": "auto",
             "command": "router --prefill {p.url} --decode {d.url} --port {port}", "cwd": "sub"},
        ],
        "checks": {"skip": [{"id": "tenant-isolation", "reason": "no cancel on this engine"}]},
    }, source="pd.yaml", base_dir=str(tmp_path))
    assert parsed.entry == "r"  # the only router is the entry by default
    assert parsed.checks.skip[0].check_id == "tenant-isolation"
    assert parsed.engines[2].cwd == str(tmp_path / "sub")
    plan = plan_deployment(parsed)
    p, d, r = plan.engines
    assert p.argv[0] == sys.executable
    assert p.argv[4] == str(p.port) and p.argv[6] == '{"a": 1}'  # JSON braces are left alone
    assert len({p.port, d.port, r.port}) == 3
    assert p.url == f"http://127.0.0.1:{p.port}" and p.ready_url == p.url + "/health"
    assert d.ready_url == d.url + "/ready"
    assert d.argv[-1] == "127.0.0.1"
    assert d.env["PEER"] == p.url and d.env["N"] == "4"
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1" and d.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert r.argv == ("router", "--prefill", p.url, "--decode", d.url, "--port", str(r.port))
    assert plan.entry_url == r.url


@pytest.mark.parametrize("command, kind", [
    # smg's command says --backend sglang, yet it is smg
    ("/opt/smg/bin/smg launch --pd-disaggregation --prefill {p.url} 8998 --decode {d.url} --backend sglang --port {port}",
     "smg"),
    ("python -m sglang_router.launch_router --pd-disaggregation --prefill {p.url} 8998 --decode {d.url} --port {port}",
     "sglang-router"),
])
def test_sglang_routers_are_recognised_and_waited_for_until_their_workers_are(command: str, kind: str):
    parsed = parse_spec({"deployment": "pd", "engines": [
        {"name": "p", "role": "prefill", "port": "auto", "command": "srv --port {port} --disaggregation-bootstrap-port 8998"},
        {"name": "d", "role": "decode", "port": "auto", "command": "srv --port {port}"},
        {"name": "r", "role": "router", "port": "auto", "command": command},
    ]}, source="pd.yaml")
    router = parsed.engine("r")
    assert router.kind == kind
    plan = plan_deployment(parsed)
    # Both answer /health before their workers are registered; /readiness only once they are.
    assert plan.engines[2].ready_url == plan.engines[2].url + "/readiness"


def test_entry_may_be_a_url():
    parsed = parse_spec(spec(entry="http://lb.internal:8080/"))
    assert plan_deployment(parsed).entry_url == "http://lb.internal:8080"


@pytest.mark.parametrize("data, message", [
    ([1], "d.yaml: expected a mapping with deployment, context_length, entry, engines, checks, client_cert, client_key, got a list"),
    (spec(deployment=""), "d.yaml: deployment: expected a non-empty string, got ''"),
    (spec(context_length="1M"), "d.yaml: context_length: expected a positive integer, got '1M'"),
    (spec(context_length=0), "d.yaml: context_length: expected a positive integer, got a number (0)"),
    (spec(engines=[]), "d.yaml: engines: expected a non-empty list of engines, got a list"),
    (spec(enignes=[]),
     "d.yaml: enignes: unknown key (expected one of: deployment, context_length, entry, engines, checks, client_cert, client_key)"),
    (with_engine(port="x"), 'd.yaml: engines[0].port: expected an integer or "auto", got \'x\''),
    (with_engine(port=True), 'd.yaml: engines[0].port: expected an integer or "auto", got a boolean (true)'),
    (with_engine(port=70000), "d.yaml: engines[0].port: expected a port between 1 and 65535, got 70000"),
    (with_engine(role="worker"), "d.yaml: engines[0].role: expected one of unified, prefill, decode, router, got 'worker'"),
    (with_engine(name="a b"), "d.yaml: engines[0].name: 'a b' is not a valid name"),
    (with_engine(command=[]), "d.yaml: engines[0].command: is empty; give the program to start and its arguments"),
    (with_engine(command="srv 'unclosed"), "d.yaml: engines[0].command: cannot split into arguments: No closing quotation"),
    (with_engine(command=["srv", {"a": 1}]), "d.yaml: engines[0].command[1]: expected a string, got a mapping"),
    (with_engine(env=["A=1"]), "d.yaml: engines[0].env: expected a mapping of variable names to values, got a list"),
    (with_engine(env={"A-B": "1"}), "d.yaml: engines[0].env: 'A-B' is not a valid environment variable name"),
    (with_engine(gpus=[0, 0]), "d.yaml: engines[0].gpus: GPU 0 is listed twice"),
    (with_engine(gpus="zero"), "d.yaml: engines[0].gpus: expected GPU indices (0, 1, ...) or UUIDs, got 'zero'"),
    (with_engine(gpus=[0], env={"CUDA_VISIBLE_DEVICES": "1"}),
     "d.yaml: engines[0].gpus: set either gpus or env.CUDA_VISIBLE_DEVICES, not both"),
    (with_engine(url="localhost:8000"), "d.yaml: engines[0].url: expected an http:// or https:// URL, got 'localhost:8000'"),
    (with_engine(ready_url="health"),
     "d.yaml: engines[0].ready_url: expected an http(s):// URL, a path such as /health, or {url}/PATH, got 'health'"),
    (with_engine(ready_timeout_s=-1), "d.yaml: engines[0].ready_timeout_s: expected a positive number of seconds, got a number (-1)"),
    # `fake`: the unit tier registers its own engine kind (tests/unit/conftest.py)
    (with_engine(engine="trt"),
     "d.yaml: engines[0].engine: expected one of builtin, dynamo, sglang, vllm, llamacpp, tgi, trtllm, fake, auto, smg, sglang-router, "
     "got 'trt'"),
    (with_engine(engine="smg"), "d.yaml: engines[0].engine: smg is a router, not an engine: give it role: router"),
    (with_engine(gpu=[0]),
     "d.yaml: engines[0].gpu: unknown key "
     "(expected one of: name, role, command, env, gpus, port, url, ready_url, ready_timeout_s, engine, cwd)"),
    (with_engine(port=None, url=None), "d.yaml: engines[0]: needs a port (a number or auto) or a url to reach the engine at"),
    (with_engine(port=None, url="http://h:1"),
     "d.yaml: engines[0].command[2]: uses {port} but the engine has no port; add port: auto or a number"),
    (with_engine(command="srv --peer {other.url}"), "d.yaml: engines[0].command[2]: unknown placeholder {other.url}"),
    (with_engine(command="srv --x {prot}"), "d.yaml: engines[0].command[2]: unknown placeholder {prot}"),
    (with_engine(url="http://{host}:{port}"), "d.yaml: engines[0].url: the url may use only {port}, not {host}"),
    (spec(engines=[GOOD_ENGINE, GOOD_ENGINE]), "d.yaml: engines[1].name: duplicate engine name 'e'; names must be unique"),
    (spec(engines=[GOOD_ENGINE, {**GOOD_ENGINE, "name": "f"}]), "d.yaml: entry: missing, and there is no single router to default to"),
    (spec(entry="nobody"), "d.yaml: entry: expected an engine name (e) or an http(s):// URL, got 'nobody'"),
    (spec(checks={"skip": [{"id": "kv-capacity"}]}),
     "d.yaml: checks.skip[0].reason: a skipped check needs a reason (it goes into the record)"),
    # A typo in a waiver or a setting must not silently drop it (found before anything boots).
    (spec(checks={"skip": [{"id": "isolation.cancel", "reason": "r"}]}), "d.yaml: checks.skip[0].id: expected one of kv-capacity"),
    (spec(checks={"boundary": {"n": 3}}), "d.yaml: checks.boundary: unknown key (expected one of: skip)"),
    (spec(checks={"skip": "all"}), "d.yaml: checks.skip: expected a list of {id, reason}, got 'all'"),
    (spec(checks={"skip": [{"id": "kv-capacity", "reason": "r", "until": "soon"}]}),
     "d.yaml: checks.skip[0].until: expected the waiver's last day as YYYY-MM-DD, got 'soon'"),
])
def test_bad_spec_is_one_line_naming_the_field(data, message):
    with pytest.raises(BootError) as caught:
        parse_spec(data, source="d.yaml")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_placeholder_pointing_at_an_engine_without_port():
    data = spec(engines=[
        {"name": "a", "role": "unified", "url": "http://10.0.0.5:30000", "command": "srv"},
        {"name": "r", "role": "router", "port": "auto", "command": "router --to {a.port}"},
    ])
    with pytest.raises(BootError, match=r"^d.yaml: engines\[1\].command: \{a.port\} refers to engine 'a', "
                       "which has no port; give it port: auto or a number$"):
        plan_deployment(parse_spec(data, source="d.yaml"))


def test_two_engines_on_one_port():
    data = spec(engines=[GOOD_ENGINE, {**GOOD_ENGINE, "name": "f", "role": "router"}])
    with pytest.raises(BootError, match=r"engines\[1\].port: 8000 is also the port of 'e'; give each engine its own port or use auto"):
        plan_deployment(parse_spec(data, source="d.yaml"))


def test_file_errors(tmp_path):
    with pytest.raises(BootError, match=r"missing.yaml: no such file; give the path of a boot spec") as caught:
        load_spec(tmp_path / "missing.yaml")
    assert caught.value.exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployment: d\nengines:\n  - name: a\n   role: x\n")
    with pytest.raises(BootError, match=r"bad.yaml: not valid YAML \(line 4, column \d+\): ") as caught:
        load_spec(bad)
    assert "\n" not in str(caught.value)


def test_a_waiver_expiry_in_a_spec_is_kept_as_a_day():
    import datetime

    parsed = parse_spec(spec(checks={"skip": [{"id": "kv-capacity", "reason": "r", "until": datetime.date(2026, 12, 31)}]}),
                        source="d.yaml")
    assert [(w.check_id, w.until) for w in parsed.checks.skip] == [("kv-capacity", "2026-12-31")]


def test_auto_ports_lie_below_the_ephemeral_range_so_no_outgoing_connection_takes_one_first():
    """A router's port is chosen before its workers start; an outgoing connection made meanwhile
    takes its local port from the ephemeral range, and once took a router's (smg: "Address already
    in use"). Chosen ports are therefore below that range, free and distinct."""
    low = plan_module._ephemeral_low()
    ports = [plan_module.free_port() for _ in range(20)]
    assert all(plan_module.PRIVATE_PORTS_FROM <= p < low for p in ports), (low, ports)
    held = ports[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", held))
        busy.listen()
        assert plan_module.port_in_use(held)
    assert plan_module.free_port(avoid=set(ports)) not in ports


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    kernel_low = plan_module._ephemeral_low()
    monkeypatch.setattr(plan_module, "_ephemeral_low", lambda: plan_module.PRIVATE_PORTS_FROM)
    port = plan_module.free_port()
    assert port >= kernel_low and not plan_module.port_in_use(port)  # from the kernel's range, not ours


def test_vllm_mooncake_example_runs_the_connector_over_tcp_with_the_cpu_shim_behind_vllm_router(monkeypatch):
    monkeypatch.setattr("kvpreflight.boot.launch.port_in_use", lambda port, host="127.0.0.1": False)
    parsed = load_spec(next(p for p in EXAMPLES if p.name == "vllm-pd-mooncake-cpu.yaml"))
    launch = {e.name: e for e in plan_deployment(parsed).engines}
    assert parsed.entry == "router" and parsed.context_length == 1024
    for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        argv, env = launch[name].argv, launch[name].env
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "MooncakeConnector", "kv_role": role,
                          "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}  # the connector's default is rdma
        # without the shim vLLM 0.32's connector dies at start-up on CPU (docs/FINDINGS.md)
        assert env["KVPF_MOONCAKE_CPU_SHIM"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
        assert env["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == "480"
    router = launch["router"].argv
    prefill_at = router.index("--prefill")
    assert router[prefill_at + 2] == launch["prefill"].env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
    assert router[router.index("--kv-connector") + 1] == "mooncake"
