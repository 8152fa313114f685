"""The output formats, rendered from hand-built Reports, checked for what a reader or a CI system sees."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from kvpreflight.formats import FORMATS, FormatError, _common, get_format, write_report
from kvpreflight.formats.ci import github_actions_side_effects
from kvpreflight.formats.github import GithubFormat
from kvpreflight.formats.junit import JunitFormat
from kvpreflight.formats.markdown import MarkdownFormat
from kvpreflight.formats.sarif import SarifFormat
from kvpreflight.formats.table import TableFormat
from kvpreflight.model import CheckResult, EngineSnapshot, Origin, PoolReading, Report, Role, Status, Waiver
from kvpreflight.schema import report_from_dict

PREFILL = "http://prefill-0:30000"
DECODE = "http://decode-0:30001"
SPECIAL = 'pool <too small> & "quoted" 100%\nsecond line: a, b'
LONG = "the engine accepted a request of 200,001 tokens and silently truncated it " + " ".join(
    f"w{i}" for i in range(60)
) + " THE-END"


def engines() -> tuple[EngineSnapshot, ...]:
    prefill = EngineSnapshot(
        url=PREFILL,
        engine="sglang",
        version="0.4.6.post1",
        role=Role.PREFILL,
        model="meta-llama/Llama-3.1-8B",
        served_context=131072,
        pool_readings=(
            PoolReading("log:KV Cache is allocated", Origin.ALLOCATOR, 140_000, rank="dp0"),
            PoolReading("log:KV Cache is allocated", Origin.ALLOCATOR, 141_000, rank="dp1"),
            PoolReading("/server_info max_total_num_tokens", Origin.SCHEDULER, 139_500),
            PoolReading("behaviour:largest accepted", Origin.BEHAVIOUR, 50),
        ),
    )
    decode = EngineSnapshot(
        url=DECODE,
        engine="sglang",
        version=None,
        role=Role.DECODE,
        model=None,
        served_context=131072,
        pool_readings=(PoolReading("/server_info max_total_num_tokens", Origin.SCHEDULER, 65_536),),
        notes=("no start-up log was given",),
    )
    return prefill, decode


def report(*checks: CheckResult, waivers: tuple[Waiver, ...] = (), context: int | None = None) -> Report:
    return Report(
        tool_version="0.1.0",
        engines=engines(),
        checks=tuple(checks),
        waivers=waivers,
        context_length_promised=context,
        started_at="2026-11-29T08:00:00Z",
        finished_at="2026-11-29T08:01:00Z",
    )


PASS = CheckResult(id="kv.capacity", status=Status.PASS, message="pool holds the served context twice", endpoint=PREFILL)
FAIL = CheckResult(id="reject.over_capacity", status=Status.FAIL, message=LONG, endpoint=PREFILL, evidence={"sent_tokens": 200_001})
FAIL_DECODE = CheckResult(id="reject.over_capacity", status=Status.FAIL, message="decode accepted 70,000 tokens", endpoint=DECODE)
INCONCLUSIVE = CheckResult(id="tenant.isolation", status=Status.INCONCLUSIVE, message=SPECIAL, endpoint=DECODE)
WARN_FILE = CheckResult(
    id="review.auto_truncate",
    status=Status.WARN,
    message="allow_auto_truncate: true lets over-long prompts through",
    endpoint=None,
    evidence={"file": "deploy/sglang, prod:v2.yaml", "line": 12},
)
SKIP = CheckResult(id="gpu.memory", status=Status.SKIP, message="no NVIDIA driver on this host")
WAIVED = CheckResult(id="tenant.isolation", status=Status.SKIP, message="waived: staging (found: warn: x)", endpoint=DECODE,
                     evidence={"waiver": "staging", "status_before_waiver": "warn"})
MIXED = report(PASS, FAIL, INCONCLUSIVE, WARN_FILE, SKIP, waivers=(Waiver("gpu.memory", "CPU-only runner"),))


def plain_table(r: Report, **kw) -> str:
    return TableFormat(color=False, **kw).render(r)


def last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


# ---------------------------------------------------------------- table


@pytest.mark.parametrize(
    "checks, expected",
    [
        ((PASS,), "PASS - 0 fail, 0 inconclusive, 0 warn, 0 skip, 1 pass; 0 waived"),
        ((PASS, WARN_FILE), "PASS: 1 warn (review.auto_truncate) - 0 fail, 0 inconclusive, 1 warn, 0 skip, 1 pass; 0 waived"),
        ((PASS, FAIL, INCONCLUSIVE), f"FAIL (exit 1): 1 failed: reject.over_capacity {PREFILL}"
                                     " - 1 fail, 1 inconclusive, 0 warn, 0 skip, 1 pass; 0 waived"),
        ((PASS, INCONCLUSIVE), f"INCONCLUSIVE (exit 3): nothing proved safe: could not measure tenant.isolation {DECODE}"
                               " - 0 fail, 1 inconclusive, 0 warn, 0 skip, 1 pass; 0 waived"),
        ((), "INCONCLUSIVE (exit 3): nothing proved safe: no checks ran - 0 fail, 0 inconclusive, 0 warn, 0 skip, 0 pass; 0 waived"),
        # Skips and waivers are counted: a --capacity-only run does not read like a full pass.
        ((PASS, SKIP, WAIVED), "PASS - 0 fail, 0 inconclusive, 0 warn, 2 skip, 1 pass; 1 waived"),
    ],
)
def test_table_ends_with_one_verdict_line_naming_the_exit_code(checks, expected):
    assert last_line(plain_table(report(*checks))) == expected


def test_table_engine_block_shows_every_pool_source_and_the_ratio():
    out = plain_table(report(PASS, context=128_000))
    assert "Engine 1 of 2" in out and "Engine 2 of 2" in out
    for fact in (PREFILL, DECODE, "0.4.6.post1", "prefill", "decode", "no start-up log was given"):
        assert fact in out
    assert "log:KV Cache is allocated [dp0] = 140,000 (allocator)" in out
    assert "log:KV Cache is allocated [dp1] = 141,000 (allocator)" in out
    assert "/server_info max_total_num_tokens = 139,500 (scheduler)" in out
    # The pool that counts is the smallest non-behavioural reading; the ratio uses the checked context,
    # kv-capacity's: a promise of 128,000 below the 131,072 served still leaves 131,072 to hold.
    prefill_block = " ".join(out.split("Engine 2 of 2")[0].split())
    assert "KV pool tokens 139,500" in prefill_block
    assert "context 131,072 (served and checked)" in prefill_block
    assert "1.06x" in prefill_block  # 139,500 / 131,072
    assert "0.50x" in out.split("Engine 2 of 2")[1]  # 65,536 / 131,072: below one full request


def test_table_lists_checks_and_waivers_with_reasons():
    out = plain_table(MIXED)
    for status in ("PASS", "FAIL", "INCONCLUSIVE", "WARN", "SKIP"):
        assert status in out
    assert "no NVIDIA driver on this host" in out
    assert "gpu.memory: CPU-only runner" in out.split("Waivers:")[1]


@pytest.mark.parametrize("width", [50, 80, 100, 120])
def test_table_shows_a_long_message_in_at_most_three_lines_and_says_where_the_rest_is(width):
    out = plain_table(report(FAIL), width=width)
    rows = _checks_block(out).splitlines()[1 if width < 60 else 3:]
    message_lines = rows[1:] if width < 60 else rows  # stacked: status and id, endpoint, then the message
    assert 1 <= len(message_lines) - (width < 60) <= 3, out
    assert max(len(line) for line in rows) <= width
    squeezed = " ".join(out.split())
    assert "the engine accepted a request of 200,001 tokens" in squeezed and "THE-END" not in out
    assert squeezed.count("…") == 2 and _common.SHORTENED_NOTE in squeezed  # where it was cut, and the note
    assert json.loads(get_format("json").render(report(FAIL)))["checks"][0]["message"] == LONG  # JSON keeps it whole


def test_table_to_a_pipe_or_file_keeps_a_long_message_whole():
    assert LONG in plain_table(report(FAIL), width=None)


FINDINGS = "; ".join(f"over-pool probe {i} (9,000 tokens): served, not rejected, {i} tokens generated" for i in range(6))
FIXED = CheckResult(id="overcapacity-rejected", status=Status.FAIL, message=f"{FINDINGS}; fix: serve a --context-length the pool holds",
                    endpoint=PREFILL)


@pytest.mark.parametrize("width", [100, 120])
def test_a_long_failure_shows_its_first_findings_whole_and_its_fix(width):
    out = " ".join(plain_table(report(FIXED), width=width).split())
    assert "over-pool probe 0 (9,000 tokens): served, not rejected, 0 tokens generated;" in out  # whole findings
    assert "probe 5" not in out
    assert "generated; …; fix: serve a --context-length the pool holds" in out  # the findings left out: "…"


def test_brief_keeps_what_fits_and_cuts_nothing_else():
    assert _common.brief("short; and whole", 20) == "short; and whole"
    assert _common.brief(LONG, None) == LONG
    assert _common.clauses("a (x; y); b; fix: z") == ["a (x; y)", "b", "fix: z"]  # a bracket's "; " is no boundary
    for width in (20, 46, 60, 100):
        assert _common.wrapped_lines(_common.brief(FIXED.message, width), width) <= 3


def test_markdown_shows_a_long_message_in_three_lines_of_its_column():
    out = MarkdownFormat().render(report(FAIL, FIXED))
    assert "THE-END" not in out and "probe 5" not in out
    assert "fix: serve a --context-length the pool holds" in out and _common.SHORTENED_NOTE in out


def test_table_cannot_drive_the_terminal():
    sneaky = CheckResult(id="kv.capacity", status=Status.FAIL, message="ok\x1b[2J\rcleared", endpoint=PREFILL)
    out = plain_table(report(sneaky))
    assert "\x1b" not in out and "\r" not in out
    assert r"ok\x1b[2J\x0dcleared" in out


def test_table_has_no_colour_off_a_terminal_and_colour_when_asked(capsys):
    auto = TableFormat().render(MIXED)  # stdout is captured by pytest, so not a TTY
    assert "\x1b[" not in auto
    coloured = TableFormat(color=True).render(MIXED)
    assert "\x1b[1;31mFAIL" in coloured


# ---------------------------------------------------------------- junit


def parse_junit(r: Report) -> ET.Element:
    return ET.fromstring(JunitFormat().render(r).encode("utf-8"))


def test_junit_one_testcase_per_result_with_the_right_outcome():
    suite = parse_junit(MIXED)
    assert suite.tag == "testsuite"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        f"kv.capacity {PREFILL}",
        f"reject.over_capacity {PREFILL}",
        f"tenant.isolation {DECODE}",
        "review.auto_truncate",
        "gpu.memory",
    ]
    assert len(suite.findall("testcase/failure")) == 1
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("5", "1", "1", "1")
    passed, failed, inconclusive, warned, skipped = cases
    assert list(passed) == [passed.find("system-out")]
    assert failed.find("failure").get("message") == LONG
    assert '"sent_tokens": 200001' in failed.find("failure").text
    assert inconclusive.find("error") is not None  # could not measure is not a pass
    assert skipped.find("skipped").get("message") == "no NVIDIA driver on this host"
    assert warned.find("failure") is None and warned.find("error") is None
    assert "allow_auto_truncate" in warned.find("system-out").text
    assert warned.get("file") == "deploy/sglang, prod:v2.yaml" and warned.get("line") == "12"


def test_junit_escapes_special_characters_and_drops_nothing():
    bad = CheckResult(id="odd]]>", status=Status.FAIL, message=SPECIAL + " ctrl:\x1b\x00 end", endpoint="http://h/?a=1&b=<2>")
    suite = parse_junit(report(bad))
    case = suite.find("testcase")
    assert case.get("name") == "odd]]> http://h/?a=1&b=<2>"
    message = case.find("failure").get("message")
    assert message.startswith(SPECIAL)
    assert message.endswith(r"ctrl:\x1b\x00 end")  # shown, not raw (XML 1.0 cannot carry them)


# ---------------------------------------------------------------- sarif


def sarif(r: Report) -> dict:
    return json.loads(SarifFormat().render(r))


def test_sarif_structure_rules_and_levels():
    doc = sarif(report(PASS, FAIL, FAIL_DECODE, INCONCLUSIVE, WARN_FILE, SKIP))
    assert doc["version"] == "2.1.0" and "sarif-2.1.0" in doc["$schema"]
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "kvpreflight" and driver["version"] == "0.1.0"
    rule_ids = [r["id"] for r in driver["rules"]]
    assert rule_ids == ["kv.capacity", "reject.over_capacity", "tenant.isolation", "review.auto_truncate", "gpu.memory"]
    results = run["results"]
    # pass and skip are not findings
    assert [(r["ruleId"], r["level"]) for r in results] == [
        ("reject.over_capacity", "error"),
        ("reject.over_capacity", "error"),
        ("tenant.isolation", "error"),
        ("review.auto_truncate", "warning"),
    ]
    for r in results:
        assert set(r) >= {"ruleId", "ruleIndex", "level", "message", "locations"}
        assert rule_ids[r["ruleIndex"]] == r["ruleId"]
        assert r["message"]["text"]
    assert results[2]["message"]["text"].startswith("inconclusive")
    assert results[2]["properties"]["status"] == "inconclusive"
    assert run["invocations"][0]["exitCode"] == 1


def test_sarif_locations_file_line_else_the_deployment_path_with_the_endpoint():
    results = sarif(report(FAIL, WARN_FILE))["runs"][0]["results"]
    failing = results[0]["locations"][0]
    # GitHub code scanning refuses a result without an artifact location: the deployment stands in
    assert failing == {"physicalLocation": {"artifactLocation": {"uri": "kvpreflight/deployments/prefill-0-30000"}},
                       "logicalLocations": [{"fullyQualifiedName": PREFILL, "kind": "resource"}]}
    named = sarif(replace(report(FAIL), name="prod eu/1"))["runs"][0]["results"][0]["locations"][0]
    assert named["physicalLocation"]["artifactLocation"]["uri"] == "kvpreflight/deployments/prod-eu-1"
    booted = sarif(replace(report(FAIL), spec="deploy/kvpreflight-spec.yaml"))["runs"][0]["results"][0]["locations"][0]
    assert booted["physicalLocation"]["artifactLocation"]["uri"] == "deploy/kvpreflight-spec.yaml"
    physical = results[1]["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == "deploy/sglang, prod:v2.yaml"
    assert physical["region"]["startLine"] == 12


def test_sarif_rules_carry_what_code_scanning_shows_and_fingerprints_track_a_finding_across_runs():
    run = sarif(report(FAIL, FAIL_DECODE, replace(FAIL, id="kv-capacity")))["runs"][0]
    assert run["tool"]["driver"]["informationUri"].startswith("https://")
    for rule in run["tool"]["driver"]["rules"]:
        assert rule["name"] != rule["id"] and rule["fullDescription"]["text"] and rule["helpUri"].endswith("#" + rule["id"])
        assert rule["help"]["text"] and "**Fix:**" in rule["help"]["markdown"]
    capacity = next(r for r in run["tool"]["driver"]["rules"] if r["id"] == "kv-capacity")
    assert "memory" in capacity["help"]["text"]  # the fix, not only the description
    prints = [r["partialFingerprints"]["kvpreflightFinding/v1"] for r in run["results"]]
    assert len(set(prints)) == 3  # two endpoints of one rule, and another rule
    again = sarif(report(replace(FAIL, message="the engine accepted 199,999 tokens")))["runs"][0]["results"][0]
    assert again["partialFingerprints"]["kvpreflightFinding/v1"] == prints[0]  # the numbers changed, the alert is the same
    other = sarif(replace(report(FAIL), name="staging"))["runs"][0]["results"][0]
    assert other["partialFingerprints"]["kvpreflightFinding/v1"] != prints[0]


def test_sarif_failing_review_check_points_at_the_config_line():
    failing = CheckResult(id="review.max_model_len", status=Status.FAIL, message="context above pool", endpoint=None,
                          evidence={"file": "/etc/engine.yaml", "line": "7"})
    (result,) = sarif(report(failing))["runs"][0]["results"]
    assert result["level"] == "error"
    physical = result["locations"][0]["physicalLocation"]
    assert physical == {"artifactLocation": {"uri": "file:///etc/engine.yaml"}, "region": {"startLine": 7}}


def test_sarif_waived_result_is_suppressed_with_the_reason():
    r = report(FAIL, waivers=(Waiver("reject.over_capacity", "ticket OPS-12"),))
    (result,) = sarif(r)["runs"][0]["results"]
    assert result["suppressions"] == [{"kind": "external", "justification": "ticket OPS-12"}]


# ---------------------------------------------------------------- github


def test_github_commands_escape_message_and_properties():
    lines = GithubFormat().render(report(PASS, INCONCLUSIVE, WARN_FILE, SKIP)).splitlines()
    assert lines[0] == (
        "::warning title=tenant.isolation::inconclusive (nothing proved safe): "
        'pool <too small> & "quoted" 100%25%0Asecond line: a, b [http://decode-0:30001]'
    )
    assert lines[1] == (
        "::warning file=deploy/sglang%2C prod%3Av2.yaml,line=12,title=review.auto_truncate::"
        "allow_auto_truncate: true lets over-long prompts through"
    )
    assert lines[2] == f"INCONCLUSIVE (exit 3): nothing proved safe: could not measure tenant.isolation {DECODE}"\
        " - 0 fail, 1 inconclusive, 1 warn, 1 skip, 1 pass; 0 waived"
    assert len(lines) == 3  # pass and skip are not annotated


def test_github_fail_is_an_error_with_its_title():
    lines = GithubFormat().render(report(FAIL)).splitlines()
    assert lines[0].startswith("::error title=reject.over_capacity::the engine accepted")
    assert lines[0].endswith(f"THE-END [{PREFILL}]")


def test_github_no_checks_is_still_a_warning():
    (annotation, verdict) = GithubFormat().render(report()).splitlines()
    assert annotation.startswith("::warning title=kvpreflight::INCONCLUSIVE (exit 3)")


# ---------------------------------------------------------------- markdown


def test_markdown_summary_headline_tables_and_escaping():
    out = MarkdownFormat().render(MIXED)
    assert out.startswith(f"## ❌ kvpreflight: FAIL (exit 1): 1 failed: reject.over\\_capacity {PREFILL} - "
                          "1 fail, 1 inconclusive, 1 warn, 1 skip, 1 pass; 0 waived\n")
    tables = [line for line in out.splitlines() if line.startswith("|")]
    checks_header = "| status | check | endpoint | message |"
    assert checks_header in tables
    inconclusive_row = next(line for line in tables if "tenant.isolation" in line)
    # newline and markup neither break the row nor inject HTML
    assert "&lt;too small&gt; &amp; \"quoted\" 100%<br>second line: a, b" in inconclusive_row
    assert inconclusive_row.count(" | ") == checks_header.count(" | ")
    assert "| gpu.memory | CPU-only runner |" in out.split("### Waivers")[1]
    engines_part = out.split("### Engines")[1].split("### Checks")[0]
    assert PREFILL in engines_part and DECODE in engines_part and "139,500" in engines_part


def test_markdown_pipe_in_message_stays_in_its_cell():
    r = report(CheckResult(id="x", status=Status.FAIL, message="a | b", endpoint=PREFILL))
    row = next(line for line in MarkdownFormat().render(r).splitlines() if line.startswith("| ❌"))
    assert row.endswith("| a \\| b |")


# ---------------------------------------------------------------- GitHub Actions side effects


def test_outside_github_actions_nothing_happens(tmp_path):
    summary = tmp_path / "summary.md"
    err = io.StringIO()
    assert github_actions_side_effects(MIXED, {"GITHUB_STEP_SUMMARY": str(summary)}, stderr=err) is False
    assert err.getvalue() == "" and not summary.exists()


def test_github_actions_annotates_stderr_and_appends_the_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# from an earlier step\n", encoding="utf-8")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    err = io.StringIO()
    assert github_actions_side_effects(MIXED, env, stderr=err) is True
    github_actions_side_effects(report(PASS), env, stderr=io.StringIO())
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("# from an earlier step\n")
    assert text.count("## ❌ kvpreflight: FAIL (exit 1)") == 1
    assert "## ✅ kvpreflight: PASS" in text.split("## ❌")[1]  # the second run came after the first
    lines = err.getvalue().splitlines()
    assert [line.split(" ")[0].split("::")[1] for line in lines] == ["error", "warning", "warning"]


def test_github_actions_without_summary_file_and_with_github_format(tmp_path):
    err = io.StringIO()
    github_actions_side_effects(MIXED, {"GITHUB_ACTIONS": "true"}, stderr=err, format_name="github")
    assert err.getvalue() == ""  # the annotations already went to stdout; not shown twice


def test_unwritable_step_summary_becomes_a_warning(tmp_path):
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "no-such-dir" / "s.md")}
    err = io.StringIO()
    github_actions_side_effects(report(PASS), env, stderr=err)
    assert err.getvalue().startswith("::warning title=kvpreflight::cannot append the step summary to ")


# ---------------------------------------------------------------- registry and write_report


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_registered_format_renders(name):
    out = get_format(name).render(MIXED)
    assert out.endswith("\n") and "tenant.isolation" in out


def test_unknown_format_is_a_usage_error():
    with pytest.raises(FormatError) as info:
        get_format("yaml")
    assert info.value.exit_code == 2 and "sarif" in str(info.value)


def test_write_report_to_a_new_nested_file(tmp_path):
    target = tmp_path / "out" / "deep" / "report.sarif"
    write_report(MIXED, "sarif", target)
    assert json.loads(target.read_text(encoding="utf-8"))["runs"][0]["tool"]["driver"]["name"] == "kvpreflight"
    assert [p.name for p in target.parent.iterdir()] == ["report.sarif"]  # no temporary file left


def test_write_report_replaces_and_table_file_has_no_colour(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("old contents that are longer than nothing" * 100)
    write_report(MIXED, "table", target)
    text = target.read_text(encoding="utf-8")
    assert "\x1b[" not in text and "old contents" not in text
    assert last_line(text) == (f"FAIL (exit 1): 1 failed: reject.over_capacity {PREFILL} - "
                               "1 fail, 1 inconclusive, 1 warn, 1 skip, 1 pass; 0 waived")


def test_write_report_to_stdout(capsys):
    write_report(report(PASS), "github", None)
    assert capsys.readouterr().out == "PASS - 0 fail, 0 inconclusive, 0 warn, 0 skip, 1 pass; 0 waived\n"


def test_write_report_unwritable_target_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FormatError) as info:
        write_report(MIXED, "json", blocker / "report.json")
    assert str(blocker / "report.json") in str(info.value)


def test_markdown_charts_each_known_pool_against_its_context_and_names_the_unknown():
    from record_support import sample_report

    from kvpreflight.formats.markdown import MarkdownFormat

    base = sample_report()
    unknown = replace(base.engines[1], url="http://decode-1:30001", pool_readings=())
    text = MarkdownFormat().render(replace(base, engines=(*base.engines, unknown)))
    chart = text.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert chart.splitlines()[0] == "xychart-beta"
    assert '    x-axis ["prefill prefill-0:30000", "decode decode-0:30001"]' in chart
    assert "    bar [139264, 150000]" in chart and "    line [131072, 131072]" in chart
    assert "Pool unknown, not charted: http://decode-1:30001." in text


def test_every_check_id_has_help_and_a_section_in_docs_checks_md():
    from kvpreflight._internal.checks import CHECK_IDS
    from kvpreflight.formats.rule_help import RULES

    assert set(CHECK_IDS) <= set(RULES)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "checks.md").read_text()
    for check_id, about in RULES.items():
        section = docs.split(f"\n## {check_id}\n", 1)[1].split("\n## ", 1)[0]  # the helpUri anchor is the heading
        assert about.description in section and about.fix in section, check_id


def _checks_block(out: str) -> str:
    """The checks table: from its count line to its last row (the note under it left out)."""
    return _common.strip_colour(out).split("Checks (")[1].split("\n\n")[0].split("\n" + _common.SHORTENED_NOTE[:20])[0]


def _check_rows(out: str) -> list[str]:
    return _checks_block(out).splitlines()[3:]


@pytest.mark.parametrize("width", [80, 120])
def test_table_on_a_colour_terminal_keeps_one_row_per_result_and_wraps_a_message_in_its_column_only(width):
    r = report(PASS, FAIL, FAIL_DECODE, INCONCLUSIVE, WARN_FILE)
    out = TableFormat(color=True, width=width).render(r)
    assert "\x1b[1;31mFAIL" in out
    assert max(_common.visible_len(line) for line in out.splitlines()) <= width  # colour codes take no column
    rows = _check_rows(out)
    header = _common.strip_colour(out).split("Checks (")[1].splitlines()[1]
    message_column = header.index("message")
    starts = [line for line in rows if not line.startswith(" ")]
    assert [line.split()[0] for line in starts] == ["FAIL", "FAIL", "INCONCLUSIVE", "WARN", "PASS"]  # one row each, failures first
    for line in rows:
        if line.startswith(" "):  # a continuation: only the message (or endpoint) column has text
            assert line[:header.index("endpoint")].strip() == "", line
    message = " ".join(" ".join(line[message_column:] for line in rows).split())
    assert "the engine accepted a request of 200,001" in message and "THE-END" not in message
    if width == 120:  # a short message is not wrapped just because its row carries colour
        assert any(line.endswith("decode accepted 70,000 tokens") for line in rows)


def test_table_below_60_columns_stacks_each_check_and_fits():
    out = TableFormat(color=True, width=50).render(report(PASS, FAIL))
    assert max(_common.visible_len(line) for line in out.splitlines()) <= 50
    rows = _checks_block(out).splitlines()[1:]
    assert rows[0].split() == ["FAIL", FAIL.id] and rows[1] == f"    {FAIL.endpoint}"
    assert [line.split()[0] for line in rows if not line.startswith(" ")] == ["FAIL", "PASS"]

# ---------------------------------------------------------------- reading order (issue 30)


def _status_column(text: str) -> list[str]:
    rows = text.split("Checks (", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    return [row.split()[0] for row in rows if row and not row.startswith(" ")]


def test_table_lists_failures_then_inconclusives_warnings_skips_and_passes_last():
    out = plain_table(report(PASS, SKIP, WARN_FILE, INCONCLUSIVE, FAIL))
    assert _status_column(out) == ["FAIL", "INCONCLUSIVE", "WARN", "SKIP", "PASS"]


def test_quiet_table_leaves_passes_out_but_counts_them():
    out = plain_table(report(PASS, FAIL), quiet=True)
    assert _status_column(out) == ["FAIL"]
    assert "pool holds the served context twice" not in out
    assert last_line(out).endswith("1 fail, 0 inconclusive, 0 warn, 0 skip, 1 pass; 0 waived")
    only_passes = plain_table(report(PASS), quiet=True)
    assert "every check passed" in only_passes and "pool holds" not in only_passes


def test_the_same_finding_on_several_checks_and_engines_is_one_row_naming_them_all():
    same = "no --entry: the probes need the client-facing URL"
    checks = [CheckResult(id=cid, status=Status.INCONCLUSIVE, message=same, endpoint=url)
              for cid in ("tenant.isolation", "prompt.integrity") for url in (PREFILL, DECODE)]
    out = plain_table(report(*checks))
    assert out.count(same) == 1
    row = next(line for line in out.splitlines() if same in line)
    assert "tenant.isolation, prompt.integrity" in row and f"{PREFILL}, {DECODE}" in row


def test_json_report_has_a_summary_of_every_status_and_the_waivers_beside_the_old_keys():
    data = json.loads(get_format("json").render(report(PASS, FAIL, SKIP, WAIVED)))
    assert data["summary"] == {"total": 4, "pass": 1, "fail": 1, "warn": 0, "skip": 2, "inconclusive": 0, "waived": 1}
    assert {"schema_version", "verdict", "exit_code", "engines", "checks", "waivers", "cost"} <= set(data)
    assert report_from_dict(data).checks == report(PASS, FAIL, SKIP, WAIVED).checks


def test_many_checks_grouped_under_one_finding_wrap_in_the_check_column_at_80_columns():
    # seven skipped checks share one message (--capacity-only): their ids wrap within the check
    # column, one row for the finding, and the table keeps its columns (it stacks only below 60)
    same = "--capacity-only: no request was sent (read-only mode)"
    ids = ("overcapacity-rejected", "prompt-integrity", "max-tokens-clamp", "concurrent-capacity",
           "engine-healthy-after", "tenant-isolation", "prefix-cache-isolation")
    skipped = (CheckResult(id=cid, status=Status.SKIP, message=same, endpoint=PREFILL) for cid in ids)
    out = TableFormat(color=False, width=80).render(report(PASS, *skipped))
    lines = out.split("Checks (")[1].split("\n\n")[0].splitlines()
    assert lines[1].split() == ["status", "check", "endpoint", "message"]  # not stacked
    assert max(len(line) for line in out.splitlines()) <= 80
    rows = lines[3:]
    assert [line.split()[0] for line in rows if not line.startswith(" ")] == ["SKIP", "PASS"]
    assert [w.rstrip(",") for line in rows for w in line.split() if w.rstrip(",") in ids] == list(ids)


def test_a_promise_below_the_served_context_is_shown_as_kv_capacity_judges_it():
    """--context-length 4096 against an engine serving 8,192 with a 6,000-token pool: kv-capacity
    fails at 0.73x, and the table, the JSON and the metrics show the same 8,192 (they once showed
    the promise, 1.46x, beside the fail)."""
    from kvpreflight._internal.checkdata import load_thresholds
    from kvpreflight._internal.checks import CheckContext, run_checks

    engine = EngineSnapshot(url=PREFILL, engine="vllm", version="0.32.0", role=Role.UNIFIED, model="m", served_context=8192,
                            pool_readings=(PoolReading("vllm:cache_config_info kv_cache_size_tokens", Origin.SCHEDULER, 6000),))
    (capacity,) = run_checks(CheckContext((engine,), load_thresholds(), promised_context=4096), ["kv-capacity"])
    assert capacity.status is Status.FAIL and "0.73x" in capacity.message, capacity.message
    shown = Report(tool_version="0.1.0", engines=(engine,), checks=(capacity,), context_length_promised=4096)
    table = " ".join(plain_table(shown).split())
    assert "context 8,192 (served and checked)" in table and "pool / context 0.73x" in table
    assert "1.46x" not in table
    metrics = get_format("prometheus").render(shown)
    assert any(line.startswith("kvpreflight_context_tokens{") and line.endswith(" 8192.0") for line in metrics.splitlines()), metrics
    data = json.loads(get_format("json").render(shown))
    assert data["checks"][0]["evidence"]["checked_context"] == 8192


@pytest.mark.parametrize("width", [80, 100])
def test_an_endpoint_cut_across_lines_is_marked_and_reads_back_whole(width):
    """At 80 columns a 22-character check id leaves the endpoint 21: cut with no mark, a local URL
    comes out as `http://127.0.0.1:6034` and `0` on the next line, which reads as another address."""
    url, far = "http://127.0.0.1:60340", "http://prefill-0.a-very-long-hostname.example.internal:30000"
    out = plain_table(report(CheckResult(id="prefix-cache-isolation", status=Status.FAIL, message="one tenant's prefix served another " * 4,
                                         endpoint=url),
                             CheckResult(id="kv-capacity", status=Status.PASS, message="pool 8,192 tokens vs context 4,096",
                                         endpoint=far)),
                      width=width)
    assert max(len(line) for line in out.splitlines()) <= width
    rows = _check_rows(out)
    start = rows[0].index("http://")
    for address in (url, far):
        first = next(i for i, row in enumerate(rows) if address[:12] in row)
        pieces = [rows[first][start:].split("  ")[0].strip()]
        while pieces[-1].endswith(_common.CONTINUED):
            pieces.append(rows[first + len(pieces)][start:].split("  ")[0].strip())
        assert "".join(p.removesuffix(_common.CONTINUED) for p in pieces) == address, pieces
        assert len(pieces) == 1 or address == far or width == 80, pieces
    assert _common.CONTINUED in out  # at least the long address was cut


def test_a_word_longer_than_the_line_is_cut_with_a_mark_wherever_text_is_fitted():
    line = "  log /tmp/kvpreflight-demo-logs-cyqximn6/" + "x" * 70 + "/prefill.log and more"
    pieces = _common.fit(line, 40).splitlines()
    assert all(len(p) <= 40 for p in pieces), pieces
    cut = [p for p in pieces if p.endswith(_common.CONTINUED)]
    assert cut and "".join(p.strip().removesuffix(_common.CONTINUED) for p in pieces[1:-1]) in line.replace(" ", "")
    assert pieces[-1].strip().endswith("and more") or pieces[-1].strip() == "and more"


def test_the_plan_printed_with_columns_set_fits_them_and_to_a_file_keeps_its_lines(tmp_path):
    from misbehaving_http import Sglang, fake_engine
    from support.cli import invoke

    with fake_engine(Sglang()) as url:
        narrow = invoke("check", "--endpoint", url, "--engine", "sglang", "--plan", env={"COLUMNS": "80"})
        whole = invoke("check", "--endpoint", url, "--engine", "sglang", "--plan", "--output", tmp_path / "plan.txt",
                       env={"COLUMNS": "80"})
    assert narrow.returncode == 0 and whole.returncode == 0, narrow.stderr + whole.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80, narrow.stdout
    kept = (tmp_path / "plan.txt").read_text()
    assert max(len(line) for line in kept.splitlines()) > 80  # the summary line, whole in a file
    def words(text: str) -> str:  # up to the measured speed, which differs from run to run
        return " ".join(text.split()).split(" calibration: ")[0]

    assert words(kept) == words(narrow.stdout)  # the same words either way
