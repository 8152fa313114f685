"""Requests the builtin-engine tests send by hand, in SGLang's /generate shape."""

from __future__ import annotations

from typing import Any

import requests

TIMEOUT = 30


def gen(url: str, text: str | None = None, ids: list[int] | None = None, max_new: int = 32, **extra: Any) -> requests.Response:
    """POST /generate with a text or token-id prompt; `extra` joins the body (rid, stream, bootstrap fields)."""
    body: dict[str, Any] = {"sampling_params": {"max_new_tokens": max_new}, **extra}
    if ids is not None:
        body["input_ids"] = ids
    else:
        body["text"] = text
    return requests.post(url + "/generate", json=body, timeout=TIMEOUT)
