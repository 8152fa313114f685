"""The unit layer: no server, no subprocess. Engines are FakeEngines behind the real adapter
interface (tests/support/fake_adapter.py), registered as engine kind `fake`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import fake_adapter

from kvpreflight import engines


@pytest.fixture(autouse=True)
def fake_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, fake_adapter.FakeEngine]]:
    monkeypatch.setitem(engines.ENGINES, "fake", "support.fake_adapter:FakeAdapter")
    fake_adapter.ENGINES.clear()
    fake_adapter.FakeAdapter.seeds.clear()
    yield fake_adapter.ENGINES
    fake_adapter.ENGINES.clear()
