"""`--format prometheus`: text format 0.0.4 that prometheus_client's parser reads, gauges only, no
timestamps, no credentials in labels, written atomically for node_exporter's textfile collector."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from record_support import sample_report

from kvpreflight.formats import get_format, write_report
from kvpreflight.model import CheckResult, Cost, Status


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for s in family.samples:
            assert s.timestamp is None
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def report_with_secrets():
    base = sample_report(failing=True)
    leaky = "https://ops:hunter2-password@gw.example:8443/v1?api_key=sk-live-123456"
    checks = (*base.checks, CheckResult(id="tenant-isolation", status=Status.INCONCLUSIVE, message="model does not echo", endpoint=leaky))
    cost = Cost(requests=51, prompt_tokens_submitted=219191, generated_tokens=5667, wall_s=17.0, checked_context=8192,
                prefilled_tokens=32136, measured=True, basis="measured")
    return replace(base, checks=checks, cost=cost)


def test_every_status_pool_context_and_cost_is_a_parseable_gauge() -> None:
    text = get_format("prometheus").render(report_with_secrets())
    got = samples(text)
    here = {"deployment": "http://router:8000"}  # no --name: the entry URL names the deployment
    assert got["kvpreflight_verdict"] == [(here, 4.0)]  # fail
    statuses = {(labels["check"], labels["endpoint"]): value for labels, value in got["kvpreflight_check_status"]}
    assert statuses[("overcapacity-rejected", "http://decode-0:30001")] == 4.0
    assert statuses[("engine-advisories", "all")] == 1.0  # warn, about every engine: never an empty label
    assert statuses[("tenant-isolation", "https://gw.example:8443/v1")] == 3.0  # inconclusive, URL scrubbed
    assert "hunter2" not in text and "sk-live" not in text and "ops:" not in text
    assert ({**here, "endpoint": "http://prefill-0:30000", "role": "prefill"}, 139264.0) in got["kvpreflight_kv_pool_tokens"]
    assert ({**here, "endpoint": "http://decode-0:30001"}, 131072.0) in got["kvpreflight_context_tokens"]
    assert got["kvpreflight_build_info"] == [({**here, "version": "0.1.0", "engine": "sglang", "engine_version": "0.4.9"}, 1.0)]
    assert got["kvpreflight_cost_prefilled_tokens"] == [(here, 32136.0)]
    assert got["kvpreflight_last_run_timestamp_seconds"] == [(here, 1767225660.0)]  # 2026-01-01T00:01:00Z
    every = [labels for series in got.values() for labels, _ in series]
    assert all(labels.get("deployment") for labels in every) and all(all(labels.values()) for labels in every)


def test_name_labels_every_series_so_two_deployments_never_share_one() -> None:
    prod = samples(get_format("prometheus").render(replace(sample_report(), name="prod-eu-1")))
    staging = samples(get_format("prometheus").render(replace(sample_report(failing=True), name="staging")))
    for name, series in prod.items():
        assert {labels["deployment"] for labels, _ in series} == {"prod-eu-1"}, name
        ours = {tuple(sorted(labels.items())) for labels, _ in series}
        theirs = {tuple(sorted(labels.items())) for labels, _ in staging.get(name, [])}
        assert not ours & theirs, name


def test_the_textfile_collector_reads_what_was_written_atomically(tmp_path: Path) -> None:
    collector_dir = tmp_path / "textfile"
    target = collector_dir / "kvpreflight.prom"
    write_report(report_with_secrets(), "prometheus", target)
    first = samples(target.read_text())
    write_report(replace(sample_report(), cost=None), "prometheus", target)  # the next run replaces it whole
    second = samples(target.read_text())
    assert [p.name for p in collector_dir.iterdir()] == ["kvpreflight.prom"]  # no temporary file left for the collector
    assert [v for _, v in first["kvpreflight_verdict"]] == [4.0] and [v for _, v in second["kvpreflight_verdict"]] == [0.0]
    assert "kvpreflight_cost_requests" not in second


def test_an_empty_name_is_a_usage_error_before_any_request() -> None:
    from support.cli import invoke

    done = invoke("check", "--endpoint", "http://127.0.0.1:9", "--capacity-only", "--name", " ", "--format", "prometheus")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("kvpreflight: error: --name is empty; "
                                   "give the deployment a name (for example prod-eu-1) or leave --name out")
