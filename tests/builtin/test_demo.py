"""`kvpreflight demo` end to end: real builtin engine processes (prefill, decode, router) booted by
the launcher, checked through the router. Each fault must be caught by the check meant for it, and
the failing evidence must come from the probes' responses. Every run must leave no process behind.

Each demo boots three engines: a run is made once per module and shared by the tests that read it
(`demo_run`). Several boots in a row (the stability of the timing-sensitive fault):
benchmarks/bench_demo_stability.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from proctags import processes_tagged

from kvpreflight.schema import report_from_dict


def demo(*args: str, tmp_path) -> tuple[int, dict, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    out = tmp_path / "report.json"
    temp = tmp_path / "tmp"  # the demo's own temporary folders land here, and must be gone after
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--format", "json", "--output", str(out),
                           "--record", str(tmp_path / "record.json"), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KVPREFLIGHT_TEST_TAG": tag, "TMPDIR": str(temp)})
    assert processes_tagged(tag) == set(), "engine processes left behind"
    assert [p.name for p in temp.iterdir() if p.name.startswith("kvpreflight-")] == [], "temporary folders left behind"
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, report, proc.stderr


@pytest.fixture(scope="module")
def demo_keys(tmp_path_factory) -> Path:
    keys = tmp_path_factory.mktemp("demo-keys")
    subprocess.run([sys.executable, "-m", "kvpreflight", "keygen", "--out", str(keys)], check=True, capture_output=True, timeout=60)
    return keys


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_keys):
    """`demo_run(*args)` -> (exit code, report, stderr, its folder): one demo per argument set for
    the module, every one signed with the module's key (the record tests read the fixed one's)."""
    runs: dict[tuple[str, ...], tuple[int, dict, str, Path]] = {}

    def run(*args: str) -> tuple[int, dict, str, Path]:
        if args not in runs:
            folder = tmp_path_factory.mktemp("demo")
            runs[args] = (*demo("--sign-key", str(demo_keys / "kvpreflight.key"), *args, tmp_path=folder), folder)
        return runs[args]
    return run


def statuses(report: dict, check_id: str) -> set[str]:
    return {c["status"] for c in report["checks"] if c["id"] == check_id}


def message(report: dict, check_id: str) -> str:
    return " ".join(c["message"] for c in report["checks"] if c["id"] == check_id)


def not_passed(report: dict) -> dict:
    return {c["id"]: c["message"] for c in report.get("checks", []) if c["status"] != "pass"}


def check_of(report: dict, check_id: str) -> dict:
    (found,) = [c for c in report["checks"] if c["id"] == check_id]
    return found


def test_fixed_deployment_passes_every_check(demo_run):
    code, report, err, folder = demo_run()
    assert code == 0, (not_passed(report), err[-2000:])
    assert report["verdict"] == "pass"
    assert {c["status"] for c in report["checks"]} <= {"pass"}
    assert [e["role"] for e in report["engines"]] == ["prefill", "decode"]
    assert (folder / "record.json").exists()
    # the isolation probes ran in full: every scenario, churn included (the demo boots its engines)
    iso = check_of(report, "tenant-isolation")
    ran = {s["scenario"]: s for s in iso["evidence"]["scenarios"]}
    # late-decode sends the legs of a vLLM NIXL pair by hand; the builtin pair's adapter sends none
    assert ran.pop("late-decode")["not_applicable"].startswith("not applicable: it needs a prefill/decode pair")
    assert set(ran) == {"normal", "boundary", "over-capacity", "cancel-transfer", "cancel-decode", "load"}
    assert not any("skipped" in s for s in ran.values())
    assert ran["cancel-transfer"]["occurrence"].startswith("confirmed: decode deferred")
    assert check_of(report, "prefix-cache-isolation")["status"] == "pass"


def crossings_of(report: dict) -> list[dict]:
    iso = check_of(report, "tenant-isolation")
    assert iso["status"] == "fail", iso["message"]
    return iso["evidence"]["crossings"]


def other_canary_found(report: dict) -> bool:
    """Some tenant's answer carried the OTHER tenant's canary (whole or a fragment)."""
    canaries = check_of(report, "tenant-isolation")["evidence"]["canaries"]
    other = {"a": canaries["b"], "b": canaries["a"]}
    return any(m.split(" ")[0] == other[c["tenant"]] for c in crossings_of(report) for m in c["foreign_markers"])


@pytest.mark.parametrize("args,scenario", [
    (("--fault", "early-free-on-cancel"), "cancel-transfer"),
    (("--fault", "transfer-fail-as-drained"), None),
    (("--incident",), "over-capacity"),
])
def test_isolation_faults_leak_the_other_tenants_canary(demo_run, args, scenario):
    code, report, _, _ = demo_run(*args)
    assert code == 1
    assert other_canary_found(report), crossings_of(report)
    if scenario:
        assert scenario in {c["scenario"] for c in crossings_of(report)}
    leaked = next(c for c in crossings_of(report) if c.get("http_status") == 200)
    assert leaked["http_status"] == 200 and leaked["completion_tokens"] > 0  # HTTP 200 and fluent text: not proof
    assert "text" not in leaked


# Three faults that touch three different checks, in one demo (one boot instead of three): each must
# still be caught by its own check, whatever else the engine does wrong (a real engine can have more
# than one defect).
THREE_FAULTS = ("--fault", "prefix-cache-no-salt", "--fault", "misreport-pool", "--fault", "decode-recompute")


def test_unsalted_prefix_cache_fails_prefix_cache_isolation(demo_run):
    code, report, _, _ = demo_run(*THREE_FAULTS)
    assert code == 1
    cache = check_of(report, "prefix-cache-isolation")
    assert cache["status"] == "fail", cache["message"]
    cross = [p for p in cache["evidence"]["probes"] if p["kind"] == "cross"]
    assert cross and all(p["cached_tokens"] > 0 for p in cross)
    assert check_of(report, "tenant-isolation")["status"] == "pass"  # the canary probe has nothing to see here


def test_incident_pool_ratio_fails_capacity_while_the_correct_engine_hard_rejects(demo_run):
    code, report, _, _ = demo_run("--pool-ratio", "0.65")
    assert code == 1
    prefill = next(e for e in report["engines"] if e["role"] == "prefill")
    assert prefill["kv_pool_tokens"] == 5312  # 0.65 x 8192 = 5324.8, rounded down to 16-token pages
    assert statuses(report, "kv-capacity") == {"fail", "pass"}  # prefill fails, decode (2x) passes
    assert statuses(report, "overcapacity-rejected") == {"pass"}
    assert "over-pool" in message(report, "overcapacity-rejected")
    # the behaviour boundary is a third, independent origin when the pool binds
    agree = next(c for c in report["checks"] if c["id"] == "kv-sources-agree" and c["endpoint"] == prefill["url"])
    assert agree["status"] == "pass" and "behaviour" in agree["evidence"]["origin_values"]


def test_incident_leaks_another_tenants_marker_and_fails(demo_run):
    code, report, err, folder = demo_run("--incident")
    assert code == 1
    over = next(c for c in report["checks"] if c["id"] == "overcapacity-rejected")
    assert over["status"] == "fail"
    leaked = [p for p in over["evidence"]["probes"] if p.get("foreign_markers")]
    assert leaked, over["message"]
    assert all(m.startswith("KVPF-TENANT-") for p in leaked for m in p["foreign_markers"])
    assert leaked[0]["http_status"] == 200 and leaked[0]["completion_tokens"] > 0
    assert "placeholder" in over["message"]
    # The Markdown report (and the GitHub step summary) charts every engine's pool against its context.
    from kvpreflight.formats.markdown import MarkdownFormat

    markdown = MarkdownFormat().render(report_from_dict(report))
    chart = markdown.split("```mermaid\n", 1)[1].split("```", 1)[0]
    pools = [str(e["kv_pool_tokens"]) for e in report["engines"]]
    assert f"    bar [{', '.join(pools)}]" in chart and "    line [8192, 8192]" in chart, chart
    # Neither report nor record carries response text. The echoing engine repeated the probe's own
    # marker (KVPF-PROBE-...) in every served answer; it must appear nowhere, while the other
    # tenant's marker (quoted evidence) does.
    statement = base64.b64decode(json.loads((folder / "record.json").read_text())["payload"]).decode()
    for text in (statement, json.dumps(report)):
        assert "KVPF-PROBE-" not in text
        assert leaked[0]["foreign_markers"][0] in text


def test_misreported_pool_is_caught_by_sources_agree(demo_run):
    code, report, _, _ = demo_run(*THREE_FAULTS)
    assert code == 1
    assert "fail" in statuses(report, "kv-sources-agree")
    assert "allocator" in message(report, "kv-sources-agree")


def test_auto_truncate_is_caught(demo_run):
    code, report, _, _ = demo_run("--pool-ratio", "0.65", "--fault", "auto-truncate")
    assert code == 1
    assert statuses(report, "overcapacity-rejected") == {"fail"}
    over = next(c for c in report["checks"] if c["id"] == "overcapacity-rejected")
    over_pool = [p for p in over["evidence"]["probes"] if p["probe"] == "over-pool"]
    # prefill truncates silently; what comes back is anything but a length rejection
    assert over_pool and over_pool[0].get("error_kind") != "length"


def test_decode_recompute_is_caught_by_pd_transfer(demo_run):
    code, report, _, _ = demo_run(*THREE_FAULTS)
    assert code == 1
    assert statuses(report, "pd-transfer") == {"fail"}
    assert "the decode recomputed the prompt" in message(report, "pd-transfer")


def test_unknown_fault_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--fault", "nope"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nope" in proc.stderr


def test_unknown_router_and_missing_smg_are_usage_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--router", "nginx"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--router" in proc.stderr and "nginx" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "demo", "--router", "smg"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "KVPREFLIGHT_SMG": str(tmp_path / "no-smg")})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "KVPREFLIGHT_SMG" in proc.stderr and "scripts/setup_engines.sh --only smg" in proc.stderr


def test_record_round_trip_keygen_demo_verify(demo_run, demo_keys):
    code, report, err, folder = demo_run()
    assert code == 0, err[-1500:]
    keys, record = demo_keys, folder / "record.json"

    def verify(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvpreflight", "verify", str(record), "--key", str(keys / "kvpreflight.pub"), *extra],
                              capture_output=True, text=True, timeout=60)

    ok = verify("--any-subject")
    assert ok.returncode == 0, ok.stderr
    # the record names the engine logs it read, by digest
    envelope = json.loads(record.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    subjects = {s["name"] for s in statement["subject"]}
    assert any(name.startswith("file:") and name.endswith("prefill.log") for name in subjects), subjects
    log_subject = next(s for s in statement["subject"] if s["name"].endswith("prefill.log"))
    assert verify("--subject", f"{log_subject['name']}=sha256:{log_subject['digest']['sha256']}").returncode == 0
    wrong = verify("--subject", f"{log_subject['name']}=sha256:{'0' * 64}")
    assert wrong.returncode == 1 and "digest" in wrong.stderr


def test_a_passing_demo_report_fits_one_screen_and_a_failing_one_reads_failures_first(demo_run):
    from kvpreflight.formats.table import TableFormat

    _, passing, _, _ = demo_run()
    screen = TableFormat(color=False, width=120).render(report_from_dict(passing))
    assert len(screen.splitlines()) <= 50, screen
    _, failing, _, _ = demo_run("--incident")
    table = TableFormat(color=False, width=120).render(report_from_dict(failing))
    checks_block = table.split("\nChecks (", 1)[1].split("\n\n", 1)[0]
    statuses_in_order = [line.split()[0] for line in checks_block.splitlines()
                         if line.split()[:1] and line.split()[0] in ("FAIL", "INCONCLUSIVE", "WARN", "SKIP", "PASS")]
    assert statuses_in_order[0] == "FAIL" and "PASS" in statuses_in_order
    assert statuses_in_order.index("PASS") > max(i for i, s in enumerate(statuses_in_order) if s == "FAIL")
    # every message at most three lines of its column (the incident's run to 12 whole); JSON keeps them whole
    lines = checks_block.splitlines()
    column = lines[1].index("message")
    per_row: list[int] = []
    for line in lines[3:]:
        if not line.startswith(" "):
            per_row.append(0)
        per_row[-1] += bool(line[column:].strip())
    assert max(per_row) <= 3 and "--format json has every message whole" in table, table
    assert any(len(c["message"]) > 400 for c in failing["checks"])


def test_the_printed_verify_command_accepts_the_record_it_names(demo_run):
    code, _, err, folder = demo_run()
    assert code == 0, err[-1500:]
    (line,) = [line for line in err.splitlines() if "verify the record: " in line]
    command = line.split("verify the record: ", 1)[1].split()  # the whole command, as a user copies it
    assert command[:2] == ["kvpreflight", "verify"] and str(folder / "record.json") in command
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", *command[1:]], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
