"""network-exposure: no socket of the deployment that carries KV, token ids or KV transfer control
listens beyond loopback or the address the engines were stated to serve on.

A KV or token stream reachable from the network is a cross-tenant leak no canary shows. In boot
mode the sockets come from /proc (what the processes bound); attached, from what the start-up
logs name. A socket's worst case decides: a token-id stream (KV-cache events) that listens beyond
fails, a KV or transfer-control socket warns, and one whose binding is unknown counts as its worst
case where that is a warning, and as inconclusive where it could be a failure. A socket that
cannot be identified and listens beyond warns: kvpreflight cannot say it carries nothing.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Listener, ListenerKind, ProcessListeners, Status

ID = CheckId.NETWORK_EXPOSURE
SCOPE = Scope.DEPLOYMENT

FIX = {ListenerKind.TOKEN_IDS: "bind it to loopback or the subscribers' cluster address",
       ListenerKind.KV_DATA: "firewall the KV ports to the peer engines",
       ListenerKind.TRANSFER_CONTROL: "firewall the KV ports to the peer engines",
       ListenerKind.UNIDENTIFIED: "find what it carries, or firewall the port"}


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    read = [p for p in ctx.listeners if p.source is not None]
    unread = [p for p in ctx.listeners if p.source is None]
    not_read = "; ".join(f"{p.process}: {p.unread}" for p in unread)
    if not read:
        why = not_read or "no engine was read"
        return [CheckResult(id=ID, status=Status.SKIP, endpoint=None,
                            message=f"no listening socket read: give each engine's start-up log (--log URL=PATH), or "
                                    f"--boot to read the sockets themselves ({why})")]
    stated = stated_addresses(ctx.listeners, tuple(s.url for s in ctx.snapshots))
    worst = Status.PASS
    findings: list[tuple[ProcessListeners, Listener, Status]] = []
    evidence = []
    for proc in read:
        for listener in proc.listeners:
            verdict = judge(listener, stated)
            evidence.append(_evidence(proc, listener, verdict))
            if verdict is not Status.PASS:
                worst = max(worst, verdict, key=SEVERITY.index)
                findings.append((proc, listener, verdict))
    basis = sorted({p.source for p in read if p.source})
    where = f"listening sockets read from {' and '.join(basis)}"
    common = {"listeners": evidence, "stated_addresses": sorted(stated), "read_from": basis,
              **({"not_read": {p.process: p.unread for p in unread}} if unread else {})}
    if worst is not Status.PASS:
        message = _findings(findings) + (f" (not read: {not_read})" if unread else "")
        return [CheckResult(id=ID, status=worst, endpoint=None, message=message, evidence=common)]
    beyond = f" or {_addresses(stated)}" if stated else ""
    if unread:
        return [CheckResult(id=ID, status=Status.SKIP, endpoint=None, evidence=common,
                            message=f"{where}: none beyond loopback{beyond}, but not read for {not_read}")]
    count = sum(len(p.listeners) for p in read)
    if not count:
        said = f"the start-up logs of {len(read)} engines name no KV, token-id or transfer listener"
    else:
        other = sum(1 for p in read for li in p.listeners if li.kind is ListenerKind.UNIDENTIFIED)
        said = (f"{count} listening sockets of {len(read)} process{'es' if len(read) > 1 else ''} ({other} not identified), "
                f"every one but the engines' own ports on loopback{beyond}")
    return [CheckResult(id=ID, status=Status.PASS, endpoint=None, evidence=common, message=f"{where}: {said}")]


SEVERITY = (Status.PASS, Status.WARN, Status.INCONCLUSIVE, Status.FAIL)


def judge(listener: Listener, stated: set[str]) -> Status:
    """One socket's verdict: PASS (not a finding), WARN, INCONCLUSIVE or FAIL."""
    if listener.kind is ListenerKind.API:
        return Status.PASS  # the engine's own port, bound where its URL says
    beyond = beyond_stated(listener.address, stated)
    if beyond is False:
        return Status.PASS
    if listener.kind is ListenerKind.TOKEN_IDS:
        return Status.FAIL if beyond else Status.INCONCLUSIVE
    return Status.WARN


def beyond_stated(address: str | None, stated: set[str]) -> bool | None:
    """Whether `address` reaches past loopback and the stated addresses; None: unknown (not said,
    or a host name, which a pure check does not resolve)."""
    if address is None:
        return None
    if address in stated or address == "localhost":
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return not ip.is_loopback


def stated_addresses(processes: tuple[ProcessListeners, ...], urls: tuple[str, ...]) -> set[str]:
    """The cluster addresses the deployment was stated to serve on: each engine URL's host where it
    is an address, and the address each engine's API was bound to (never a wildcard)."""
    hosts = {urlsplit(p.url).hostname or "" for p in processes} | {urlsplit(u).hostname or "" for u in urls}
    hosts |= {li.address or "" for p in processes for li in p.listeners if li.kind is ListenerKind.API}
    out = set()
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue
        if not ip.is_unspecified and not ip.is_loopback:
            out.add(str(ip))
    return out


def _addresses(stated: set[str]) -> str:
    return "the stated address " + ", ".join(sorted(stated))


def _findings(findings: list[tuple[ProcessListeners, Listener, Status]]) -> str:
    """'PROCESS: ADDRESS:PORT WHAT, ...; ...', the worst first, then what binds each and the fixes."""
    findings = sorted(findings, key=lambda f: -SEVERITY.index(f[2]))
    by_process: dict[str, dict[str, list[str]]] = {}  # who -> what it is -> where it listens
    for proc, listener, _ in findings:
        who = proc.process + (f" (pid {listener.pid} {listener.program})" if listener.pid is not None else "")
        if listener.kind is ListenerKind.UNIDENTIFIED:
            label, where = f"not identified ({listener.what or 'what it carries is unknown'})", _endpoint(listener)
        elif listener.port == 0:
            label, where = f"{listener.what}, no port or address stated (it may listen beyond loopback)", ""
        elif listener.address is None:
            label, where = f"{listener.what}, no address stated (it may listen beyond loopback)", f"port {listener.port}"
        else:
            label, where = listener.what, _endpoint(listener)
        by_process.setdefault(who, {}).setdefault(label, []).append(where)
    listening = "; ".join(f"{who} " + ", ".join(f"{', '.join(w for w in wheres if w)}: {label}".lstrip(": ")
                                                for label, wheres in labels.items())
                          for who, labels in by_process.items())
    settings = {listener.what: listener.setting for _, listener, _ in findings if listener.setting}
    fixes = {FIX[listener.kind]: None for _, listener, _ in findings}
    bound = "; ".join(f"{what}: {setting}" for what, setting in settings.items())
    return (f"{len(findings)} socket{'s' if len(findings) > 1 else ''} listening beyond loopback: {listening}. "
            + (f"Bound by: {bound}. " if bound else "") + "Fix: " + "; ".join(fixes))


def _endpoint(listener: Listener) -> str:
    address = listener.address or "?"
    return f"[{address}]:{listener.port}" if ":" in address else f"{address}:{listener.port}"


def _evidence(proc: ProcessListeners, listener: Listener, verdict: Status) -> dict[str, object]:
    out: dict[str, object] = {"process": proc.process, "url": proc.url, "source": proc.source, "port": listener.port,
                              "address": listener.address, "carries": listener.kind.value, "verdict": verdict.value}
    if listener.what:
        out["what"] = listener.what
        out["setting"] = listener.setting
    if listener.pid is not None:
        out["pid"] = listener.pid
        out["program"] = listener.program
    return out
