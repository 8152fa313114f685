"""The JSON Schemas for the report and the fleet report: shipped in the package and in docs/,
versioned with schema_version, and applied to every JSON output of the suite (tests/conftest.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from record_support import sample_report
from support.cli import invoke
from support.schemas import assert_valid, validator

import kvpreflight.schema
from kvpreflight.model import REPORT_SCHEMA_VERSION
from kvpreflight.schema import report_to_dict

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["report", "fleet-report"])
def test_the_schema_in_docs_is_the_one_the_package_ships_and_names_the_current_version(name):
    shipped = (REPO / "kvpreflight" / "schemas" / f"{name}.schema.json").read_text()
    assert (REPO / "docs" / "schemas" / f"{name}.schema.json").read_text() == shipped
    assert json.loads(shipped)["properties"]["schema_version"] == {"const": REPORT_SCHEMA_VERSION}
    validator(name)  # a valid draft 2020-12 schema


def test_every_json_report_the_suite_makes_is_validated():
    assert hasattr(kvpreflight.schema.report_to_dict, "__wrapped__")  # the conftest's validating wrapper is in place
    done = invoke("review", "--format", "json", REPO / "examples" / "review" / "incident-pd-lws.yaml",
                  "--model-dir", REPO / "tests" / "fixtures" / "review" / "models" / "DeepSeek-V3")
    assert done.returncode == 1, done.stderr
    assert_valid("report", json.loads(done.stdout))


def test_a_report_off_the_schema_is_caught_naming_where():
    data = report_to_dict(replace(sample_report(), name="prod"))
    assert_valid("report", data)
    data["engines"][0]["kv_pool_tokens"] = "139264"
    data["checks"][0]["status"] = "mostly-fine"
    with pytest.raises(AssertionError,
                       match=r"checks/0/status: 'mostly-fine' is not one of.*engines/0/kv_pool_tokens: '139264' is not of type"):
        assert_valid("report", data)
