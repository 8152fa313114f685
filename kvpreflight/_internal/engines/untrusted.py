"""What an engine says, read as untrusted: JSON of the expected shape, plausible counts, bounded
quotes, Prometheus text, error messages in any of the engines' shapes. A value of the wrong kind is
an EngineError naming the field (a 200 of the wrong shape measured nothing)."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvpreflight._internal.engines.errors import EngineError
from kvpreflight._internal.redact import cut


def parse_metrics(url: str, text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise EngineError(f"{url}: malformed Prometheus text ({cut(' '.join(str(exc).split()), 120)})") from None
    return out


def served_model(models: Any, url: str) -> tuple[str | None, int | None]:
    """The first model /v1/models lists: its id and served context (the OpenAI list shape)."""
    listed = json_list(json_object(models, "/v1/models answer", url).get("data"), "/v1/models data", url)
    if not listed:
        raise EngineError(f"{url}/v1/models: no model listed")
    first = json_object(listed[0], "/v1/models data[0]", url)
    return (optional_text(first.get("id"), "/v1/models data[0].id", url),
            positive_int(first.get("max_model_len"), "/v1/models data[0].max_model_len", url))


def metric_sum(metrics: Mapping[str, list[tuple[dict[str, str], float]]] | None, *names: str) -> float | None:
    """Sum of every sample of the first name present (counters are split by labels)."""
    if not metrics:
        return None
    for name in names:
        if name in metrics:
            return sum(v for _, v in metrics[name])
    return None


_MAX_TOKENS = 1 << 40  # no engine counts this many tokens: a larger number is not a count
_EXCERPT_CHARS = 60  # what of an engine's value a message quotes


def excerpt(value: Any) -> str:
    """An engine's value as a message quotes it: its repr, cut short (a body may be megabytes)."""
    text = repr(value)
    return text if len(text) <= _EXCERPT_CHARS else f"{cut(text, _EXCERPT_CHARS)} ({len(text):,} chars)"


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


_SHAPE_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"(?:\s*:)?|"[^"]*$|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|'
                          r'[{}\[\],:\s]|[^"{}\[\],:\s]+')
_SHAPE_CHARS = 80


def shape(frame: str) -> str:
    """A frame as a report may quote it: its structure (braces, key names, numbers) with every
    string value and any other text shown as "...", since an answer may hold another tenant's data."""
    out: list[str] = []
    for token in _SHAPE_TOKEN.findall(frame[:4096]):
        if token.startswith('"'):
            key = token.rstrip().endswith(":") and token.endswith(":")
            out.append(token[:24] + ('":' if len(token) > 24 else "") if key else '"..."' if token.endswith('"') else '"...')
        elif token[0].isdigit() or token[0] == "-" or token in ("true", "false", "null") or token in "{}[],: ":
            out.append(token if not token.isspace() else " ")
        else:
            out.append("...")
    text = "".join(out)
    return text if len(text) <= _SHAPE_CHARS else text[:_SHAPE_CHARS] + "..."


def json_object(value: Any, what: str, url: str) -> dict[str, Any]:
    """`value` when it is a JSON object; else the EngineError naming the field (a 200 of the wrong
    shape measured nothing)."""
    if isinstance(value, dict):
        return value
    raise EngineError(f"{url}: {what} is {_json_kind(value)}, not a JSON object")


def optional_object(value: Any, what: str, url: str) -> dict[str, Any]:
    """A JSON object that may be absent (null): {} then."""
    return {} if value is None else json_object(value, what, url)


def json_list(value: Any, what: str, url: str) -> list[Any]:
    if isinstance(value, list):
        return value
    raise EngineError(f"{url}: {what} is {_json_kind(value)}, not a JSON list")


def optional_text(value: Any, what: str, url: str) -> str | None:
    """A name or label the engine gives (a model id, a finish reason); None when absent."""
    if value is None or isinstance(value, str):
        return value
    raise EngineError(f"{url}: {what} is {_json_kind(value)}, not a string")


def token_count(value: Any, what: str, url: str) -> int | None:
    """A count of tokens in a reply (zero allowed), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOKENS:
        raise EngineError(f"{url}: {what} = {excerpt(value)} is not a token count")
    return value


def log_count(digits: str, what: str) -> int:
    """A count an engine's log line states (the digits a pattern matched): plausible, else EngineError.
    Checked before converting: Python refuses to convert thousands of digits."""
    if not digits.isdigit() or len(digits) > len(str(_MAX_TOKENS)) or int(digits) > _MAX_TOKENS:
        raise EngineError(f"engine log: {what} = {cut(digits, 20)} "
                          f"({len(digits):,} digits) is not a plausible token count")
    return int(digits)


def positive_int(value: Any, what: str, url: str) -> int | None:
    """A sane token count, or None when absent; negative or absurd values are an error."""
    if value is None:
        return None
    if isinstance(value, bool):  # JSON true is not the number 1
        raise EngineError(f"{url}: {what} is true/false, not a number")
    try:
        number = int(value)
        whole = number == float(value)
    except (TypeError, ValueError, OverflowError):  # not a number, NaN, infinite, or past any float
        raise EngineError(f"{url}: {what} is not a number ({excerpt(value)})") from None
    if not whole or number <= 0 or number > _MAX_TOKENS:
        raise EngineError(f"{url}: {what} = {excerpt(value)} is not a plausible token count")
    return number


_TEXT_KEYS = frozenset({"text", "content", "generated_text", "reasoning_content"})
_TEXT_CHARS = 1 << 20  # what of a malformed answer's text is kept for the canary scan


def answer_text(body: bytes) -> str:
    """The generated text in a JSON answer whose other fields did not read: every string under a
    key engines put text in, at any depth (an answer with text was served, whatever its counts say)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    found: list[str] = []
    size = 0
    queue: deque[Any] = deque([data])  # in document order, so a canary split across fields still reads
    while queue and size < _TEXT_CHARS:
        item = queue.popleft()
        if isinstance(item, dict):
            texts = [v for k, v in item.items() if k in _TEXT_KEYS and isinstance(v, str)]
            found += texts
            size += sum(map(len, texts))
            queue.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            queue.extend(v for v in item if isinstance(v, (dict, list)))
    return "".join(found)[:_TEXT_CHARS]


def error_message_of(body: bytes) -> str | None:
    """The error message in an engine's JSON error body, in any of the engines' shapes."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python reads
        return None
    return _message_in(data)


_PLAIN_ERROR_CHARS = 200


def error_reply_message(status: int, body: bytes) -> str:
    """What an error reply says: the message of its JSON error body, else its first line as text
    (a router's plain-text "HTTP 503" body names why it refused), else that it said nothing."""
    message = error_message_of(body)
    if message:
        return message
    lines = body[:4096].decode("utf-8", "replace").strip().splitlines()
    line = "".join(ch for ch in lines[0] if ch.isprintable()).strip() if lines else ""
    return f"HTTP {status}: {cut(line, _PLAIN_ERROR_CHARS)}" if line else f"HTTP {status} without an error message"


def _message_in(data: Any) -> str | None:
    if isinstance(data, dict):
        if "error" in data:
            err = data["error"]
            if isinstance(err, dict):
                return str(err.get("message") or cut(json.dumps(err), 300))
            return str(err)
        if "message" in data:  # OpenAI routes: {"object": "error", "message": ...}
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return None


def error_in_event(event: Any) -> str | None:
    """An error frame inside a 200 event stream (SGLang, vLLM send them)."""
    if isinstance(event, dict) and ("error" in event or event.get("object") == "error"):
        return _message_in(event)
    return None
