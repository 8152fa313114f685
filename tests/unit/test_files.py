"""The one atomic writer reports and records go through."""

from __future__ import annotations

import os
import stat

import pytest

from kvpreflight._internal.files import write_atomic
from kvpreflight.formats import FormatError, write_text
from kvpreflight.record import RecordError, write_record


def test_a_report_or_record_is_0644_whatever_the_umask_and_leaves_no_temporary_file(tmp_path):
    old = os.umask(0o077)
    try:
        report = write_atomic(tmp_path / "out" / "report.json", "{}\n")
        record = write_record(tmp_path / "out" / "r.dsse.json", {"payload": "", "payloadType": "x", "signatures": []})
    finally:
        os.umask(old)
    assert stat.S_IMODE(report.stat().st_mode) == 0o644 and stat.S_IMODE(record.stat().st_mode) == 0o644
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.dsse.json", "report.json"]


def test_an_existing_file_is_replaced_whole(tmp_path):
    target = tmp_path / "report.txt"
    target.write_text("old and longer than the new text\n")
    write_text("new\n", target)
    assert target.read_text() == "new\n"


def test_an_unwritable_place_is_one_clear_error_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FormatError, match=f"cannot write the report to {blocker}/r.json"):
        write_text("x", blocker / "r.json")
    with pytest.raises(RecordError, match="cannot write record .*choose a writable --record path"):
        write_record(blocker / "r.dsse.json", {})
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
