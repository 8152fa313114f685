"""Prometheus text format 0.0.4, for node_exporter's textfile collector: gauges only, no
timestamps, written atomically with --output. So `check --capacity-only` on a timer lets an alert
fire when a pool shrinks under the served context after a config change.

Rendered by prometheus_client (already a dependency, for its parser), which escapes label values.
URLs in labels keep scheme, host, port and path only: no credentials, no query.

Every series carries `deployment` (--name, else the entry URL): node_exporter serves the files of
several deployments side by side, and drops all but one of any series two files share. No label
value is empty (Prometheus reads an empty label as no label): a check about the whole deployment
has endpoint "all", an unknown engine version is "unknown".
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from kvpreflight.formats import _common
from kvpreflight.formats._common import label_url
from kvpreflight.formats.interface import ReportFormat
from kvpreflight.model import Report, Status

# Worse is higher, so `max()` over a deployment is its worst check.
STATUS_VALUE = {Status.PASS: 0, Status.WARN: 1, Status.SKIP: 2, Status.INCONCLUSIVE: 3, Status.FAIL: 4}
WHOLE_DEPLOYMENT = "all"  # the endpoint label of a check about every engine at once (pd-consistency)


class PrometheusFormat(ReportFormat):
    name = "prometheus"

    def render(self, report: Report) -> str:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.registry import Collector

        class ReportCollector(Collector):
            def collect(self) -> Iterator[object]:
                return _families(report)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(ReportCollector())
        return generate_latest(registry).decode("utf-8")


def _families(report: Report) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    deployment = _common.deployment_name(report)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=["deployment", *labels])

    verdict = gauge("kvpreflight_verdict", f"The run's verdict: {_legend()}.")
    verdict.add_metric([deployment], STATUS_VALUE[report.verdict])
    yield verdict
    checks = gauge("kvpreflight_check_status", f"One check's status: {_legend()}.", ("check", "endpoint"))
    for c in report.checks:
        checks.add_metric([deployment, c.id, label_url(c.endpoint) or WHOLE_DEPLOYMENT], STATUS_VALUE[c.status])
    yield checks
    pool = gauge("kvpreflight_kv_pool_tokens", "KV pool size the engine reported, in tokens.", ("endpoint", "role"))
    context = gauge("kvpreflight_context_tokens", "Context length checked (promised, else served), in tokens.", ("endpoint",))
    build = gauge("kvpreflight_build_info", "kvpreflight's version and each engine's kind and version.",
                  ("version", "engine", "engine_version"))
    seen: set[tuple[str, str]] = set()
    for e in report.engines:
        url = label_url(e.url) or _common.UNKNOWN
        if (tokens := e.pool_tokens()) is not None:
            pool.add_metric([deployment, url, e.role.value], tokens)
        if (ctx := _common.checked_context(report, e)) is not None:
            context.add_metric([deployment, url], ctx)
        kind = (e.engine or _common.UNKNOWN, e.version or _common.UNKNOWN)
        if kind not in seen:
            seen.add(kind)
            build.add_metric([deployment, report.tool_version or _common.UNKNOWN, *kind], 1)
    if not report.engines:
        build.add_metric([deployment, report.tool_version or _common.UNKNOWN, "none", "none"], 1)
    yield pool
    yield context
    yield build
    if report.cost is not None:
        cost = report.cost
        for name, value, doc in (
            ("requests", cost.requests, "Requests the probes sent."),
            ("prompt_tokens_submitted", cost.prompt_tokens_submitted, "Prompt tokens the probes submitted."),
            ("prefilled_tokens", cost.prefilled_tokens, "Prompt tokens the engines really computed."),
            ("generated_tokens", cost.generated_tokens, "Tokens the engines generated for the probes."),
            ("wall_seconds", cost.wall_s, "Time from the first probe request to the last."),
        ):
            family = gauge(f"kvpreflight_cost_{name}", doc)
            family.add_metric([deployment], value)
            yield family
        if (equivalents := cost.equivalents(cost.prefilled_tokens)) is not None:
            family = gauge("kvpreflight_cost_context_equivalents_prefilled", "Prefilled tokens / the smallest served context.")
            family.add_metric([deployment], equivalents)
            yield family
    if (finished := _timestamp(report.finished_at)) is not None:
        last = gauge("kvpreflight_last_run_timestamp_seconds", "When the run finished (Unix time).")
        last.add_metric([deployment], finished)
        yield last


def _legend() -> str:
    return ", ".join(f"{value} {status.value}" for status, value in STATUS_VALUE.items())


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
