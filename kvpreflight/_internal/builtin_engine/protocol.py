"""What a request is and what answers it, shared by the HTTP APIs, the PD handoff and the engine.
No torch here: the HTTP side imports this, and only `core` (the engine proper) needs torch.

Request parsing follows sglang/srt/managers/io_struct.py (GenerateReqInput) of 0.5.23.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpreflight import __version__
from kvpreflight._internal.builtin_engine import tokenizer
from kvpreflight.model import ProcessRole

DEFAULT_MAX_NEW_TOKENS = 128

# SGLang's finish_reason object: {"type": "length"|"stop"|"abort", ...}.
FinishReason = dict[str, Any]

# Called with each generated token and its logprob as it is produced (streaming).
OnToken = Callable[[int, float], None]


class RequestError(Exception):
    """A request refused or failed; `status` is the HTTP status SGLang would answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class GenParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    cache_salt: str | None = None
    rid: str = ""
    stream: bool = False


# One logprob entry as SGLang sends it: [logprob or None, token id, token text or None].
LogprobEntry = tuple[float | None, int, None]


@dataclass(frozen=True, kw_only=True)
class Generation:
    rid: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    cached_tokens: int = 0
    input_logprobs: tuple[LogprobEntry, ...] = ()
    output_logprobs: tuple[LogprobEntry, ...] = ()

    @property
    def text(self) -> str:
        return tokenizer.decode(list(self.output_ids))


def new_rid() -> str:
    return uuid.uuid4().hex


def version_string() -> str:
    return f"kvpreflight-builtin {__version__}"


def disaggregation_mode(role: ProcessRole) -> str | None:
    """SGLang's `disaggregation_mode`: prefill or decode, null for a unified engine."""
    return role.value if role in (ProcessRole.PREFILL, ProcessRole.DECODE) else None


def prompt_ids(text: object, input_ids: object) -> list[int]:
    """The prompt's token ids from SGLang's `text` or `input_ids` field (ids win)."""
    if input_ids is not None:
        if not isinstance(input_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
            raise RequestError("input_ids must be a list of integers.")
        bad = [t for t in input_ids if t < 0 or t >= tokenizer.VOCAB_SIZE]
        if bad:
            raise RequestError(f"Token id {bad[0]} is out of vocabulary (vocab size {tokenizer.VOCAB_SIZE}).")
        return list(input_ids)
    if isinstance(text, list):
        raise RequestError("Batched text is not supported by the builtin engine: send one string per request.")
    if not isinstance(text, str):
        raise RequestError("Either text or input_ids should be provided.")
    return tokenizer.encode(text)


def params_from_generate(body: dict[str, Any]) -> GenParams:
    """GenParams from a `/generate` body (the OpenAI route translates its body into one first)."""
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise RequestError("sampling_params must be an object.")
    max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise RequestError(f"max_new_tokens must be a non-negative integer, got {max_new!r}.")
    stop = sp.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    salt = body.get("cache_salt", body.get("extra_key"))
    if salt is not None and not isinstance(salt, str):
        raise RequestError("cache_salt must be a string.")
    start = body.get("logprob_start_len", -1)
    if start is None:
        start = -1
    return GenParams(
        max_new_tokens=max_new,
        stop=tuple(str(s) for s in stop),
        stop_token_ids=tuple(int(t) for t in (sp.get("stop_token_ids") or ())),
        ignore_eos=bool(sp.get("ignore_eos", False)),
        return_logprob=bool(body.get("return_logprob", False)),
        logprob_start_len=int(start) if body.get("return_logprob") else -1,
        cache_salt=salt,
        rid=str(body.get("rid") or new_rid()),
        stream=bool(body.get("stream")),
    )
