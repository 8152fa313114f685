"""The advisory feed: every shipped entry fires on a matching version and setting - in `check` on
a synthetic snapshot, in `review` on a small compose file - and one with a fixed version stays
silent on it; a malformed advisory file stops the CLI with exit 2 naming file and field."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.cli import invoke

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.checks.advisory_data import Advisory, Severity, load_advisories, parse_version, version_in
from kvpreflight._internal.review import review
from kvpreflight._internal.review.advisories import image_version
from kvpreflight._internal.review.estimate import ReviewInputs
from kvpreflight.model import EngineSnapshot, Role, Status

ROOT = Path(__file__).parents[2]
MODELS = ROOT / "tests" / "fixtures" / "review" / "models"
ADVISORIES = load_advisories()
FIXED = [a for a in ADVISORIES if parse_version(a.fixed) and a.fixed[0].isdigit()]
IMAGES = {"sglang": "lmsysorg/sglang:v{}", "vllm": "vllm/vllm-openai:v{}", "llamacpp": "ghcr.io/ggml-org/llama.cpp:server-b{}",
          "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:{}"}


def affected_version(a: Advisory) -> str:
    """A version inside the advisory's range, found from the numbers its constraints name."""
    for constraint in a.versions.split(","):
        number = tuple(int(p) for p in constraint.strip().lstrip("<>=").split("."))
        candidates = [number[:-1] + (number[-1] + 1,), number]
        nonzero = [i for i, p in enumerate(number) if p]
        if nonzero:  # just below: 0.9.0 -> 0.8.99
            i = nonzero[-1]
            candidates.append(number[:i] + (number[i] - 1,) + (99,) * (len(number) - i - 1))
        for candidate in candidates:
            if version_in(candidate, a.versions):
                return version_text(a.engine, candidate)
    raise AssertionError(f"no version found inside {a.versions}")


def version_text(engine: str, version: tuple[int, ...]) -> str:
    """How the engine writes it: llama.cpp build numbers as they are, the others as X.Y.Z."""
    return str(version[0]) if engine == "llamacpp" else ".".join(map(str, (version + (0, 0))[:3]))


def matching_settings(a: Advisory) -> dict[str, str]:
    out = {}
    for c in a.settings:
        if c.present:
            out[c.name] = "a-key"
        elif c.contains:
            out[c.name] = json.dumps({"kv_connector": c.contains, "kv_role": "kv_both"})
        else:
            out[c.name] = c.values[0]
    return out


# What each engine reports about the settings the advisories ask for, at their safe values.
REPORTED = {
    "sglang": {"allow_auto_truncate": False, "disaggregation_transfer_backend": "mooncake"},
    "builtin": {"allow_auto_truncate": False},
    "vllm": {"enable_prefix_caching": "False"},
}


def check_result(a: Advisory, version: str) -> tuple[Status, dict]:
    role = Role.PREFILL if a.pd else Role.UNIFIED
    settings = {**REPORTED.get(a.engine, {}), **matching_settings(a)}
    snap = EngineSnapshot(url="http://e:1", engine=a.engine, version=version, role=role, model="m",
                          served_context=1000, settings=settings)
    ctx = CheckContext((snap,), load_thresholds(), advisories=ADVISORIES)
    (result,) = run_checks(ctx, ["engine-advisories"])
    return result.status, dict(result.evidence)


def ids(evidence: dict, key: str) -> list[str]:
    return [m["id"] for m in evidence[key]]


def test_the_feed_has_at_least_15_sourced_entries_8_with_a_verified_fix():
    assert len(ADVISORIES) >= 15
    assert len(FIXED) >= 8 and all(a.verified for a in FIXED)
    assert all(a.references and a.verification for a in ADVISORIES)
    assert not [a.id for a in ADVISORIES if a.severity is Severity.FAIL and not a.verified]
    # the old reference nobody could find is gone
    assert not any("45973" in r for a in ADVISORIES for r in a.references)


@pytest.mark.parametrize("advisory", [a for a in ADVISORIES if a.detect_check], ids=lambda a: a.id)
def test_check_fires_each_advisory_on_a_matching_engine(advisory):
    status, evidence = check_result(advisory, affected_version(advisory))
    if advisory.severity is Severity.INFO:
        assert advisory.id in ids(evidence, "notes")
    else:
        assert advisory.id in ids(evidence, "matched")
        assert status in ((Status.FAIL,) if advisory.severity is Severity.FAIL else (Status.FAIL, Status.WARN))


