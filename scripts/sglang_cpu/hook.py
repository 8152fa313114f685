"""SGLang 0.5.23 on a CPU-only torch: the start-up patches, loaded by a .pth file in the SGLang venv
(scripts/setup_engines.sh, setup_sglang) and inert unless ``KVPF_SGLANG_CPU=1``.

Nothing is imported early: each patch waits for the module it changes to be imported by SGLang
itself (an import hook that runs the patch right after the module's own code), so a Python started
with the variable set costs nothing more until SGLang loads. Every patch is listed in ``PATCHES``
with the SGLang (or library) call that needs it and why. SGLang's child processes (scheduler,
detokenizer) inherit the variable, and with it the patches.

What each one changes, checked against the installed 0.5.23 source:

1. ``sgl_kernel``: the folder ``standins`` goes first on ``sys.path``, so ``import sgl_kernel``
   finds the pure-torch stand-in (standins/sgl_kernel/__init__.py says which SGLang calls need it).
2. ``cpu_has_amx_support()`` answers False (srt/utils/common.py). SGLang takes its AMX branch
   (``torch.ops.sgl_kernel.*_cpu`` ops from the real sgl-kernel CPU build) where
   ``torch.cpu._is_amx_tile_supported()`` and the op ``convert_weight_packed`` exist. The stand-in
   registers no op, so the answer is already False; pinning it keeps every host, a Xeon with AMX
   included, on the torch-native fallback whatever else is installed, as on an AMD host.
3. torchvision's ``nms`` and ``qnms`` schemas (torchvision/_meta_registrations.py). PyPI's
   torchvision 0.28.0 is a CUDA build: its ``_C.so`` does not load on a CPU torch, and its
   ``@torch.library.register_fake("torchvision::nms")`` then raises ``RuntimeError: operator
   torchvision::nms does not exist``, so ``import torchvision`` fails, and with it transformers'
   image processors and timm, which SGLang imports at start-up (srt/utils/hf_transformers_utils.py,
   the multimodal processors). Only where ``torchvision.extension._has_ops()`` is False, the two
   schemas are defined (no kernel: calling them still fails, loudly) so its Python parts import.
4. ``MooncakeKVSender.supports_host_tensor_indices = False`` (srt/disaggregation/mooncake/conn.py).
   With it True, the prefill's ``_send_kv_chunk`` (srt/disaggregation/prefill.py) copies the page
   indices into ``torch.empty(..., pin_memory=True)`` and records a ``torch.cuda.Event``: on a CPU
   torch the first request dies with ``RuntimeError: ... pin_memory=True requires a CUDA or other
   accelerator backend``. False takes the path every other transfer backend takes
   (``kv_to_page_indices``). Only where torch has no accelerator.
5. NIXL memory type "VRAM" becomes "DRAM" (nixl's ``nixl_agent.get_reg_descs``,
   ``get_xfer_descs``, ``prep_xfer_dlist``). SGLang's NIXL backend (srt/disaggregation/nixl/conn.py:
   ``register_buffer_to_engine``, ``_normalize_kv_mem_kinds``, the ``send_*`` methods) hard-codes
   "VRAM" for the KV buffers, which on a CPU torch are host memory; NIXL's UCX backend then refuses
   the registration. Only where torch has no accelerator.

The decode's ``--disaggregation-decode-retraction-backup cpu_tensor`` (else ``Torch not compiled
with CUDA enabled`` at start-up) and ``SGLANG_USE_CPU_ENGINE=1`` are settings, in the specs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENABLED = os.environ.get("KVPF_SGLANG_CPU") == "1"
STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins")
applied: list[str] = []  # the patches that ran in this process, in order (for tests and logs)


def _no_accelerator() -> bool:
    import torch

    return not torch.accelerator.is_available()


def _no_amx(module: ModuleType) -> None:
    module.cpu_has_amx_support = lambda: False  # type: ignore[attr-defined]
    applied.append("cpu_has_amx_support")


def torchvision_schemas(module: ModuleType) -> None:
    if module._has_ops():
        return
    import torch

    for name in ("nms", "qnms"):
        torch.library.define(f"torchvision::{name}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    applied.append("torchvision nms/qnms schemas")


def _mooncake_host_indices(module: ModuleType) -> None:
    if _no_accelerator():
        module.MooncakeKVSender.supports_host_tensor_indices = False
        applied.append("MooncakeKVSender.supports_host_tensor_indices")


def _dram(mem_type: Any) -> Any:
    return "DRAM" if mem_type == "VRAM" else mem_type


def _nixl_dram(module: ModuleType) -> None:
    if not _no_accelerator():
        return
    agent = module._api.nixl_agent
    # (method, position of mem_type among the arguments after self)
    for name, position in (("get_reg_descs", 1), ("get_xfer_descs", 1), ("prep_xfer_dlist", 2)):
        original = getattr(agent, name)
        if getattr(original, "_kvpf_dram", False):
            continue

        def rewritten(self: Any, *args: Any, _original: Callable[..., Any] = original, _at: int = position,
                      **kwargs: Any) -> Any:
            if "mem_type" in kwargs:
                kwargs["mem_type"] = _dram(kwargs["mem_type"])
            elif len(args) > _at:
                args = (*args[:_at], _dram(args[_at]), *args[_at + 1:])
            return _original(self, *args, **kwargs)

        rewritten._kvpf_dram = True  # type: ignore[attr-defined]
        rewritten.__name__ = name
        setattr(agent, name, rewritten)
    applied.append("nixl VRAM->DRAM")


# module imported -> the patch run right after its own code
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "sglang.srt.utils.common": _no_amx,
    "torchvision.extension": torchvision_schemas,
    "sglang.srt.disaggregation.mooncake.conn": _mooncake_host_indices,
    "nixl": _nixl_dram,
}


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds a patched module with the other finders, then runs its patch after the module's code.

    scripts/dynamo_cpu/hook.py installs one with its own patches (the Dynamo venv carries this
    package too)."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_patches(patches: dict[str, Callable[[ModuleType], None]]) -> None:
    if not any(isinstance(f, AfterImport) and f.patches is patches for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(patches))
    for name, patch in patches.items():  # already imported (by whatever ran before the .pth): patch now
        if name in sys.modules:
            patch(sys.modules[name])


def install() -> None:
    if STANDINS not in sys.path:
        sys.path.insert(0, STANDINS)
    install_patches(PATCHES)


if ENABLED:
    install()
