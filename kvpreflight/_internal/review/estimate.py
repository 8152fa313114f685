"""What every engine estimate shares: the result type, the review-wide inputs, finding the model
and the GPU, and choosing the context to check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvpreflight._internal.review import gpus
from kvpreflight._internal.review.context_limit import ContextLimit
from kvpreflight._internal.review.hfconfig import ModelShape, load_model
from kvpreflight._internal.review.interface import Launch, ReviewError

GIB = 1 << 30


@dataclass(frozen=True)
class ReviewInputs:
    """What the user gave `review` besides the files."""

    model_dir: Path | None = None
    gpu: str | None = None
    context_length: int | None = None


@dataclass(frozen=True)
class Estimate:
    """One engine's KV pool as the engine will size it, and the context it must hold."""

    engine: str
    role: str
    file: str
    line: int  # where an annotation points: the context promise, else the launch
    where: str
    model: str
    gpu: str | None
    pool_tokens: int  # tokens one request can use (per slot for llama.cpp)
    kv_bytes_per_token: int
    kv_bytes_formula: str
    weights_bytes_per_gpu: int | None
    context_checked: int
    context_source: str
    assumptions: tuple[str, ...]
    numbers: Mapping[str, object] = field(default_factory=dict)  # engine-specific inputs, for evidence
    flag_lines: Mapping[str, int] = field(default_factory=dict)
    consequence: str = ""  # what happens at run time when the pool is too small
    # When terms only the GPU can measure decide the pool, pool_tokens is the band's low end and
    # this its high end; None when the pool follows from the files alone.
    pool_tokens_high: int | None = None
    context_limit: ContextLimit | None = None  # the engine's own limit for the model, when it has one

    @property
    def ratio(self) -> float:
        return self.pool_tokens / self.context_checked


def resolve_model(launch: Launch, model_arg: str | None, inputs: ReviewInputs, cache: dict[Path, ModelShape]) -> ModelShape:
    """--model-dir with a config.json wins; else the command's model path, looked up as a folder
    of its own, under --model-dir, or next to the deployment file."""
    candidates: list[Path] = []
    if inputs.model_dir is not None:
        if (inputs.model_dir / "config.json").is_file():
            candidates.append(inputs.model_dir)
        elif model_arg:
            tail = Path(model_arg.strip("/"))
            candidates += [inputs.model_dir / tail, inputs.model_dir / tail.name]
            if tail.suffix == ".gguf":  # llama.cpp: the folder the GGUF sits in names the model
                candidates.append(inputs.model_dir / tail.parent.name)
    if model_arg and not candidates:
        p = Path(model_arg)
        candidates += [p, Path(launch.site.file).parent / p]
        if p.suffix == ".gguf":  # llama.cpp: the config.json beside the GGUF
            candidates += [p.parent, Path(launch.site.file).parent / p.parent]
    candidates = list(dict.fromkeys(candidates))
    for c in candidates:
        if (c / "config.json").is_file():
            key = c.resolve()
            if key not in cache:
                cache[key] = load_model(c)
            return cache[key]
    what = f"model {model_arg!r}" if model_arg else "the model (no --model-path/--model in the command)"
    looked = f" (looked in {', '.join(str(c) for c in candidates)})" if candidates else ""
    raise ReviewError(
        f"{launch.site.file}:{launch.line}: no config.json for {what}{looked}; "
        "pass --model-dir DIR with the model's Hugging Face config.json"
    )


def resolve_gpu(launch: Launch, inputs: ReviewInputs, required: bool = True) -> gpus.GpuModel | None:
    if inputs.gpu:
        return gpus.require(inputs.gpu, "--gpu")
    label = launch.site.gpu_product
    if label:
        where = f"{launch.site.file}:{launch.site.gpu_product_line or launch.line}"
        return gpus.require(label, f"{where}: nvidia.com/gpu.product")
    if not required:
        return None
    raise ReviewError(
        f"{launch.site.file}:{launch.line}: no GPU for this {launch.engine} engine; pass --gpu NAME "
        f"(one of: {', '.join(gpus.known_names())}) or set the nvidia.com/gpu.product node selector"
    )


def checked_context(
    inputs: ReviewInputs, launch: Launch, engine_flag: int | None, engine_flag_name: str, model: ModelShape
) -> tuple[int, str]:
    """The largest context anyone promises: review's --context-length, a boot spec's
    context_length, the engine's own flag; else the model's max_position_embeddings."""
    if engine_flag is not None and engine_flag <= 0:
        raise ReviewError(f"{launch.site.file}:{launch.line}: {engine_flag_name} {engine_flag} is not a context length; "
                          "write the number of tokens the engine serves")
    offers: list[tuple[int, str]] = []
    if inputs.context_length:
        offers.append((inputs.context_length, "review --context-length"))
    if launch.site.context_length:
        offers.append((launch.site.context_length, "boot spec context_length"))
    if engine_flag:
        offers.append((engine_flag, f"engine flag {engine_flag_name}"))
    if offers:
        return max(offers, key=lambda o: o[0])
    if model.max_position_embeddings:
        return int(model.max_position_embeddings), "model max_position_embeddings (no context flag given)"
    raise ReviewError(
        f"{launch.site.file}:{launch.line}: no context length to check; pass --context-length N "
        f"(the model config has no max_position_embeddings)"
    )


def parse_size(text: str, launch: Launch, flag: str) -> int:
    """Integers with vLLM's human-readable suffixes: k/m/g = 1e3/1e6/1e9, K/M/G = 2**10/20/30."""
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip()
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise ReviewError(f"{launch.site.file}:{launch.line}: {flag} {text!r} is not a number of tokens or bytes") from None


def kv_dtype_bytes(value: str | None, model: ModelShape, launch: Launch, flag: str) -> tuple[int, str]:
    from kvpreflight._internal.review.hfconfig import DTYPE_BYTES

    if value is None or value == "auto":
        return model.dtype_bytes, f"KV dtype auto = the model's dtype ({model.dtype_bytes} B)"
    b = DTYPE_BYTES.get(value.lower())
    if b is None:
        raise ReviewError(
            f"{launch.site.file}:{launch.line}: {flag} {value!r} is not a KV dtype review knows; use auto, bf16, fp16, fp8_e4m3 or fp8_e5m2"
        )
    return b, f"KV dtype {value} ({b} B)"