@pytest.mark.parametrize("advisory", [a for a in FIXED if a.detect_check], ids=lambda a: a.id)
def test_check_is_silent_on_the_fixed_version(advisory):
    _, evidence = check_result(advisory, advisory.fixed)
    assert advisory.id not in ids(evidence, "matched") + ids(evidence, "may_apply")


def test_check_setting_the_engine_does_not_report_warns_and_unknown_version_is_inconclusive():
    nixl = next(a for a in ADVISORIES if a.id == "KVPF-VLLM-2026-52234")
    snap = EngineSnapshot(url="http://e:1", engine="vllm", version="0.32.0", role=Role.DECODE, model="m", served_context=1)
    (r,) = run_checks(CheckContext((snap,), load_thresholds(), advisories=(nixl,)), ["engine-advisories"])
    assert r.status is Status.WARN and "may apply" in r.message and "kv_transfer_config" in r.message
    unknown = EngineSnapshot(url="http://e:1", engine="sglang", version=None, role=Role.PREFILL, model="m", served_context=1)
    (r,) = run_checks(CheckContext((unknown,), load_thresholds(), advisories=ADVISORIES), ["engine-advisories"])
    assert r.status is Status.INCONCLUSIVE and "KVPF-SGLANG-2026-001" in r.message


def test_check_passes_a_current_engine_with_safe_settings():
    snap = EngineSnapshot(url="http://e:1", engine="sglang", version="0.5.23", role=Role.UNIFIED, model="m",
                          served_context=1, settings={"allow_auto_truncate": False})
    (r,) = run_checks(CheckContext((snap,), load_thresholds(), advisories=ADVISORIES), ["engine-advisories"])
    assert r.status is Status.PASS, r.message
    # what a running SGLang does not report is named, not silently passed
    assert "KVPF-SGLANG-2026-006" in r.evidence["not_checked_here"]


# --- review -------------------------------------------------------------------------------


def compose(tmp_path: Path, a: Advisory, version: str) -> tuple[Path, dict[str, int]]:
    """A compose file launching the advisory's engine with its flags; each flag's line."""
    words = {
        "sglang": ["python3", "-m", "sglang.launch_server", "--model-path", "Llama-3.1-8B-Instruct", "--context-length", "8192"],
        "vllm": ["vllm", "serve", "Llama-3.1-8B-Instruct", "--max-model-len", "8192"],
        "llamacpp": ["llama-server", "-m", "/models/Llama-3.1-8B-Instruct/m.gguf", "-c", "8192"],
        "trtllm": ["trtllm-serve", "Llama-3.1-8B-Instruct", "--max_seq_len", "8192"],
    }[a.engine]
    if a.pd and a.engine == "sglang":
        words += ["--disaggregation-mode", "prefill"]
    if a.pd and a.engine == "trtllm":
        words += ["--server_role", "context"]
    settings = matching_settings(a)
    # trtllm-serve's flags keep their underscores; a switch left at its default is not written
    spell = (lambda name: "--" + name) if a.engine == "trtllm" else (lambda name: "--" + name.replace("_", "-"))
    if a.engine == "trtllm":
        settings = {c.name: v for c, v in zip(a.settings, settings.values(), strict=True) if v != c.default}
    if a.pd and a.engine == "vllm" and "kv_transfer_config" not in settings:
        settings["kv_transfer_config"] = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    for name, value in settings.items():
        words.append(spell(name))
        if value != "true":
            words.append(value)
    lines = ["services:", "  engine:", f"    image: {IMAGES[a.engine].format(version)}", "    command:"]
    lines += [f"      - {json.dumps(w)}" for w in words]
    path = tmp_path / f"{a.id}-{version}.yml"
    path.write_text("\n".join(lines) + "\n")
    flag_lines = {name: lines.index(f'      - "{spell(name)}"') + 1 for name in settings}
    return path, flag_lines


def review_findings(path: Path) -> list:
    report = review([path], ReviewInputs(model_dir=MODELS, gpu="H100 80GB", context_length=None))
    return [c for c in report.checks if c.id == "engine-advisories"]


