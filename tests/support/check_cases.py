"""Hand-built snapshots, completions and probe runs for the checks' unit tests (no server)."""

from __future__ import annotations

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import run_checks
from kvpreflight._internal.probes.results import Expect, Limits, ProbeResult, ProbeRun
from kvpreflight.model import Completion, EngineSnapshot, ErrorKind, Origin, PoolReading, Role

T = load_thresholds()
PREFILL, DECODE, ENTRY = "http://p:1", "http://d:2", "http://router:3"


def snap(url=PREFILL, role=Role.UNIFIED, pool=20000, served=10000, readings=None, **kw) -> EngineSnapshot:
    readings = readings if readings is not None else (
        PoolReading("/server_info max_total_num_tokens", Origin.SCHEDULER, pool),
        PoolReading("log: KV Cache is allocated #tokens", Origin.ALLOCATOR, pool),
    )
    return EngineSnapshot(url=url, engine="sglang", version="0.5.23", role=role, model="m", served_context=served,
                          pool_readings=tuple(readings), page_size=16, **kw)


def ok(sent, generated=1, **kw) -> Completion:
    return Completion(sent_tokens=sent, max_tokens=kw.pop("max_tokens", 1), streamed=False, status=200, elapsed_s=0.1,
                      completion_tokens=generated, prompt_tokens=sent, finish_reason="length", body_bytes=100, body_sha256="ab", **kw)


def refused(sent, msg="Input length (9999 tokens) exceeds the maximum allowed length (9993 tokens).", kind=ErrorKind.LENGTH, status=400,
            **kw):
    return Completion(sent_tokens=sent, max_tokens=16, streamed=kw.pop("stream", False), status=status, elapsed_s=0.01,
                      error_message=msg, error_kind=kind, **kw)


DEFAULT_LIMITS = Limits(10000, 20000, 9993)


def run(*probes, limits=DEFAULT_LIMITS, reached=(PREFILL,)) -> ProbeRun:
    items = []
    for name, completion, *rest in probes:
        deltas = rest[0] if rest else {}
        expect = Expect.ACCEPT if name.startswith(("boundary-accept", "concurrent")) else Expect.REJECT
        items.append(ProbeResult(name=name, expect=expect, completion=completion, purpose="test", reached=reached, counter_deltas=deltas))
    return ProbeRun(limits=limits, probes=tuple(items), healthy_after={PREFILL: True}, idle_after={PREFILL: True},
                    small_request_after=ok(16))


def check(check_id, ctx):
    return [r for r in run_checks(ctx, [check_id])]


def good_probes(**override):
    probes = {
        "boundary-accept": ok(9992), "boundary-reject": refused(9993),
        "over-context": refused(10001, "The input (10001 tokens) is longer than the model's context length (10000 tokens)."),
        "over-context-stream": refused(10001, "The input (10001 tokens) is longer than the model's context length (10000 tokens).",
                                       status=200, stream=True),
    }
    probes.update(override)
    return [(k, v) for k, v in probes.items() if v is not None]
