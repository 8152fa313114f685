"""A new engine is one adapter module and one registration line; a new report format is one
module and one registry line. Each is added here from a file outside the package, registered by
one entry, and then used end to end as a user would: a capacity-only check that names the new
engine kind in its report, and the report rendered and written in the new format."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from static_server import static_server, vllm_routes

from kvpreflight import preflight
from kvpreflight._internal.engine_kinds import ENGINES, EngineRegistration, engine_kinds
from kvpreflight.check_options import CheckOptions, build_output, build_plan
from kvpreflight.formats import FORMATS, write_report
from kvpreflight.model import Status

TOY_ENGINE = '''
from kvpreflight._internal.engines.vllm import VllmAdapter


class ToyAdapter(VllmAdapter):
    """An engine that speaks vLLM's API under its own name."""

    kind = "toy"
'''

TOY_FORMAT = '''
from kvpreflight.formats.interface import ReportFormat


class CsvFormat(ReportFormat):
    name = "csv"

    def render(self, report):
        return "".join(f"{c.id},{c.status.value}\\n" for c in report.checks)
'''


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "toy_engine.py").write_text(TOY_ENGINE)
    (tmp_path / "toy_format.py").write_text(TOY_FORMAT)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("toy_engine", "toy_format"):
        sys.modules.pop(name, None)


def test_a_new_engine_is_one_module_and_one_registration(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "toy", EngineRegistration("toy", "toy_engine:ToyAdapter", "toy /version"))
    assert "toy" in engine_kinds()
    with static_server(vllm_routes()) as url:
        report = preflight.run(build_plan(CheckOptions(endpoints=(url,), engine="toy", capacity_only=True)))
    (engine,) = report.engines
    assert engine.engine == "toy" and engine.pool_readings
    capacity = next(c for c in report.checks if c.id == "kv-capacity")
    assert capacity.status in (Status.PASS, Status.FAIL, Status.WARN), capacity.message


def test_a_new_format_is_one_module_and_one_registry_line(plugins: Path, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setitem(FORMATS, "csv", "toy_format:CsvFormat")
    out = tmp_path / "report.csv"
    output = build_output(fmt="csv", output=out, record=None, sign_key=None, subjects=(), unsigned=False,
                          command_line=("kvpreflight", "check"), reads_files=False)
    with static_server(vllm_routes()) as url:
        report = preflight.run(build_plan(CheckOptions(endpoints=(url,), capacity_only=True)))
    assert output.format == "csv"
    text = write_report(report, output.format, output.path)
    assert out.read_text() == text and "kv-capacity," in text
    assert len(text.splitlines()) == len(report.checks)
