"""Advisories kept as data (`checks/advisories/*.yaml`, plus any folders the user adds)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kvpreflight.checkdata import CheckDataError, data_dir, load_yaml

SEVERITIES = ("fail", "warn", "info")


@dataclass(frozen=True)
class Advisory:
    id: str
    engine: str
    versions: str
    severity: str
    title: str
    fix: str = ""
    pd: bool | None = None
    settings: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    references: tuple[str, ...] = ()
    source: str = ""

    def applies(self, engine: str, version: str | None, is_pd: bool, settings: Mapping[str, Any]) -> bool | None:
        """True/False; None when the version is unknown and the rest matches (cannot tell)."""
        if engine != self.engine:
            return False
        if self.pd is not None and self.pd != is_pd:
            return False
        for name, allowed in self.settings.items():
            if settings.get(name) not in allowed:
                return False
        parsed = parse_version(version)
        if parsed is None:
            return None
        return all(_satisfies(parsed, c) for c in self.versions.split(","))


def parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.search(r"(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _satisfies(version: tuple[int, ...], constraint: str) -> bool:
    m = re.fullmatch(r"\s*(<=|>=|==|<|>)\s*(\d+(?:\.\d+)*)\s*", constraint)
    if not m:
        raise CheckDataError(f"bad version constraint {constraint!r}; use e.g. '<0.5.21' or '>=0.5.0,<0.5.23'")
    op, other = m[1], tuple(int(p) for p in m[2].split("."))
    width = max(len(version), len(other))
    a, b = version + (0,) * (width - len(version)), other + (0,) * (width - len(other))
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b}[op]


def load_advisories(extra_dirs: Sequence[Path] = ()) -> tuple[Advisory, ...]:
    out: list[Advisory] = []
    for folder in (data_dir() / "advisories", *extra_dirs):
        if not folder.is_dir():
            raise CheckDataError(f"advisory folder {folder} does not exist")
        for path in sorted(folder.glob("*.y*ml")):
            entries = load_yaml(path) or []
            if not isinstance(entries, list):
                raise CheckDataError(f"{path}: expected a list of advisories")
            for i, raw in enumerate(entries):
                out.append(_advisory(raw, f"{path}[{i}]"))
    return tuple(out)


def _advisory(raw: Any, where: str) -> Advisory:
    if not isinstance(raw, dict):
        raise CheckDataError(f"{where}: expected a mapping")
    for key in ("id", "engine", "versions", "severity", "title"):
        if not raw.get(key):
            raise CheckDataError(f"{where}: missing '{key}'")
    if raw["severity"] not in SEVERITIES:
        raise CheckDataError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    when = raw.get("when") or {}
    settings = {k: tuple(v if isinstance(v, list) else [v]) for k, v in (when.get("settings") or {}).items()}
    advisory = Advisory(
        id=str(raw["id"]), engine=str(raw["engine"]), versions=str(raw["versions"]), severity=raw["severity"],
        title=str(raw["title"]), fix=str(raw.get("fix") or ""), pd=when.get("pd"), settings=settings,
        references=tuple(raw.get("references") or ()), source=where,
    )
    for c in advisory.versions.split(","):
        _satisfies((0,), c)  # validate now, not mid-run
    return advisory
