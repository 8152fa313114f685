"""A pure-torch stand-in for ``sgl_kernel`` (the sglang-kernel package), for SGLang 0.5.23 on CPU.

SGLang's wheel requires sglang-kernel, a CUDA build; its CPU build (with AMX/AVX-512 kernels
registered as ``torch.ops.sgl_kernel.*``) is not on PyPI. On a CPU device SGLang takes its
torch-native fallback for every op it would otherwise find under ``torch.ops.sgl_kernel``
(``cpu_has_amx_support()`` in srt/utils/common.py asks ``hasattr(torch.ops.sgl_kernel,
"convert_weight_packed")``; srt/models/utils.py and qwen3_moe.py ask for their fused ops the same
way), so this module deliberately registers NO ``torch.ops.sgl_kernel`` op: every other CPU kernel
stays on SGLang's fallback. What SGLang imports from ``sgl_kernel`` by name at module level on CPU
(``if _is_cpu: from sgl_kernel import ...``), and so cannot start without, is:

- the two functions its plain (non-speculative) CPU path calls, written here in torch with the
  semantics of the Triton kernels they replace: ``assign_req_to_token_pool_cpu`` and
  ``copy_all_layer_kv_cache_cpu``;
- seven speculative-decoding ops (EAGLE, tree verification) whose modules the server imports at
  start-up whether or not speculative decoding is on (``SPECULATIVE_ONLY`` below): they are
  present so those imports succeed, and raise NotImplementedError if ever called, so a deployment
  with speculative decoding fails loudly here rather than running on a guess. (Mamba and other
  ops SGLang imports inside functions a plain Llama never calls are left out: such a call is an
  ImportError, as loud.)

Installed by scripts/setup_engines.sh into the SGLang venv only (site-packages/kvpf_sglang_cpu/standins,
put on sys.path by kvpf_sglang_cpu.hook when KVPF_SGLANG_CPU=1).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

__version__ = "0.0.0+kvpreflight-cpu-standin"


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any, req_to_token: Any, start_offset: Any, end_offset: Any, out_cache_loc: Any, pool_len: int
) -> None:
    """Needed by srt/mem_cache/allocation.py, which runs ``from sgl_kernel import
    assign_req_to_token_pool_cpu`` at import when ``is_cpu()`` (the scheduler imports it at start-up),
    and calls it from ``assign_req_to_token_pool_func`` on CPU instead of the Triton kernel
    ``assign_req_to_token_pool`` (in 0.5.23 its callers are ``alloc_for_spec_decode``, i.e. speculative
    decoding). The same semantics as that Triton kernel: request i's row ``req_pool_indices[i]`` of
    ``req_to_token`` gets, at columns ``start_offset[i]:end_offset[i]``, the next
    ``end_offset[i] - start_offset[i]`` entries of ``out_cache_loc`` (the requests' slots laid end to
    end, in batch order)."""
    del pool_len  # the row length; torch's slicing knows it
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        count = end - start
        if count > 0:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + count].to(req_to_token.dtype)
        offset += count


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """Needed by sglang/kernels/ops/kvcache/cache_move.py, which runs ``from sgl_kernel import
    copy_all_layer_kv_cache_cpu`` at import when ``is_cpu()``; its ``copy_all_layer_kv_cache_func``
    calls it on CPU instead of the Triton kernel ``copy_all_layer_kv_cache_tiled``, at every KV pool's
    start-up (srt/mem_cache/memory_pool.py ``_init_kv_copy_and_warmup``: a one-slot warm-up copy) and
    whenever KV slots are moved (``move_kv_cache``). ``data_ptrs`` holds the address of every layer's K
    and V buffer (uint64), ``strides`` each buffer's slot size in bytes; for each buffer, slot
    ``src_loc[j]`` is copied over slot ``tgt_loc[j]``. As the Triton kernel does (it loads every source
    row of a tile before it stores), all source slots are read before any target is written."""
    targets = tgt_loc.tolist()
    sources = src_loc.tolist()
    if not targets:
        return
    rows = max(max(targets), max(sources)) + 1
    tgt = torch.tensor(targets, dtype=torch.long)
    src = torch.tensor(sources, dtype=torch.long)
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        memory = (ctypes.c_uint8 * (rows * stride)).from_address(base)
        slots = torch.frombuffer(memory, dtype=torch.uint8).view(rows, stride)
        slots[tgt] = slots[src]


def _speculative_only(name: str, module: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} (imported by {module}) is a speculative-decoding kernel that "
            "kvpreflight's CPU stand-in does not provide: run SGLang without speculative decoding here")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


# name -> the SGLang 0.5.23 module that imports it at module level when is_cpu() (start-up needs the name)
SPECULATIVE_ONLY = {
    "rotate_input_ids_cpu": "sglang/kernels/ops/speculative/multi_layer_eagle.py",
    "fill_accept_out_cache_loc_cpu": "sglang/kernels/ops/speculative/eagle.py",
    "fill_bonus_tokens_cpu": "sglang/kernels/ops/speculative/eagle.py",
    "assign_draft_cache_locs_contiguous_cpu": "sglang/kernels/ops/speculative/cache_locs.py",
    "assign_extend_cache_locs_cpu": "sglang/kernels/ops/speculative/cache_locs.py",
    "build_tree_kernel_efficient_cpu": "sglang/kernels/ops/speculative/spec_tree.py",
    "verify_tree_greedy_cpu": "sglang/kernels/ops/speculative/spec_tree.py",
}
globals().update({name: _speculative_only(name, module) for name, module in SPECULATIVE_ONLY.items()})
