"""The longest context each engine accepts for a model, by the engine's own rule, and the
setting that lets a launch go past it.

- SGLang 0.5.23, ``srt/utils/hf_transformers/common.py`` ``get_context_length``: the first of
  ``CONTEXT_LENGTH_KEYS`` the config states, times ``rope_scaling.factor`` unless rope_scaling
  has ``original_max_position_embeddings`` (Transformers 5.19 adds it to yarn and longrope) or is
  ``llama3``. ``srt/configs/model_config.py``
  ``_derive_context_length`` raises on a larger ``--context-length`` unless
  ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` is true (``true/1/yes/y``), then only warns.
- vLLM 0.32, ``config/model.py`` ``_get_and_verify_max_len``: the smallest of the
  ``possible_keys`` (``transformers_utils/model_arch_config_convertor.py``
  ``derive_max_model_len_and_key``; ``model_max_length`` replaces it), times the rope factor
  unless the rope type is one that leaves max_position_embeddings already scaled (su, longrope,
  llama3, yarn, deepseek_yarn, deepseek_llama_scaling) or the model is Gemma 3; 2048 when no key
  is stated. A larger ``--max-model-len`` raises unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is
  ``1``/``true``, then warns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvpreflight._internal.review.hfconfig import LENGTH_KEYS, ModelShape

SGLANG_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
VLLM_KEYS = LENGTH_KEYS  # in vLLM's order
VLLM_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
DEFAULT_WHEN_UNSTATED = 2048
SGLANG_OVERRIDE = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
VLLM_OVERRIDE = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
_SGLANG_TRUE = ("true", "1", "yes", "y")
_VLLM_TRUE = ("1", "true")


@dataclass(frozen=True)
class ContextLimit:
    """The engine's longest accepted context for the model, and a launch's request against it."""

    engine: str
    limit: int
    derivation: str  # how the engine reaches `limit` from the config
    requested: int  # the engine flag's value
    flag: str  # e.g. "--context-length"
    line: int
    override: str  # the environment variable that lets the engine start anyway
    override_set: bool

    @property
    def exceeded(self) -> bool:
        return self.requested > self.limit


def _factor(rope: Mapping[str, object] | None) -> float:
    value = (rope or {}).get("factor", 1)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 1.0


def sglang_limit(model: ModelShape) -> tuple[int, str]:
    rope = model.rope_scaling
    factor = _factor(rope) if rope else 1.0
    why = ""
    # Transformers 5.19 (SGLang 0.5.23 pins it) writes original_max_position_embeddings into yarn
    # and longrope parameters when the config leaves it out.
    if rope and ("original_max_position_embeddings" in rope or rope.get("rope_type") in ("llama3", "yarn", "longrope")):
        factor, why = 1.0, f" (rope {rope.get('rope_type')} factor not applied: it has original_max_position_embeddings or is llama3)"
    for key in SGLANG_KEYS:
        if key in model.length_keys:
            value = model.length_keys[key]
            scaled = f" x rope factor {factor:g}" if factor != 1 else ""
            return int(factor * value), f"{key} {value:,}{scaled}{why}"
    return DEFAULT_WHEN_UNSTATED, f"no length key in config.json: SGLang assumes {DEFAULT_WHEN_UNSTATED}"


def vllm_limit(model: ModelShape) -> tuple[int, str]:
    found = [(model.length_keys[k], k) for k in VLLM_KEYS if k in model.length_keys]
    if "model_max_length" in model.length_keys:
        value, key = model.length_keys["model_max_length"], "model_max_length"
    elif found:
        value, key = min(found)
    else:
        return DEFAULT_WHEN_UNSTATED, f"no length key in config.json: vLLM assumes {DEFAULT_WHEN_UNSTATED}"
    rope = model.rope_scaling
    factor, why = 1.0, ""
    if rope and "gemma3" not in model.model_type:
        if rope.get("rope_type") in VLLM_PRESCALED_ROPE:
            why = f" (rope type {rope.get('rope_type')}: factor not applied)"
        else:
            factor = _factor(rope)
    scaled = f" x rope factor {factor:g}" if factor != 1 else ""
    return int(value * factor), f"{key} {value:,}{scaled}{why}"


def override_set(engine: str, env: Mapping[str, str]) -> bool:
    if engine == "sglang":
        return env.get(SGLANG_OVERRIDE, "").strip().lower() in _SGLANG_TRUE
    return env.get(VLLM_OVERRIDE, "0").strip().lower() in _VLLM_TRUE


def context_limit(engine: str, model: ModelShape, requested: int, flag: str, line: int,
                  env: Mapping[str, str]) -> ContextLimit:
    limit, how = sglang_limit(model) if engine == "sglang" else vllm_limit(model)
    override = SGLANG_OVERRIDE if engine == "sglang" else VLLM_OVERRIDE
    return ContextLimit(engine, limit, how, requested, flag, line, override, override_set(engine, env))