@pytest.mark.parametrize("advisory", [a for a in ADVISORIES if a.detect_review and a.severity is not Severity.INFO],
                         ids=lambda a: a.id)
def test_review_fires_each_advisory_with_file_and_line(tmp_path, advisory):
    path, flag_lines = compose(tmp_path, advisory, affected_version(advisory))
    (finding,) = review_findings(path)
    assert advisory.id in ids(finding.evidence, "matched")
    expected = Status.FAIL if advisory.severity is Severity.FAIL else Status.WARN
    assert finding.status in (Status.FAIL, expected)
    line = next((flag_lines[c.name] for c in advisory.settings if c.name in flag_lines), 3)  # else the image line
    assert finding.endpoint == f"{path}:{line}" and finding.evidence["line"] == line


@pytest.mark.parametrize("advisory", [a for a in FIXED if a.detect_review], ids=lambda a: a.id)
def test_review_is_silent_on_the_fixed_version(tmp_path, advisory):
    path, _ = compose(tmp_path, advisory, advisory.fixed)
    for finding in review_findings(path):
        assert advisory.id not in ids(finding.evidence, "matched") + ids(finding.evidence, "may_apply")


@pytest.mark.parametrize("image,engine,version", [
    ("lmsysorg/sglang:v0.5.20", "sglang", "0.5.20"),
    ("lmsysorg/sglang:v0.5.20-cu129-amd64", "sglang", "0.5.20"),
    ("docker.io/lmsysorg/sglang:latest", "sglang", None),
    ("vllm/vllm-openai:v0.8.5", "vllm", "0.8.5"),
    ("registry:5000/acme/vllm-openai:0.9.0@sha256:abc", "vllm", "0.9.0"),
    ("acme/inference:1.2.3", "vllm", None),  # a private image says nothing about the engine
    ("ghcr.io/ggml-org/llama.cpp:server-cuda-b10241", "llamacpp", "10241"),
])
def test_image_tags_name_the_engine_version(image, engine, version):
    assert image_version(engine, image) == version


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    return invoke(*args, cwd=ROOT, env_exact=env)


def test_review_sarif_and_github_carry_the_advisory_location(tmp_path):
    a = next(x for x in ADVISORIES if x.id == "KVPF-SGLANG-2026-001")
    path, _ = compose(tmp_path, a, "0.5.20")
    out = tmp_path / "r.sarif"
    r = run_cli("review", str(path), "--model-dir", str(MODELS), "--gpu", "H100 80GB", "--format", "sarif", "--output", str(out))
    assert r.returncode == 1, r.stderr
    results = [x for x in json.loads(out.read_text())["runs"][0]["results"] if x["ruleId"] == "engine-advisories"]
    (loc,) = results[0]["locations"]
    assert loc["physicalLocation"]["region"]["startLine"] == 3 and "KVPF-SGLANG-2026-001" in results[0]["message"]["text"]
    r = run_cli("review", str(path), "--model-dir", str(MODELS), "--gpu", "H100 80GB", "--format", "github")
    assert any(l.startswith("::error") and "line=3" in l and "KVPF-SGLANG-2026-001" in l for l in r.stdout.splitlines())


# --- malformed files and the advisories command -----------------------------------------------


GOOD = """- id: ACME-0001
  engine: sglang
  versions: "<0.5.22"
  fixed: "0.5.22"
  verified: true
  severity: fail
  title: "t"
  fix: "f"
  references: [https://example.com/1]
  detect: {check: "version"}
  verification: "v"
"""


@pytest.mark.parametrize("change,field", [
    (("severity: fail", "severity: fatal"), "severity"),
    (("verified: true\n  severity: fail", "verified: false\n  severity: warn"), "fixed"),  # a fixed version needs verification
    (('fixed: "0.5.22"', 'fixed: "0.5.21"'), "fixed"),  # inside the affected range
    (('versions: "<0.5.22"', 'versions: "before 0.5.22"'), "versions"),
    (("references: [https://example.com/1]", "references: []"), "references"),
    (("engine: sglang", "engine: sgl"), "engine"),
    (('title: "t"', 'titel: "t"'), "titel"),
    (('detect: {check: "version"}', "detect: {runtime: x}"), "detect"),
])
def test_a_malformed_advisory_file_exits_2_naming_file_and_field(tmp_path, change, field):
    bad = tmp_path / "mine.yaml"
    bad.write_text(GOOD.replace(*change))
    for args in (["advisories", "list", "--advisories", str(tmp_path)],
                 ["check", "--endpoint", "http://127.0.0.1:9", "--advisories", str(tmp_path)]):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        (line,) = r.stderr.splitlines()
        assert str(bad) in line and "ACME-0001" in line and f"field '{field}'" in line and "Traceback" not in r.stderr


