"""Where booted engines' logs go is one library rule (`kvpreflight.boot.log_folder`) for `check --boot`
and `demo`: the user's --log-dir as it is; else a temporary folder removed afterwards, whatever
happened, unless --keep, which says where it is."""

from __future__ import annotations

import tempfile

import pytest

from kvpreflight.boot import log_folder


def test_a_named_folder_is_used_and_left_as_it_is(tmp_path):
    said: list[str] = []
    with log_folder(tmp_path / "logs", keep=False, prefix="kvpreflight-x-", say=said.append) as folder:
        assert folder == tmp_path / "logs"
        folder.mkdir()
        (folder / "engine.log").write_text("x")
    assert (tmp_path / "logs" / "engine.log").is_file() and said == []


def test_a_temporary_folder_is_removed_even_when_the_run_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts folders
    said: list[str] = []
    with pytest.raises(RuntimeError), log_folder(None, keep=False, prefix="kvpreflight-x-", say=said.append) as folder:
        assert folder.parent == tmp_path and folder.name.startswith("kvpreflight-x-")
        (folder / "engine.log").write_text("x")
        raise RuntimeError("the engine crashed")
    assert list(tmp_path.iterdir()) == [] and said == []


def test_keep_keeps_the_folder_and_says_where(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts folders
    said: list[str] = []
    with log_folder(None, keep=True, prefix="kvpreflight-x-", say=said.append) as folder:
        (folder / "engine.log").write_text("x")
    assert (folder / "engine.log").is_file() and said == [f"engine logs kept in {folder}"]
    with log_folder(None, keep=True, prefix="kvpreflight-x-", say=said.append, kept_in=tmp_path / "out" / "logs") as kept:
        assert kept == tmp_path / "out" / "logs"
    assert said[-1] == f"engine logs kept in {kept}"
