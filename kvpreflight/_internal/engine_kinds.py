"""The engines kvpreflight knows: one registration each, the one source of every engine
vocabulary. `--engine` choices and auto-detection (kvpreflight._internal.engines), the boot spec's engine
kinds and its guess from a launch command (boot/spec.py), review's pool estimators
(review/engines/), the advisory files' engine names, and the kind written into reports and
records (the adapter's `kind`) all read ENGINES; a new engine is its adapter module plus one
line here. Ground floor: imports nothing of kvpreflight, and no adapter is imported until used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRegistration:
    kind: str  # as --engine, boot specs, advisories, reports and records name it
    adapter: str  # "module:Class" of its EngineAdapter; the class's `kind` is this kind
    detected_by: str  # what auto-detection asks the server, said when no kind answers ("": asked as another kind)
    # Words of a launch command that name it: every word of one group in the command (a boot
    # spec's `engine: auto` guesses from them; the adapter confirms over HTTP).
    launched_by: tuple[tuple[str, ...], ...] = ()
    review: str | None = None  # the module `kvpreflight review` estimates its pool with; None: not estimated
    # How `kvpreflight review` finds its launch in a file: the words a launch command starts with
    # (the first one by its base name), or ("-m", module, ...) after a Python interpreter.
    launch_forms: tuple[tuple[str, ...], ...] = ()
    # Words of an image repository name that say the image holds this engine (review reads the
    # engine version from such an image's tag; a private build's image says nothing).
    image_names: tuple[str, ...] = ()


def _register(*registrations: EngineRegistration) -> dict[str, EngineRegistration]:
    return {r.kind: r for r in registrations}


# In auto-detection order: the builtin engine before SGLang, whose wire format it speaks; Dynamo
# before vLLM and SGLang, whose names its launch commands carry (`python -m dynamo.vllm`).
ENGINES: dict[str, EngineRegistration] = _register(
    EngineRegistration("builtin", "kvpreflight._internal.engines.builtin:BuiltinAdapter", "",
                       (("kvpreflight", "engine"),), "kvpreflight._internal.review.engines.builtin",
                       (("-m", "kvpreflight", "engine", "serve"), ("kvpreflight", "engine", "serve"))),
    EngineRegistration("dynamo", "kvpreflight._internal.engines.dynamo:DynamoAdapter", "Dynamo /health",
                       (("dynamo.vllm",), ("dynamo.frontend",))),
    EngineRegistration("sglang", "kvpreflight._internal.engines.sglang:SglangAdapter", "SGLang /server_info", (("sglang",),),
                       "kvpreflight._internal.review.engines.sglang", (("-m", "sglang.launch_server"), ("sglang", "serve")), ("sglang",)),
    EngineRegistration("vllm", "kvpreflight._internal.engines.vllm:VllmAdapter", "vLLM /version", (("vllm",),),
                       "kvpreflight._internal.review.engines.vllm", (("-m", "vllm.entrypoints.openai.api_server"), ("vllm", "serve")),
                       ("vllm",)),
    EngineRegistration("llamacpp", "kvpreflight._internal.engines.llamacpp:LlamaCppAdapter", "llama.cpp /props",
                       (("llama-server",), ("llama_cpp",), ("llama-cpp",)), "kvpreflight._internal.review.engines.llamacpp",
                       (("llama-server",),), ("llama.cpp", "llama-cpp", "llamacpp")),
    EngineRegistration("tgi", "kvpreflight._internal.engines.tgi:TgiAdapter", "TGI /info", (("text-generation-launcher",),)),
    EngineRegistration("trtllm", "kvpreflight._internal.engines.trtllm:TrtllmAdapter", "TensorRT-LLM /v1/models owned_by tensorrt_llm",
                       (("trtllm-serve",),), "kvpreflight._internal.review.engines.trtllm", (("trtllm-serve", "serve"), ("trtllm-serve",)),
                       ("tensorrt-llm", "tensorrt_llm", "trtllm")),
)


def engine_kinds() -> tuple[str, ...]:
    """Every registered kind, in detection order (read when asked, so a registration added at
    run time counts)."""
    return tuple(ENGINES)


def launched_kind(text: str) -> str | None:
    """The first registered kind whose launch words all stand in `text` (lower case), or None."""
    return next((r.kind for r in ENGINES.values() if any(all(w in text for w in group) for group in r.launched_by)), None)
