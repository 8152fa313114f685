"""Every command's --help follows the conventions users know: placeholders URL, N, PATH (no Python
type name), nothing for a flag, options in panels, examples for `check`, and nothing cut at 80
columns. The required flags of `engine serve` are reported together."""

from __future__ import annotations

import re

import pytest
from support.cli import command_paths, invoke

PATHS = command_paths()
PYTHON_TYPES = re.compile(r"<(list\[|str|int|float|bool|path|Path)|\{[A-Z_]+\}")


def help_at_80(*path: str) -> str:
    result = invoke(*path, "--help", env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "kvpreflight")
def test_help_shows_no_python_type_and_cuts_nothing_at_80_columns(path):
    text = help_at_80(*path)
    assert not PYTHON_TYPES.search(text), PYTHON_TYPES.search(text)
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.replace("│", " ").split())
    assert "(default" not in flat and "Default:" not in flat, "defaults are shown one way: [default: ...]"


def test_check_help_has_conventional_placeholders_panels_and_examples():
    text = help_at_80("check")
    for panel in ("Target", "Probes", "Isolation", "Budgets", "Output", "Record", "Boot"):
        assert f"─ {panel} ─" in text
    assert re.search(r"--endpoint\s+URL\|ROLE=URL", text) and re.search(r"--context-length\s+N\b", text)
    assert re.search(r"--capacity-only\s+Read-only", text)  # a flag shows no placeholder
    assert "Examples:" in text and "kvpreflight check --endpoint http://localhost:30000" in text
    for engine in ("auto", "builtin", "sglang", "vllm", "llamacpp", "tgi"):
        assert engine in text.split("--engine", 1)[1].split("--model", 1)[0]


def test_verify_usage_names_its_argument_conventionally():
    assert re.search(r"verify \[OPTIONS\] RECORD\.\.\.\s*$", help_at_80("verify"), flags=re.M)


@pytest.mark.parametrize(("role", "missing"), [
    ("unified", ("--context-length N", "--pool-tokens N")),
    ("router", ("--decode-url URL", "--prefill-url URL")),
])
def test_engine_serve_reports_every_missing_required_flag_at_once(role, missing):
    result = invoke("engine", "serve", "--role", role)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert all(flag in line for flag in missing), line
