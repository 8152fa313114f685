"""A model's shape from its Hugging Face ``config.json``: what one token costs in KV cache and
what the weights weigh. MHA/GQA, MLA (DeepSeek-V2/V3) and sliding-window declarations."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpreflight._internal.files import FileKind, read_text
from kvpreflight._internal.redact import cut
from kvpreflight._internal.review.interface import ReviewError

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "f16": 2, "auto": None,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "q8_0": 1,
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    config_path: str
    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int | None  # MLA only
    qk_rope_head_dim: int | None  # MLA only
    max_position_embeddings: int | None
    dtype_bytes: int  # the model's own dtype: what "auto" KV dtype means
    weight_bytes: int
    weight_source: str
    sliding_note: str | None  # set when the config declares sliding-window layers
    hidden_size: int = 0
    intermediate_size: int = 0
    moe_intermediate_size: int = 0  # MoE only
    experts_per_token: int = 0  # MoE only
    vocab_size: int = 0
    # the length keys the config states (key -> value) and its rope_scaling, for the engines'
    # context-limit rules
    length_keys: Mapping[str, int] = field(default_factory=dict)
    rope_scaling: Mapping[str, Any] | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def kv_heads_per_rank(self, attn_tp: int) -> int:
        """Heads are split over TP ranks and replicated when TP exceeds them (ceil)."""
        return math.ceil(self.num_kv_heads / max(attn_tp, 1))

    def layers_per_rank(self, pp: int = 1) -> int:
        return math.ceil(self.num_layers / max(pp, 1))

    def kv_bytes_per_token(self, kv_dtype_bytes: int, attn_tp: int, pp: int = 1) -> int:
        """Per rank. MLA: (kv_lora_rank + qk_rope_head_dim) * layers * bytes, not split by TP."""
        layers = self.layers_per_rank(pp)
        if self.is_mla:
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return (self.kv_lora_rank + self.qk_rope_head_dim) * layers * kv_dtype_bytes
        return 2 * layers * self.kv_heads_per_rank(attn_tp) * self.head_dim * kv_dtype_bytes

    def formula(self, kv_dtype_bytes: int, attn_tp: int, pp: int = 1) -> str:
        layers = f"{self.layers_per_rank(pp)} layers" + (f" (of {self.num_layers}, PP {pp})" if pp > 1 else "")
        if self.is_mla:
            return (
                f"MLA: (kv_lora_rank {self.kv_lora_rank} + qk_rope_head_dim {self.qk_rope_head_dim})"
                f" * {layers} * {kv_dtype_bytes} B (not split by TP)"
            )
        return (
            f"2 * {layers} * ceil({self.num_kv_heads} kv_heads / TP {attn_tp})"
            f" * head_dim {self.head_dim} * {kv_dtype_bytes} B"
        )


def load_model(path: Path) -> ModelShape:
    """`path` is a model directory holding config.json (or the config.json itself)."""
    config_path = path / "config.json" if path.is_dir() else path
    text = read_text(config_path, FileKind.MODEL_CONFIG, ReviewError, missing=(
        f"{config_path}: no config.json; point --model-dir at the model's folder (the Hugging Face config.json)"))
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ReviewError(f"{config_path}: cannot read the model config ({exc}); use the model's Hugging Face config.json") from None
    except RecursionError:
        raise ReviewError(f"{config_path}: JSON nested too deeply to read; use the model's Hugging Face config.json") from None
    if not isinstance(raw, dict):
        raise ReviewError(f"{config_path}: expected a JSON object (a Hugging Face config.json)")
    text_config = raw.get("text_config")
    cfg: dict[str, Any] = text_config if isinstance(text_config, dict) else raw
    name = config_path.parent.name

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            v = cfg.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        raise ReviewError(f"{config_path}: '{key}' is missing or not a positive integer; review needs it to size the KV cache")

    def optional(key: str) -> int | None:
        """A size the config may leave out, but if it states one, it must be a positive integer."""
        v = cfg.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ReviewError(f"{config_path}: '{key}' is {v!r:.60}, not a positive integer; fix the model config")
        return v

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    hidden = need("hidden_size", "n_embd", "d_model")
    kv_heads = optional("num_key_value_heads") or heads
    head_dim = optional("head_dim") or hidden // heads
    if head_dim <= 0:
        raise ReviewError(f"{config_path}: hidden_size {hidden} / num_attention_heads {heads} gives no head dimension; "
                          "state head_dim in the model config")
    mla = optional("kv_lora_rank")
    rope = optional("qk_rope_head_dim") if mla else None
    if mla and not rope:
        raise ReviewError(f"{config_path}: has kv_lora_rank (MLA) but no qk_rope_head_dim")
    dtype_name = str(cfg.get("torch_dtype") or raw.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype_name) or 2
    weight_bytes, weight_source = _weights(config_path, raw, cfg, dtype_bytes)
    context = optional("max_position_embeddings") or optional("max_sequence_length")
    return ModelShape(
        name=name,
        config_path=str(config_path),
        model_type=str(cfg.get("model_type", "unknown")),
        num_layers=layers,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        kv_lora_rank=int(mla) if mla else None,
        qk_rope_head_dim=int(rope) if rope else None,
        max_position_embeddings=context,
        dtype_bytes=dtype_bytes,
        weight_bytes=weight_bytes,
        weight_source=weight_source,
        sliding_note=_sliding(cfg),
        hidden_size=hidden,
        intermediate_size=_whole(cfg.get("intermediate_size")) or 4 * hidden,
        moe_intermediate_size=_whole(cfg.get("moe_intermediate_size")),
        experts_per_token=_whole(cfg.get("num_experts_per_tok")) or _whole(cfg.get("num_experts_per_token")),
        vocab_size=_whole(cfg.get("vocab_size")),
        length_keys={k: v for k in LENGTH_KEYS if (v := _whole(cfg.get(k)))},
        rope_scaling=_rope_scaling(cfg),
    )


# Every key an engine reads the model's own length from, in vLLM's order (its
# derive_max_model_len_and_key possible_keys; SGLang's CONTEXT_LENGTH_KEYS are among them).
LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)


def _whole(value: object) -> int:
    """A positive integer the config states, else 0 (the size is optional here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _rope_scaling(cfg: dict[str, Any]) -> Mapping[str, Any] | None:
    """``rope_scaling`` (or Transformers 5's ``rope_parameters``), with ``type`` read as ``rope_type``."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return None
    out = dict(rope)
    if "rope_type" not in out and "type" in out:
        out["rope_type"] = out["type"]
    return out


def _sliding(cfg: dict[str, Any]) -> str | None:
    types = cfg.get("layer_types")
    if isinstance(types, list) and any("sliding" in str(t) for t in types):
        n = sum("sliding" in str(t) for t in types)
        return (
            f"config declares {n} of {len(types)} layers sliding-window ({cfg.get('sliding_window')} tokens); "
            "every layer is counted at full length, so an engine with a hybrid SWA pool holds more than this estimate"
        )
    if cfg.get("use_sliding_window") is True or (cfg.get("sliding_window") and "use_sliding_window" not in cfg):
        return (
            f"config declares sliding_window {cfg.get('sliding_window')}; every layer is counted at full length, "
            "so an engine with a hybrid SWA pool holds more than this estimate"
        )
    return None


def _weights(config_path: Path, raw: dict[str, Any], cfg: dict[str, Any], dtype_bytes: int) -> tuple[int, str]:
    index = config_path.parent / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(read_text(index, FileKind.MODEL_CONFIG, ReviewError))["metadata"]["total_size"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ReviewError(f"{index}: no metadata.total_size; fix the file or remove it to estimate from config.json") from None
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ReviewError(f"{index}: metadata.total_size is {cut(str(total), 40)!r}, not a positive number of bytes; "
                              "fix the file or remove it to estimate from config.json")
        return total, f"{index.name} metadata.total_size"
    try:
        params = parameter_count(cfg)
    except ReviewError as exc:
        raise ReviewError(f"{config_path}: {exc}") from None
    quant = raw.get("quantization_config")
    method = quant.get("quant_method", "") if isinstance(quant, dict) else ""
    per = 1 if str(method).lower() == "fp8" else dtype_bytes
    return params * per, f"parameter count from config.json ({params:,} x {per} B; approximate)"


def parameter_count(cfg: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer as its config describes it (Llama/Qwen/Mistral
    dense, Mixtral/Qwen-MoE/DeepSeek MoE and MLA). Biases are ignored. A size that is not a whole
    number is a ReviewError naming its key."""

    def size(*keys: str, default: int | None = None) -> int:
        """The first of `keys` the config states as a number above 0; else `default` (none: required)."""
        for key in keys:
            value = cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ReviewError(f"'{key}' is {cut(str(value), 40)!r}, not a whole number; fix the model config")
            if value > 0:
                return value
        if default is None:
            raise ReviewError(f"'{keys[0]}' is missing or 0; review needs it to count the model's parameters")
        return default

    h = size("hidden_size", "n_embd", "d_model")
    layers = size("num_hidden_layers", "n_layer", "num_layers")
    heads = size("num_attention_heads", "n_head")
    kv = size("num_key_value_heads", default=heads)
    hd = size("head_dim", default=h // heads)
    vocab = size("vocab_size", default=0)
    inter = size("intermediate_size", default=4 * h)
    if size("kv_lora_rank", default=0):
        nope, rope, v = size("qk_nope_head_dim"), size("qk_rope_head_dim"), size("v_head_dim")
        ql = size("q_lora_rank", default=0)
        q = h * ql + ql * heads * (nope + rope) + ql if ql else h * heads * (nope + rope)
        kvr = size("kv_lora_rank")
        attn = q + h * (kvr + rope) + kvr + kvr * heads * (nope + v) + heads * v * h
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    experts = size("n_routed_experts", "num_local_experts", "num_experts", default=0)
    moe_inter = size("moe_intermediate_size", default=inter)
    shared = size("n_shared_experts", default=0) * 3 * h * moe_inter + 3 * h * size("shared_expert_intermediate_size", default=0)
    dense_layers = min(size("first_k_dense_replace", default=0), layers) if experts else layers
    dense_mlp = 3 * h * inter
    moe_mlp = experts * 3 * h * moe_inter + h * experts + shared
    total = layers * (attn + 2 * h) + dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    total += vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h
    return int(total)
