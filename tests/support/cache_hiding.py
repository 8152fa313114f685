"""A gateway that hides every prefix-cache report, so time to first token is all that is left:
cached-token fields in answers and stream frames, the prefix-cache series of /metrics (vLLM's
prompt tokens by source too: its `local_cache_hit` share is the cache's own count), and the
stated cache setting (/server_info's disable_radix_cache, vLLM's enable_prefix_caching label)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from support.rewriting_proxy import Rewrites

HIDDEN_FIELDS = {"cached_tokens", "prompt_tokens_details", "disable_radix_cache", "cache_n", "tokens_cached"}
HIDDEN_SERIES = ("cached_tokens", "prefix_cache", "prompt_tokens_by_source")
CACHE_SETTING_LABEL = re.compile(r'enable_prefix_caching="[^"]*",?')


def hide_cache_reports(path: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: hide_cache_reports(path, v) for k, v in value.items() if k not in HIDDEN_FIELDS}
    if isinstance(value, list):
        return [hide_cache_reports(path, v) for v in value]
    return value


def hide_cache_series(text: str) -> str:
    return "".join(CACHE_SETTING_LABEL.sub("", line) for line in text.splitlines(keepends=True)
                   if not any(hidden in line for hidden in HIDDEN_SERIES))


SILENT = Rewrites(reply=hide_cache_reports, metrics=hide_cache_series)


def check(url: str, *args: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kvpreflight", "check", "--endpoint", url, "--format", "json", *args],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {}), proc.stderr


def prefix_cache(report: dict) -> dict:
    found = next(c for c in report["checks"] if c["id"] == "prefix-cache-isolation")
    print(found["message"], report.get("cost"))  # the figures, in the test log (pytest -rA)
    return found


