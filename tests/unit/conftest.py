"""The unit tier: in-process, no child process. Engines are FakeEngines behind the real adapter
interface (tests/support/fake_adapter.py), registered as engine kind `fake`, or recorded engine
bodies served by in-process threads (tests/static_server.py, tests/misbehaving_http.py); the CLI
runs in-process (tests/support/cli.py).

Every way Python starts a process is patched for the whole tier (`no_child_processes`): a test that
starts one fails naming what it tried to run, and each module ends by checking that this pytest
process has no child left."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import fake_adapter
from support.no_processes import SPAWNERS, child_pids, refuse

from kvpreflight._internal import engines
from kvpreflight._internal.engine_kinds import EngineRegistration


@pytest.fixture(autouse=True, scope="module")
def no_child_processes() -> Iterator[None]:
    # per module, not per session: a plain `pytest` runs the process tiers after this one
    before = child_pids()  # pytest's own (none, unless a plugin started one before collection)
    patch = pytest.MonkeyPatch()
    for module, name in SPAWNERS:
        if hasattr(module, name):
            patch.setattr(module, name, refuse(f"{module.__name__}.{name}"))
    try:
        yield
    finally:
        patch.undo()
    left = child_pids() - before
    assert not left, f"the unit tier left child processes {sorted(left)}"


@pytest.fixture(autouse=True)
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, fake_adapter.FakeEngine]]:
    monkeypatch.setitem(engines.ENGINES, "fake", EngineRegistration("fake", "support.fake_adapter:FakeAdapter", ""))
    fake_adapter.ENGINES.clear()
    fake_adapter.FakeAdapter.seeds.clear()
    yield fake_adapter.ENGINES
    fake_adapter.ENGINES.clear()
