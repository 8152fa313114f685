"""The third-party programs that consume kvpreflight's outputs, as scripts/setup_consumers.sh
installs them: on PATH (apt) or in ${KVPREFLIGHT_CACHE:-~/.cache/kvpreflight} (pip, npm).

A missing consumer FAILS the test that needs it (never a skip): run scripts/setup_consumers.sh.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("KVPREFLIGHT_CACHE") or Path.home() / ".cache" / "kvpreflight")
_PLACES = {
    "zizmor": CACHE / "consumers-venv" / "bin" / "zizmor",
    "actionlint": CACHE / "consumers-venv" / "bin" / "actionlint",
    "kubernetes-validate": CACHE / "consumers-venv" / "bin" / "kubernetes-validate",
    # the npm package's own bin runs the binary through a shell, which splits "Gh;Sarif": call it directly
    "sarif-multitool": CACHE / "consumers-npm" / "node_modules" / "@microsoft" / "sarif-multitool-linux" / "Sarif.Multitool",
}


def consumer(name: str) -> str:
    """The path of `name` (promtool, prometheus-node-exporter, shellcheck, zizmor, actionlint,
    sarif-multitool); fails the calling test when it is not installed."""
    place = _PLACES.get(name)
    if place is not None and os.access(place, os.X_OK):
        return str(place)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/setup_consumers.sh (scripts/test.sh builtin runs it)", pytrace=False)
    return found


def run_consumer(name: str, *args: object, timeout: float = 60, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([consumer(name), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
