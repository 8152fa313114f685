"""The built wheel, installed into a fresh venv, works as a user gets it: the check data ships
inside it, SGLang 0.5.20 with PD triggers the intake-reject advisory, and `--help` imports no torch
although torch is importable there."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from static_server import static_server

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "sglang"
# One worker builds the wheel and its venv for both tests (scripts/test.sh: --dist loadgroup); spread over
# two workers the module fixture was built twice, 15 s each.
pytestmark = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(work / "dist"), str(ROOT)],
                   check=True, timeout=300)
    (wheel,) = (work / "dist").glob("kvpreflight-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=120)
    subprocess.run([str(work / "venv" / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=600)
    # torch where the installed kvpreflight could import it (the test venv's, after the wheel's own
    # site-packages): without it "--help imports no torch" could not fail
    torch_spec = importlib.util.find_spec("torch")
    assert torch_spec and torch_spec.origin, "torch is not installed in the test venv (pip install -e '.[engine,test]')"
    (site,) = (work / "venv" / "lib").glob("python3*/site-packages")
    (site / "zz-test-venv-torch.pth").write_text(str(Path(torch_spec.origin).parents[1]) + "\n")
    return work / "venv" / "bin"


def test_wheel_ships_check_data_and_sglang_0_5_20_pd_triggers_the_advisory(installed, tmp_path):
    info = json.loads((FIX / "server_info_prefill.json").read_text())
    assert info["version"] == "0.5.20" and info["disaggregation_mode"] == "prefill"
    routes = {
        "GET /health": (200, "application/json", b""),
        "GET /server_info": (200, "application/json", info),
        "GET /v1/models": (200, "application/json", (FIX / "v1_models.json").read_text()),
        "GET /metrics": (200, "text/plain", (FIX / "metrics_prefill.txt").read_text()),
    }
    with static_server(routes) as url:
        proc = subprocess.run([str(installed / "kvpreflight"), "check", "--endpoint", url, "--capacity-only", "--format", "json"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)  # away from the source tree
    assert proc.returncode == 1, proc.stderr
    advisory = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "engine-advisories")
    assert advisory["status"] == "fail"
    assert "KVPF-SGLANG-2026-001" in advisory["message"] and "0.5.21" in advisory["message"]


def test_installed_help_imports_no_torch(installed, tmp_path):
    importable = subprocess.run([str(installed / "python"), "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)"],
                                capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert importable.stdout.strip() == "True", importable.stderr  # the assertion below can fire
    probe = ("import sys, runpy; sys.argv=['kvpreflight','--help']\n"
             "try:\n    runpy.run_module('kvpreflight', run_name='__main__')\nexcept SystemExit: pass\n"
             "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok')")
    proc = subprocess.run([str(installed / "python"), "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr
    assert "check" in proc.stdout and "verify" in proc.stdout
