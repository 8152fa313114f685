"""The suite's three-at-a-time phases keep the tests that share a module's engines, wheel or venv in
one pytest-xdist worker (`--dist loadgroup` and `xdist_group`, scripts/test.sh), so it is built
once per tier. Under pytest 9.2 with pytest-xdist 3.8 no group held (xdist rewrites
`item._nodeid`, which 9.2 no longer reads): the smg pair, the LiteLLM proxy and the wheel were each
built once per worker, and nothing said so. This runs the phase's options on three grouped tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("shared")


@pytest.mark.parametrize("n", range(4))
def test_grouped(n):
    Path(os.environ["WORKERS_OUT"], f"grouped-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("n", range(4))
def test_free(n):
    Path(os.environ["WORKERS_OUT"], f"free-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_tests_in_one_xdist_group_run_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "workers"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           str(tmp_path / "suite")], cwd=tmp_path / "suite", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "WORKERS_OUT": str(out)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = {f.name: f.read_text() for f in out.iterdir()}
    assert len(workers) == 8, workers
    grouped = {w for name, w in workers.items() if name.startswith("grouped-")}
    assert len(grouped) == 1, f"the group's tests ran in {sorted(grouped)}: --dist loadgroup did not hold them together"
