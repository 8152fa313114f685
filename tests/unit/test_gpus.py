"""GPU inventory. This machine has no NVIDIA driver, so the NVML path runs against a fake
`pynvml` module shaped like nvidia-ml-py's (nvmlInit, nvmlDeviceGetHandleByIndex, ...); the real
NVML path was NOT exercised here. The no-driver path is the real one."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kvpreflight._internal.cli import app
from kvpreflight._internal.gpus import inventory

GIB = 2**30


class NVMLError(Exception):
    pass


def fake_nvml(*, init_error=None, fail=()):
    """Two H100s; PID 4242 on GPU 0 (compute), PID 77 on GPU 1 (graphics)."""
    devices = [
        dict(name="NVIDIA H100 80GB HBM3", uuid="GPU-aaaa", total=80 * GIB, used=70 * GIB,
             compute=[SimpleNamespace(pid=4242, usedGpuMemory=69 * GIB)], graphics=[]),
        dict(name=b"NVIDIA H100 80GB HBM3", uuid=b"GPU-bbbb", total=80 * GIB, used=1 * GIB,
             compute=[], graphics=[SimpleNamespace(pid=77, usedGpuMemory=None)]),
    ]
    calls = []

    def failing(name, result):
        def function(*args):
            calls.append(name)
            if name in fail:
                raise NVMLError("Insufficient Permissions")
            return result(*args)
        return function

    def init():
        calls.append("init")
        if init_error:
            raise NVMLError(init_error)

    module = types.ModuleType("pynvml")
    module.calls = calls
    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.append("shutdown")
    module.nvmlSystemGetDriverVersion = failing("driver", lambda: "580.65.06")
    module.nvmlDeviceGetCount = failing("count", lambda: len(devices))
    module.nvmlDeviceGetHandleByIndex = failing("handle", lambda i: devices[i])
    module.nvmlDeviceGetName = failing("name", lambda h: h["name"])
    module.nvmlDeviceGetUUID = failing("uuid", lambda h: h["uuid"])
    module.nvmlDeviceGetMemoryInfo = failing("memory",
                                             lambda h: SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"]))
    module.nvmlDeviceGetComputeRunningProcesses = failing("compute", lambda h: h["compute"])
    module.nvmlDeviceGetGraphicsRunningProcesses = failing("graphics", lambda h: h["graphics"])
    return module


def test_inventory_reads_every_gpu_and_its_processes():
    nvml = fake_nvml()
    found = inventory(nvml)
    assert found.reason is None and found.notes == ()
    assert found.driver_version == "580.65.06"
    assert [(g.index, g.name, g.uuid) for g in found.gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "GPU-aaaa"), (1, "NVIDIA H100 80GB HBM3", "GPU-bbbb")]  # bytes decoded
    assert found.gpus[0].memory_total_bytes == 80 * GIB and found.gpus[0].memory_used_bytes == 70 * GIB
    assert [(p.pid, p.kind, p.used_memory_bytes) for p in found.gpus[0].processes] == [(4242, "compute", 69 * GIB)]
    assert [(p.pid, p.kind, p.used_memory_bytes) for p in found.gpus[1].processes] == [(77, "graphics", None)]
    assert [g.uuid for g in found.gpus_of({4242, 999})] == ["GPU-aaaa"]
    assert found.records()[1]["driver_version"] == "580.65.06"
    assert nvml.calls[-1] == "shutdown"


def test_a_failing_field_is_a_note_not_a_lost_inventory():
    found = inventory(fake_nvml(fail=("compute", "uuid")))
    assert len(found.gpus) == 2 and found.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert found.gpus[0].uuid is None and found.gpus[0].processes == ()
    assert "GPU 0 compute processes: Insufficient Permissions" in found.notes


def test_driver_missing_gives_an_empty_inventory_and_the_reason():
    nvml = fake_nvml(init_error="Driver Not Loaded")
    found = inventory(nvml)
    assert found.gpus == () and found.reason == "no NVIDIA driver: Driver Not Loaded"
    assert "count" not in nvml.calls


def test_real_nvml_on_this_machine_says_why_there_are_no_gpus():
    found = inventory()
    if found.gpus:
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be shown here")
    assert found.reason == "no NVIDIA driver: NVML Shared Library Not Found"


def test_gpus_command_without_driver_says_so_and_exits_0(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="NVML Shared Library Not Found"))
    result = CliRunner().invoke(app, ["gpus"])
    assert result.exit_code == 0
    assert result.stdout == "No GPUs found (no NVIDIA driver: NVML Shared Library Not Found).\n"
    result = CliRunner().invoke(app, ["gpus", "--format", "json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"driver_version": None, "reason": "no NVIDIA driver: NVML Shared Library Not Found",
                                          "notes": [], "gpus": []}


def test_gpus_command_lists_gpus_and_pids(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    result = CliRunner().invoke(app, ["gpus"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert any("GPU-aaaa" in line and "70.0" in line and "80.0" in line and "4242" in line for line in lines)
    assert any("GPU-bbbb" in line and "77" in line for line in lines)
    assert lines[-1] == "NVIDIA driver 580.65.06"
    data = json.loads(CliRunner().invoke(app, ["gpus", "--format", "json"]).stdout)
    assert data["gpus"][0]["processes"] == [{"pid": 4242, "used_memory_bytes": 69 * GIB, "kind": "compute"}]
