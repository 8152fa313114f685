"""tests/COVERAGE.md is what tests/support/coverage_map.py makes of tests/real/ now: a real-engine
assertion dropped, moved or weakened shows as a diff of that file in review."""

from __future__ import annotations

from pathlib import Path

from support.coverage_map import render

COMMITTED = Path(__file__).resolve().parents[1] / "COVERAGE.md"


def test_the_committed_coverage_map_is_the_generated_one():
    assert COMMITTED.read_text() == render(), (
        "tests/COVERAGE.md is stale: run `.venv/bin/python tests/support/coverage_map.py > tests/COVERAGE.md` and review the diff")


def test_the_map_names_every_real_test_that_asserts():
    text = render()
    assert "### `test_the_pair_echoes_10_of_10_fresh_canaries` (test," in text
    assert "- `assert echoed == CANARIES`" in text
