"""`kvpreflight review` as a user runs it: exit codes, one-line errors, annotations."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.cli import invoke

ROOT = Path(__file__).parents[2]
FIX = ROOT / "tests" / "fixtures" / "review"
MODELS = FIX / "models"
INCIDENT = "examples/review/incident-pd-lws.yaml"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    e.update(env or {})
    return invoke("review", *args, cwd=ROOT, env_exact=e)


def test_incident_manifest_fails_with_exit_1_and_names_file_and_line():
    r = run(INCIDENT, "--model-dir", str(MODELS / "DeepSeek-V3"))
    assert r.returncode == 1, r.stderr
    assert f"{INCIDENT}:27" in r.stdout
    assert "681,512" in r.stdout and "0.65x" in r.stdout
    # what to do: 681,512 / 1.2 warn threshold = 567,926.7 -> serve at most 567,926 tokens
    assert "Serve at most 567,926 tokens" in r.stdout


def test_github_format_annotates_the_context_flag_line():
    r = run(INCIDENT, "--model-dir", str(MODELS / "DeepSeek-V3"), "--format", "github")
    assert r.returncode == 1
    errors = [l for l in r.stdout.splitlines() if l.startswith("::error")]
    capacity = [l for l in errors if "title=kv-capacity-estimate" in l]
    assert len(capacity) == 1 and f"file={INCIDENT}" in capacity[0] and "line=27" in capacity[0]
    # both engines' --context-length lines are over DeepSeek-V3's 163,840 (prefill 27, decode 64)
    limits = [l for l in errors if "title=model-context-limit" in l]
    assert [("line=27" in l, "line=64" in l) for l in limits] == [(True, False), (False, True)]
    assert all("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in l for l in limits)


def test_sarif_points_at_the_file_and_line(tmp_path):
    out = tmp_path / "review.sarif"
    r = run(INCIDENT, "--model-dir", str(MODELS / "DeepSeek-V3"), "--format", "sarif", "--output", str(out))
    assert r.returncode == 1 and r.stdout == ""
    results = json.loads(out.read_text())["runs"][0]["results"]
    failing = [x for x in results if x["level"] == "error"]
    (loc,) = failing[0]["locations"]
    phys = loc["physicalLocation"]
    assert phys["artifactLocation"]["uri"] == INCIDENT and phys["region"]["startLine"] == 27


def test_json_lists_assumptions_and_passes_with_exit_0():
    r = run("tests/fixtures/review/k8s-llama8b-vllm.yaml", "--model-dir", str(MODELS), "--format", "json")
    assert r.returncode == 0, r.stderr
    (check,) = json.loads(r.stdout)["checks"]
    assert check["status"] == "pass" and check["id"] == "kv-capacity-estimate"
    assert any("gpu_memory_utilization" in a or "2 GiB" in a for a in check["evidence"]["assumptions"])


def test_a_warning_exits_0():
    r = run("tests/fixtures/review/compose-llama70b.yml", "--model-dir", str(MODELS), "--gpu", "H100")
    assert r.returncode == 0, r.stderr
    assert "WARN" in r.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["tests/fixtures/review/qwen-tp8.sh", "--model-dir", str(MODELS)], "no GPU for this sglang engine; pass --gpu"),
        (["tests/fixtures/review/qwen-tp8.sh", "--model-dir", str(MODELS), "--gpu", "RTX-9999"],
         "unknown GPU 'RTX-9999'; pass --gpu with one of"),
        (["tests/fixtures/review/qwen-tp8.sh", "--gpu", "H100"], "no config.json for model 'Qwen/Qwen2.5-7B-Instruct'"),
        (["pyproject.toml"], "no engine launch command in pyproject.toml"),
        (["does-not-exist.yaml"], "does-not-exist.yaml: no such file"),
        ([INCIDENT, "--model-dir", str(MODELS / "DeepSeek-V3"), "--format", "xml"], "unknown --format 'xml'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpreflight: error:") and needle in lines[0], lines


def test_non_literal_flag_value_is_exit_2(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text("vllm serve /m \\\n  --tensor-parallel-size $TP\n")
    r = run(str(f), "--gpu", "H100", "--model-dir", str(MODELS / "Llama-3.1-8B-Instruct"))
    assert r.returncode == 2
    assert f"{f}:2: --tensor-parallel-size '$TP' is not an integer" in r.stderr


def test_under_github_actions_the_summary_is_written(tmp_path):
    summary = tmp_path / "summary.md"
    r = run(INCIDENT, "--model-dir", str(MODELS / "DeepSeek-V3"), "--format", "json",
            env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1
    assert "kv-capacity-estimate" in summary.read_text()
    assert f"file={INCIDENT},line=27" in r.stderr.replace(" ", "")


def test_the_fixed_incident_manifest_passes():
    r = run("examples/review/incident-pd-lws.fixed.yaml", "--model-dir", str(MODELS / "DeepSeek-V3"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4.16x of context 163,840" in r.stdout
    assert "model-context-limit" not in r.stdout


@pytest.mark.parametrize("key,value", [("num_key_value_heads", -8), ("head_dim", 0), ("num_key_value_heads", "8"), ("kv_lora_rank", -1)])
def test_a_model_config_with_an_invalid_size_is_a_configuration_error_naming_the_field(tmp_path, key, value):
    """A size that is not a positive integer is a configuration error, never a verdict on a negative pool."""
    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir()
    config = json.loads((MODELS / "Llama-3.1-8B-Instruct" / "config.json").read_text())
    config[key] = value
    if key == "kv_lora_rank":
        config["qk_rope_head_dim"] = 64
    (model / "config.json").write_text(json.dumps(config))
    r = run("tests/fixtures/review/k8s-llama8b-vllm.yaml", "--model-dir", str(tmp_path), "--format", "json")
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-300:])
    (line,) = r.stderr.strip().splitlines()
    assert f"'{key}'" in line and "positive integer" in line and "Traceback" not in r.stderr


def test_a_multi_file_review_reports_each_file_and_goes_on_past_one_it_cannot_estimate(tmp_path: Path):
    # a vLLM launch that names no GPU and no pool size: inconclusive for that launch, and the
    # incident still fails
    unsized = tmp_path / "vllm-unsized.yaml"
    unsized.write_text("deployment: unsized\ncontext_length: 4096\nengines:\n  - name: vllm\n    role: unified\n"
                       "    engine: vllm\n    port: auto\n    command: >-\n"
                       "      python3 -m vllm.entrypoints.openai.api_server --model ./models/echo/hf --port {port}\n"
                       "      --max-model-len 4096\n")
    r = run(INCIDENT, str(unsized), "examples/specs/builtin-pd.yaml",
            "--model-dir", "examples/review/models/DeepSeek-V3")
    assert r.returncode == 1, r.stderr
    rows = {line.split()[2]: line.split()[0] for line in r.stdout.splitlines()
            if line.split()[:1] and line.split()[0] in ("FAIL", "INCONCLUSIVE", "PASS") and "kv-capacity-estimate" in line}
    assert rows[f"{INCIDENT}:27"] == "FAIL"
    assert rows[f"{unsized}:9"] == "INCONCLUSIVE", rows
    assert any(k.startswith("examples/specs/builtin-pd.yaml:") and v == "PASS" for k, v in rows.items()), rows
    header = next(line for line in r.stdout.splitlines() if line.startswith("status"))
    assert header.split()[:3] == ["status", "check", "file"]
    assert "no GPU for this vllm engine; pass --gpu NAME" in r.stdout


def test_the_readme_review_example_runs_from_a_fresh_clone():
    # the README's example and its model folder ship in examples/ (no path under tests/)
    r = run("examples/review/incident-pd-lws.yaml", "--model-dir", "examples/review/models/DeepSeek-V3")
    assert r.returncode == 1 and "0.65x" in r.stdout, r.stdout[-800:] + r.stderr