def test_unverified_fail_is_refused_and_a_good_user_file_is_listed(tmp_path):
    (tmp_path / "mine.yaml").write_text(GOOD.replace("verified: true", "verified: false").replace('fixed: "0.5.22"', "fixed: open"))
    r = run_cli("advisories", "list", "--advisories", str(tmp_path))
    assert r.returncode == 2 and "field 'severity'" in r.stderr and "verified" in r.stderr
    (tmp_path / "mine.yaml").write_text(GOOD)
    r = run_cli("advisories", "list", "--advisories", str(tmp_path), "--engine", "sglang", "--format", "json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert "ACME-0001" in [a["id"] for a in listed] and {a["engine"] for a in listed} == {"sglang"}


def test_advisories_list_table_and_show():
    r = run_cli("advisories", "list", "--engine", "vllm")
    assert r.returncode == 0, r.stderr
    assert "KVPF-VLLM-2025-46570" in r.stdout and "0.9.0" in r.stdout and "KVPF-SGLANG" not in r.stdout
    r = run_cli("advisories", "show", "KVPF-SGLANG-2026-002")
    assert r.returncode == 0, r.stderr
    assert "https://github.com/sgl-project/sglang/pull/36612" in r.stdout and "fixed:        0.5.20" in r.stdout
    assert "verification:" in r.stdout and "0.5.19" in r.stdout
    r = run_cli("advisories", "show", "KVPF-NOPE-1")
    assert r.returncode == 2
    assert r.stderr.strip() == "kvpreflight: error: no advisory 'KVPF-NOPE-1'; `kvpreflight advisories list` shows the ids"
    r = run_cli("advisories", "list", "--engine", "tensorrt")
    assert r.returncode == 2 and "--engine" in r.stderr


def test_review_reads_the_users_advisories_and_refuses_a_malformed_file(tmp_path):
    # `review(..., advisory_dirs=...)` is what a `review --advisories DIR` option passes on
    from kvpreflight.errors import ConfigError

    a = next(x for x in ADVISORIES if x.id == "KVPF-SGLANG-2026-003")
    path, flag_lines = compose(tmp_path, a, "0.5.21")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "acme.yaml").write_text(GOOD.replace('versions: "<0.5.22"',
                                                 'versions: "<0.5.22"\n  when: {settings: {allow_auto_truncate: [true]}}')
                                    .replace('detect: {check: "version"}', 'detect: {review: "image tag"}'))
    report = review([path], ReviewInputs(model_dir=MODELS, gpu="H100 80GB", context_length=None), advisory_dirs=[mine])
    (finding,) = [c for c in report.checks if c.id == "engine-advisories"]
    assert {"ACME-0001", "KVPF-SGLANG-2026-003"} <= set(ids(finding.evidence, "matched"))
    (mine / "acme.yaml").write_text(GOOD.replace("engine: sglang", "engine: sgl"))
    with pytest.raises(ConfigError, match=r"acme\.yaml: advisory ACME-0001: field 'engine'"):
        review([path], ReviewInputs(model_dir=MODELS, gpu="H100 80GB", context_length=None), advisory_dirs=[mine])


@pytest.mark.parametrize("columns", [80, 120])
def test_advisories_list_fits_the_terminal_and_lists_every_advisory(columns):
    everything = run_cli("advisories", "list", "--format", "json")
    ids = [a["id"] for a in json.loads(everything.stdout)]
    r = invoke("advisories", "list", cwd=ROOT, env={"COLUMNS": str(columns)})
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= columns
    assert all(i in r.stdout for i in ids) and f"{len(ids)} advisories" in r.stdout
