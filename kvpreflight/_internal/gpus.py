"""GPU inventory through NVML (the `nvidia-ml-py` package, imported as `pynvml`).

Never raises: without an NVIDIA driver the inventory is empty and `reason` says why, e.g.
"no NVIDIA driver: NVML Shared Library Not Found". A query that fails for one GPU or one field
leaves that field empty and adds a note; it does not hide the other GPUs.

The PIDs of the processes on each GPU let boot mode say which engine got which GPU: compare them
with `BootedEngine.process_ids()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # None when the driver does not say (e.g. without permission)
    kind: str  # compute | graphics


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None
    uuid: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[Gpu, ...]
    driver_version: str | None = None
    reason: str | None = None  # why there are no GPUs, when NVML could not be used at all
    notes: tuple[str, ...] = ()  # fields that could not be read

    def records(self) -> tuple[Mapping[str, Any], ...]:
        """One plain mapping per GPU, for Report.gpus and JSON output."""
        return tuple({**asdict(gpu), "driver_version": self.driver_version} for gpu in self.gpus)

    def as_dict(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "reason": self.reason,
            "notes": list(self.notes),
            "gpus": [dict(r) for r in self.records()],
        }

    def gpus_of(self, pids: Iterable[int]) -> tuple[Gpu, ...]:
        """The GPUs on which any of `pids` runs."""
        wanted = set(pids)
        return tuple(g for g in self.gpus if any(p.pid in wanted for p in g.processes))


def inventory(nvml: ModuleType | None = None) -> GpuInventory:
    """Ask NVML for every GPU. `nvml` replaces the pynvml module (tests)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            return GpuInventory(gpus=(), reason=f"nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ... and anything else
        return GpuInventory(gpus=(), reason=f"no NVIDIA driver: {_text(exc)}")
    notes: list[str] = []
    try:
        driver = _ask(notes, "driver version", nvml.nvmlSystemGetDriverVersion)
        count = _ask(notes, "GPU count", nvml.nvmlDeviceGetCount)
        gpus = tuple(_one_gpu(nvml, i, notes) for i in range(count or 0))
        return GpuInventory(gpus=gpus, driver_version=_decode(driver), notes=tuple(notes))
    except Exception as exc:
        return GpuInventory(gpus=(), reason=f"NVML query failed: {_text(exc)}", notes=tuple(notes))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _one_gpu(nvml: ModuleType, index: int, notes: list[str]) -> Gpu:
    handle = _ask(notes, f"GPU {index} handle", nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return Gpu(index=index, name=None, uuid=None, memory_total_bytes=None, memory_used_bytes=None)
    memory = _ask(notes, f"GPU {index} memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    processes: list[GpuProcess] = []
    for kind, query in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        function = getattr(nvml, query, None)
        found = _ask(notes, f"GPU {index} {kind} processes", function, handle) if function else None
        for item in found or ():
            used = getattr(item, "usedGpuMemory", None)
            processes.append(GpuProcess(pid=int(item.pid), used_memory_bytes=int(used) if isinstance(used, int) else None, kind=kind))
    return Gpu(
        index=index,
        name=_decode(_ask(notes, f"GPU {index} name", nvml.nvmlDeviceGetName, handle)),
        uuid=_decode(_ask(notes, f"GPU {index} UUID", nvml.nvmlDeviceGetUUID, handle)),
        memory_total_bytes=getattr(memory, "total", None),
        memory_used_bytes=getattr(memory, "used", None),
        processes=tuple(processes),
    )


def _ask(notes: list[str], what: str, function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except Exception as exc:
        notes.append(f"{what}: {_text(exc)}")
        return None


def _decode(value: Any) -> str | None:
    if isinstance(value, bytes):  # older nvidia-ml-py returns bytes
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
