"""Loads the declarative check data (thresholds, advisories) shipped in `checks/`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvpreflight._internal.files import FileKind, read_bytes
from kvpreflight.errors import ConfigError


class CheckDataError(ConfigError):
    """The check data (ours or a user's folder) is missing or malformed."""


def data_dir() -> Path:
    """The installed copy inside the wheel, else the repository's `checks/` (editable installs)."""
    packaged = Path(__file__).resolve().parents[1] / "_checks_data"  # kvpreflight/_checks_data
    if packaged.is_dir():
        return packaged
    source = Path(__file__).resolve().parents[2] / "checks"
    if source.is_dir():
        return source
    raise CheckDataError("kvpreflight's check data is missing; reinstall kvpreflight")


def load_yaml(path: Path) -> Any:
    from kvpreflight._internal.fields import load_yaml as parse_yaml

    return parse_yaml(read_bytes(path, FileKind.ADVISORY, CheckDataError), str(path), CheckDataError)


@dataclass(frozen=True)
class Thresholds:
    fail_below_ratio: float
    warn_below_ratio: float
    accepted_tokens_per_second: float
    concurrency: int
    # pd-transfer: prompt tokens per request a decode may compute itself without it counting as a
    # recompute, in pages (vLLM computes at least the last prompt token on decode).
    decode_compute_allowance_pages: int = 1


@cache
def load_thresholds(path: Path | None = None) -> Thresholds:
    path = path or data_dir() / "thresholds.yaml"
    raw = load_yaml(path) or {}
    try:
        cap = raw["kv_capacity"]
        probes = raw.get("probes", {})
        t = Thresholds(
            fail_below_ratio=float(cap["fail_below_ratio"]),
            warn_below_ratio=float(cap["warn_below_ratio"]),
            accepted_tokens_per_second=float(probes.get("accepted_tokens_per_second", 20000)),
            concurrency=int(probes.get("concurrency", 2)),
            decode_compute_allowance_pages=int((raw.get("pd_transfer") or {}).get("decode_compute_allowance_pages", 1)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckDataError(f"{path}: kv_capacity.fail_below_ratio and warn_below_ratio are required numbers ({exc})") from exc
    if not 0 < t.fail_below_ratio <= t.warn_below_ratio:
        raise CheckDataError(f"{path}: need 0 < fail_below_ratio <= warn_below_ratio")
    return t
