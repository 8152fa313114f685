"""Figures from vLLM 0.32's and SGLang 0.5.23's own functions, for review's unit tests and
bench_review.py. Runs with the engines' Python, not kvpreflight's (nothing here needs a GPU):

    ~/.cache/kvpreflight/vllm-venv/bin/python benchmarks/engine_reference.py SGLANG_SRC > out.json

SGLANG_SRC is the unpacked sglang==0.5.23 wheel (``pip download --no-deps sglang==0.5.23``).
It prints JSON: vLLM's CUDA-graph capture sizes (``VllmConfig._set_cudagraph_sizes``), its batch
defaults (``EngineArgs.get_batch_defaults``), ``request_memory``, and for each fixture model (and
rope variants) vLLM's ``_get_and_verify_max_len`` and SGLang's ``get_context_length``.
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures" / "review" / "models"
GIB = 1 << 30


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool) -> list[int]:
    from vllm.config import vllm as vllm_config_module
    from vllm.config.compilation import CUDAGraphMode

    fake = types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=False),
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, max_cudagraph_capture_size=None,
            cudagraph_capture_sizes=None, post_init_cudagraph_sizes=lambda: None,
        ),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
        speculative_config=None, performance_mode="balanced", uniform_decode_query_len=1,
        parallel_config=types.SimpleNamespace(enable_dbo=False),
    )
    platform = mock.MagicMock()
    platform.is_device_capability_family.return_value = blackwell
    with mock.patch("vllm.platforms.current_platform", platform):
        vllm_config_module.VllmConfig._set_cudagraph_sizes(fake)
    return list(fake.compilation_config.cudagraph_capture_sizes)


def batch_defaults(memory_gib: float, name: str) -> list[int]:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    platform = mock.MagicMock()
    platform.get_device_total_memory.return_value = int(memory_gib * GIB)
    platform.get_device_name.return_value = name
    platform.is_tpu.return_value = False
    platform.is_cpu.return_value = False
    with mock.patch("vllm.engine.arg_utils.current_platform", platform):
        tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    return [tokens[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]]


def load_config(config: dict, folder: Path):
    """The config as Transformers reads a local model folder (no hub access)."""
    from transformers import AutoConfig

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return AutoConfig.from_pretrained(folder, trust_remote_code=False)


def vllm_max_len(config: dict, folder: Path, requested: int | None) -> dict:
    from vllm.config import model as model_module
    from vllm.transformers_utils.config import patch_rope_parameters
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    hf = load_config(config, folder)
    patch_rope_parameters(hf)
    arch = types.SimpleNamespace(
        derived_max_model_len_and_key=ModelArchConfigConvertorBase(hf, hf).derive_max_model_len_and_key())
    derived = model_module._get_and_verify_max_len(hf, arch, None, None, False, None)
    out: dict = {"derived": derived}
    if requested is not None:
        try:
            model_module._get_and_verify_max_len(hf, arch, None, requested, False, None)
            out["accepts"] = True
        except ValueError as exc:
            out["accepts"] = False
            out["error_names_override"] = "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in str(exc)
    return out


def sglang_context(config: dict, folder: Path, sglang_src: str) -> int:
    """SGLang's ``get_context_length`` and ``CONTEXT_LENGTH_KEYS``, taken verbatim from its
    source file and run alone (importing the module pulls in SGLang's whole runtime)."""
    source = Path(sglang_src, "sglang/srt/utils/hf_transformers/common.py").read_text()
    tree = ast.parse(source)
    wanted = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "get_context_length")
              or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "CONTEXT_LENGTH_KEYS" for t in n.targets))]
    namespace: dict = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "sglang-common", "exec"), namespace)
    return namespace["get_context_length"](load_config(config, folder))


def model_configs() -> dict[str, dict]:
    configs = {p.name: json.loads((p / "config.json").read_text()) for p in sorted(FIXTURES.iterdir())}
    base = configs["Qwen2.5-7B-Instruct"]
    # rope variants on a config without rope_scaling of its own: a factor vLLM applies (dynamic,
    # linear) and one it does not (yarn), with and without original_max_position_embeddings
    configs["qwen+dynamic4"] = {**base, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    configs["qwen+yarn4"] = {**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    configs["qwen+yarn4+orig"] = {**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32768}}
    return configs


def main(sglang_src: str) -> None:
    with tempfile.TemporaryDirectory(prefix="kvpreflight-engine-reference-") as tmp:
        out = reference(Path(tmp), sglang_src)
    json.dump(out, sys.stdout, indent=1)
    print()


def reference(scratch: Path, sglang_src: str) -> dict:
    out: dict = {
        "capture_sizes": {
            "h100_defaults_1024_8192": capture_sizes(1024, 8192, False),
            "small_gpu_defaults_256_2048": capture_sizes(256, 2048, False),
            "b200_defaults_1024_16384": capture_sizes(1024, 16384, True),
            "seqs_64_tokens_4096": capture_sizes(64, 4096, False),
        },
        "batch_defaults": {
            "H100 80GB": batch_defaults(79.6, "NVIDIA H100 80GB HBM3"),
            "A100 80GB": batch_defaults(80.0, "NVIDIA A100-SXM4-80GB"),
            "L40S 48GB": batch_defaults(45.0, "NVIDIA L40S"),
            "B200 180GB": batch_defaults(179.0, "NVIDIA B200"),
        },
        "models": {},
    }
    for name, config in model_configs().items():
        entry = {"vllm": vllm_max_len(config, scratch / name / "vllm", 262_144)}
        try:
            entry["sglang"] = sglang_context(config, scratch / name / "sglang", sglang_src)
        except (OSError, KeyError) as exc:
            entry["sglang_error"] = str(exc)
        out["models"][name] = entry
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sgl/src")
