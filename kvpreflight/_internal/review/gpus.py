"""GPU memory by product name, as the driver reports it (NVML / nvidia-smi ``memory.total``,
in MiB = 2**20 bytes), not the marketed GB. Example: an "H100 80GB" reports 81,559 MiB
(85.5e9 bytes, 79.6 GiB); SGLang reads exactly this number (nvidia-smi) for its defaults.

Names match `--gpu` and the `nvidia.com/gpu.product` node label (e.g. ``NVIDIA-H100-80GB-HBM3``)
after lower-casing and dropping "nvidia", "-", "_" and spaces. Values are the commonly reported
totals for each board; a MIG slice or a different board revision reports less: pass the
exact product or use the runtime `check`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpreflight._internal.review.interface import ReviewError

MIB = 1 << 20


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int  # NVML memory.total
    vendor: str = "nvidia"

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


# name, NVML MiB, spellings (after normalising) that mean it
_TABLE: tuple[tuple[GpuModel, tuple[str, ...]], ...] = (
    (GpuModel("H100 80GB", 81559), ("h100", "h10080gb", "h10080gbhbm3", "h100sxm", "h100sxm580gb", "h100pcie", "h100pcie80gb")),
    (GpuModel("H100 NVL 94GB", 95830), ("h100nvl", "h100nvl94gb")),
    (GpuModel("H200 141GB", 143771), ("h200", "h200141gb", "h200141gbhbm3e", "h200sxm", "h200nvl")),
    (GpuModel("H20 96GB", 97871), ("h20", "h2096gb")),
    (GpuModel("B200 180GB", 183359), ("b200", "b200180gb")),
    (GpuModel("A100 40GB", 40960), ("a10040gb", "a100sxm440gb", "a100pcie40gb")),
    (GpuModel("A100 80GB", 81920), ("a100", "a10080gb", "a100sxm480gb", "a100pcie80gb")),
    (GpuModel("L40S 48GB", 46068), ("l40s", "l40s48gb")),
    (GpuModel("L4 24GB", 23034), ("l4", "l424gb")),
    (GpuModel("A10G 24GB", 23028), ("a10g",)),
    (GpuModel("MI300X 192GB", 196592, "amd"), ("mi300x", "amdinstinctmi300x", "instinctmi300x")),
)


def _norm(name: str) -> str:
    s = name.lower().replace("nvidia", "").replace("amd-", "amd")
    return re.sub(r"[\s_\-]", "", s)


def known_names() -> list[str]:
    return [g.name for g, _ in _TABLE]


def lookup(name: str) -> GpuModel | None:
    key = _norm(name)
    for gpu, spellings in _TABLE:
        if key == _norm(gpu.name) or key in spellings:
            return gpu
    return None


def require(name: str, where: str) -> GpuModel:
    gpu = lookup(name)
    if gpu is None:
        raise ReviewError(
            f"{where}: unknown GPU {name!r}; pass --gpu with one of: {', '.join(known_names())}"
        )
    return gpu
