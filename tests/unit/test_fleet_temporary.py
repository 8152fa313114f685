"""`kvpreflight fleet` leaves no temporary folder behind (issue 30): booted deployments' logs go to
one that is removed once the report and records are written, where the user said, unless --keep.
The boots themselves are stood in for (no process in this tier): each writes its worker log where
the fleet told it to; tests/builtin/test_fleet_boot_local.py boots real ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from support.cli import invoke

from kvpreflight.fleet import job, parse_inventory
from kvpreflight.model import Status

INVENTORY = {"deployments": [{"name": name, "builtin": {"context_length": 1024}} for name in ("one", "two")]}


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory, empty, for this test alone."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(autouse=True)
def booted(monkeypatch: pytest.MonkeyPatch) -> None:
    def boot_in(base: Path, deployment, settings) -> job.Outcome:
        work = base / deployment.name
        work.mkdir(parents=True, exist_ok=True)
        (work / "worker.log").write_text("kvpreflight: error: no engine here\n")
        return job.not_measured(deployment.name, "no engine here")

    monkeypatch.setattr(job, "_boot_in", boot_in)


def inventory(tmp_path: Path) -> Path:
    import json

    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(INVENTORY))
    return path


def test_fleet_removes_its_temporary_folder_and_writes_the_report_and_records_where_the_user_said(tmp_path, temp):
    report, records = tmp_path / "out" / "report.json", tmp_path / "records"
    done = invoke("fleet", inventory(tmp_path), "--format", "json", "--output", report,
                  "--record", records / "fleet.dsse.json", "--unsigned")
    assert done.returncode == 3, done.stderr
    assert list(temp.iterdir()) == []
    assert "(removed afterwards unless --keep)" in done.stderr
    assert report.is_file()
    assert sorted(p.name for p in records.iterdir()) == ["fleet.dsse.json", "one.dsse.json", "two.dsse.json"]


def test_fleet_keep_keeps_the_logs_and_says_where(tmp_path, temp):
    done = invoke("fleet", inventory(tmp_path), "--keep")
    assert done.returncode == 3, done.stderr
    (kept,) = temp.iterdir()
    assert (kept / "one" / "worker.log").is_file() and (kept / "two" / "worker.log").is_file()
    assert f"boot logs kept in {kept}" in done.stderr


def test_a_work_dir_the_user_names_is_kept(tmp_path, temp):
    work = tmp_path / "work"
    assert invoke("fleet", inventory(tmp_path), "--work-dir", work).returncode == 3
    assert (work / "one" / "worker.log").is_file() and list(temp.iterdir()) == []


def test_a_deployment_on_a_ray_node_removes_the_folder_it_made_unless_kept(temp):
    deployment = parse_inventory(INVENTORY).deployments[0]
    gone = job.run_deployment(deployment, job.JobSettings(command_line=("kvpreflight", "fleet"), keep=False))
    assert gone.verdict is Status.INCONCLUSIVE and list(temp.iterdir()) == []
    job.run_deployment(deployment, job.JobSettings(command_line=("kvpreflight", "fleet"), keep=True))
    (kept,) = temp.iterdir()
    assert (kept / "one" / "worker.log").is_file()
