"""The published JSON Schemas (kvpreflight/schemas/, copied to docs/schemas/) applied to the JSON
reports and fleet reports the suite makes: in-process, tests/conftest.py wraps the two functions
that build them; a report a kvpreflight process wrote is read with `parsed(...)`. A key the schema
does not describe, or a value of the wrong type, fails the test that produced it."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import pytest


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(resources.files("kvpreflight").joinpath("schemas", f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def assert_valid(name: str, document: Any) -> None:
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, f"{name} does not follow kvpreflight/schemas/{name}.schema.json: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5])


def parsed(text: str, name: str = "report") -> Any:
    """A JSON output of a kvpreflight process, parsed and checked against its published schema."""
    document = json.loads(text)
    assert_valid(name, document)
    return document


@contextlib.contextmanager
def validating() -> Iterator[None]:
    import kvpreflight.fleet.render as fleet_render
    import kvpreflight.schema as report_schema

    report_to_dict, fleet_to_dict = report_schema.report_to_dict, fleet_render.fleet_to_dict

    @functools.wraps(report_to_dict)
    def checked_report(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = report_to_dict(*args, **kwargs)
        assert_valid("report", json.loads(json.dumps(out, default=str)))
        return out

    @functools.wraps(fleet_to_dict)
    def checked_fleet(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = fleet_to_dict(*args, **kwargs)
        assert_valid("fleet-report", json.loads(json.dumps(out, default=str)))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_schema, "report_to_dict", checked_report)
        patch.setattr(fleet_render, "fleet_to_dict", checked_fleet)
        yield
