"""Advisories kept as data (`checks/advisories/*.yaml`, plus any folders the user adds).

The schema is in `checks/advisories/SCHEMA.md`; every file is validated when loaded and the first
problem is one line naming the file, the entry and the field. An advisory is judged against
`EngineFacts` - what `check` read from a running engine, or what `review` read from a launch
command and its image tag - by `assess`; `summarise` turns the assessments into one result. The
engine-specific names (setting keys, their defaults) live in the data, not here.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpreflight._internal.checkdata import CheckDataError, data_dir, load_yaml
from kvpreflight._internal.engine_kinds import ENGINES
from kvpreflight.model import Status

# `fixed` is a version, or one of these words (see SCHEMA.md).
FIXED_WORDS = ("open", "unverified", "n/a")
ID_PATTERN = re.compile(r"[A-Z][A-Z0-9]*(-[A-Z0-9]+)+")
FIELDS = frozenset({"id", "engine", "versions", "fixed", "verified", "severity", "title", "fix", "when",
                    "references", "detect", "verification"})
REQUIRED = ("id", "engine", "versions", "fixed", "verified", "severity", "title", "fix", "references",
            "detect", "verification")
_CONSTRAINT = re.compile(r"\s*(<=|>=|==|<|>)\s*(\d+(?:\.\d+)*)\s*")


class Severity(str, enum.Enum):
    FAIL = "fail"
    WARN = "warn"
    INFO = "info"


class Match(str, enum.Enum):
    APPLIES = "applies"
    NO = "no"
    UNKNOWN = "unknown"  # every condition that could be read holds; at least one could not be read


@dataclass(frozen=True)
class SettingCondition:
    """One setting the advisory needs: its value is one of `values`, contains `contains`, or
    (`present`) has any value at all. `default` is the engine's value when a launch command does
    not set it (review only: a running engine that does not report a setting is not assumed to run
    the default)."""

    name: str
    values: tuple[str, ...] = ()
    contains: str | None = None
    present: bool = False
    default: str | None = None

    def holds(self, value: Any) -> bool:
        text = normalise(value)
        if self.present:
            return text not in ("", "none", "false")
        if self.contains is not None:
            return self.contains in text
        return text in self.values


@dataclass(frozen=True, kw_only=True)
class Advisory:
    id: str
    engine: str
    versions: str  # comma-separated constraints, all must hold: "<0.5.21", ">=0.7.0,<0.9.0"
    fixed: str  # the first fixed version, or open | unverified | n/a
    verified: bool
    severity: Severity
    title: str
    fix: str
    pd: bool | None = None  # True: only prefill/decode deployments; False: only unified ones
    settings: tuple[SettingCondition, ...] = ()
    references: tuple[str, ...] = ()
    detect_check: str = ""
    detect_review: str = ""
    verification: str = ""
    source: str = ""  # file it came from

    def assess(self, facts: EngineFacts) -> Assessment:
        if facts.engine != self.engine:
            return Assessment(self, Match.NO)
        unknown: list[str] = []
        if self.pd is not None:
            if facts.pd is None:
                unknown.append("whether it is a prefill/decode deployment")
            elif facts.pd != self.pd:
                return Assessment(self, Match.NO)
        for cond in self.settings:
            value = facts.settings.get(cond.name)
            if value is None and facts.unset_means_default:
                value = cond.default
            if value is None:
                unknown.append(f"setting {cond.name}")
            elif not cond.holds(value):
                return Assessment(self, Match.NO)
        parsed = parse_version(facts.version)
        if parsed is None:
            if not every_version(self.versions):  # ">=0" holds whatever the version
                unknown.append("version")
        elif not version_in(parsed, self.versions):
            return Assessment(self, Match.NO)
        return Assessment(self, Match.UNKNOWN if unknown else Match.APPLIES, tuple(unknown))

    def as_dict(self) -> dict[str, Any]:
        when: dict[str, Any] = {}
        if self.pd is not None:
            when["pd"] = self.pd
        if self.settings:
            when["settings"] = {
                c.name: {k: v for k, v in (("in", list(c.values)), ("contains", c.contains), ("present", c.present),
                                           ("default", c.default)) if v}
                for c in self.settings
            }
        return {
            "id": self.id, "engine": self.engine, "versions": self.versions, "fixed": self.fixed,
            "verified": self.verified, "severity": self.severity.value, "title": self.title, "fix": self.fix,
            "when": when, "references": list(self.references),
            "detect": {"check": self.detect_check, "review": self.detect_review},
            "verification": self.verification, "source": self.source,
        }


@dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """What is known about one engine. None: not known."""

    engine: str
    version: str | None
    pd: bool | None
    settings: Mapping[str, Any] = field(default_factory=dict)
    # review: a flag the launch does not write has the engine's default value
    unset_means_default: bool = False


@dataclass(frozen=True)
class Assessment:
    advisory: Advisory
    match: Match
    unknown: tuple[str, ...] = ()  # what could not be read, when match is UNKNOWN


def normalise(value: Any) -> str:
    """Settings compare as lower-case text: True, "True" and "true" are the same value."""
    return str(value).strip().lower()


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """The first dotted number: "v0.5.20" -> (0, 5, 20), "0.9.0.1" -> (0, 9, 0, 1), "b10241" -> (10241,)."""
    if not text:
        return None
    m = re.search(r"(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def every_version(constraints: str) -> bool:
    """Whether the constraints hold for every version (">=0"): then the version need not be known."""
    return all(re.fullmatch(r"\s*>=\s*0(?:\.0)*\s*", c) for c in constraints.split(","))


def version_in(version: tuple[int, ...], constraints: str) -> bool:
    return all(_satisfies(version, c) for c in constraints.split(","))


def _satisfies(version: tuple[int, ...], constraint: str) -> bool:
    m = _CONSTRAINT.fullmatch(constraint)
    if not m:
        raise CheckDataError(f"bad version constraint {constraint!r}; use e.g. '<0.5.21' or '>=0.5.0,<0.5.23'")
    op, other = m[1], tuple(int(p) for p in m[2].split("."))
    width = max(len(version), len(other))
    a, b = version + (0,) * (width - len(version)), other + (0,) * (width - len(other))
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b}[op]


def advisory_files(folder: Path) -> list[Path]:
    """The advisory files of one folder, in the order they are read."""
    if not folder.is_dir():
        raise CheckDataError(f"advisory folder {folder} does not exist")
    return sorted(folder.glob("*.y*ml"))


def load_advisories(extra_dirs: Sequence[Path] = ()) -> tuple[Advisory, ...]:
    """kvpreflight's advisories, then each extra folder's; an id may appear once in all of them."""
    out: list[Advisory] = []
    seen: dict[str, str] = {}
    for folder in (data_dir() / "advisories", *extra_dirs):
        for path in advisory_files(folder):
            entries = load_yaml(path)
            if entries is None:
                continue
            if not isinstance(entries, list):
                raise CheckDataError(f"{path}: expected a list of advisories (each item starts with '- id: ...')")
            for i, raw in enumerate(entries):
                advisory = parse_advisory(raw, path, i)
                if advisory.id in seen:
                    raise CheckDataError(f"{path}: advisory {advisory.id}: field 'id': already defined in {seen[advisory.id]}")
                seen[advisory.id] = str(path)
                out.append(advisory)
    return tuple(out)


def parse_advisory(raw: Any, path: Path, index: int) -> Advisory:
    """One entry, validated against SCHEMA.md; the first problem raises one line naming file, entry and field."""
    name = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{index + 1}"
    where = f"{path}: advisory {name}"

    def bad(field_name: str, problem: str) -> CheckDataError:
        return CheckDataError(f"{where}: field '{field_name}': {problem}")

    if not isinstance(raw, dict):
        raise CheckDataError(f"{where}: expected a mapping of fields (id, engine, versions, ...)")
    for key in raw:
        if key not in FIELDS:
            raise bad(str(key), f"unknown field; the fields are {', '.join(sorted(FIELDS))}")
    for key in REQUIRED:
        if raw.get(key) in (None, "", []):
            raise bad(key, "missing")
    for key in ("id", "engine", "versions", "fixed", "title", "fix", "verification"):
        if not isinstance(raw[key], str):
            raise bad(key, f"must be text (got {type(raw[key]).__name__})")
    if not ID_PATTERN.fullmatch(raw["id"]):
        raise bad("id", f"{raw['id']!r} must be upper-case words joined by '-', e.g. KVPF-SGLANG-2026-001")
    if raw["engine"] not in ENGINES:
        raise bad("engine", f"{raw['engine']!r} must be one of {', '.join(ENGINES)}")
    try:
        version_in((0,), raw["versions"])
    except CheckDataError as exc:
        raise bad("versions", str(exc)) from None
    if "\n" in raw["title"]:
        raise bad("title", "must be one line")
    if not isinstance(raw["verified"], bool):
        raise bad("verified", "must be true or false")
    try:
        severity = Severity(raw["severity"])
    except ValueError:
        raise bad("severity", f"must be one of {', '.join(s.value for s in Severity)}") from None
    if severity is Severity.FAIL and not raw["verified"]:
        raise bad("severity", "only a verified advisory (verified: true) may be fail; use warn")
    fixed = raw["fixed"]
    if fixed not in FIXED_WORDS:
        parsed_fixed = parse_version(fixed) if re.fullmatch(r"\d+(\.\d+)*", fixed) else None
        if parsed_fixed is None:
            raise bad("fixed", f"{fixed!r} must be a version (0.5.21) or one of {', '.join(FIXED_WORDS)}")
        if version_in(parsed_fixed, raw["versions"]):
            raise bad("fixed", f"{fixed} is inside the affected versions {raw['versions']!r}")
        if not raw["verified"]:
            raise bad("fixed", "a fixed version needs verified: true; write 'unverified' until it is checked")
    refs = raw["references"]
    if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip() for r in refs):
        raise bad("references", "must be a list of links (https://...) or repository paths")
    detect = raw["detect"]
    if not isinstance(detect, dict) or set(detect) - {"check", "review"} or not all(isinstance(v, str) and v for v in detect.values()):
        raise bad("detect", "must be a mapping with 'check' and/or 'review': how each sees the advisory")
    pd, settings = _when(raw.get("when"), bad)
    return Advisory(
        id=raw["id"], engine=raw["engine"], versions=raw["versions"], fixed=fixed, verified=raw["verified"],
        severity=severity, title=raw["title"].strip(), fix=raw["fix"].strip(), pd=pd, settings=settings,
        references=tuple(r.strip() for r in refs), detect_check=detect.get("check", ""),
        detect_review=detect.get("review", ""), verification=" ".join(raw["verification"].split()), source=str(path),
    )


def _when(when: Any, bad: Callable[[str, str], CheckDataError]) -> tuple[bool | None, tuple[SettingCondition, ...]]:
    if when is None:
        return None, ()
    if not isinstance(when, dict) or set(when) - {"pd", "settings"}:
        raise bad("when", "must be a mapping with 'pd' and/or 'settings'")
    pd = when.get("pd")
    if pd is not None and not isinstance(pd, bool):
        raise bad("when.pd", "must be true or false")
    raw_settings = when.get("settings") or {}
    if not isinstance(raw_settings, dict):
        raise bad("when.settings", "must be a mapping of setting name to values")
    out = []
    for name, spec in raw_settings.items():
        label = f"when.settings.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise bad(label, "a setting name is the engine's snake_case key, e.g. disaggregation_transfer_backend")
        if isinstance(spec, list):
            spec = {"in": spec}
        elif not isinstance(spec, dict):
            spec = {"in": [spec]}
        tests = [k for k in ("in", "contains", "present") if k in spec]
        if set(spec) - {"in", "contains", "present", "default"} or len(tests) != 1:
            raise bad(label, "give a list of values, or a mapping with one of 'in' (list), 'contains' (text), "
                             "'present: true', and optionally 'default'")
        if "present" in spec and spec["present"] is not True:
            raise bad(f"{label}.present", "must be true (the setting has any value)")
        values = spec.get("in")
        if values is not None and (not isinstance(values, list) or not values or any(isinstance(v, (dict, list)) for v in values)):
            raise bad(f"{label}.in", "must be a non-empty list of values")
        contains = spec.get("contains")
        if contains is not None and (not isinstance(contains, str) or not contains):
            raise bad(f"{label}.contains", "must be non-empty text")
        default = spec.get("default")
        if isinstance(default, (dict, list)):
            raise bad(f"{label}.default", "must be one value")
        out.append(SettingCondition(
            name=name, values=tuple(normalise(v) for v in values or ()),
            contains=normalise(contains) if contains is not None else None, present="present" in spec,
            default=normalise(default) if default is not None else None,
        ))
    return pd, tuple(out)


@dataclass(frozen=True)
class Summary:
    status: Status
    message: str
    evidence: Mapping[str, Any]


def summarise(subject: str, assessments: Sequence[Assessment], *, static: bool) -> Summary:
    """One verdict for one engine. An advisory that applies: its severity. One that may apply
    (something could not be read): the running check (`static` False) is inconclusive when it is
    a fail advisory or the version is unknown, else warns; the static review warns - it is an
    estimate and `check` is the proof."""
    hits = [a.advisory for a in assessments if a.match is Match.APPLIES and a.advisory.severity is not Severity.INFO]
    notes = [a.advisory for a in assessments if a.match is Match.APPLIES and a.advisory.severity is Severity.INFO]
    maybe = [a for a in assessments if a.match is Match.UNKNOWN and a.advisory.severity is not Severity.INFO]
    blocking = [] if static else [
        a for a in maybe if a.advisory.severity is Severity.FAIL or "version" in a.unknown
    ]
    evidence = {
        "matched": [_brief(a) for a in hits],
        "may_apply": [{**_brief(a.advisory), "not_known": list(a.unknown)} for a in maybe],
        "notes": [{"id": a.id, "title": a.title} for a in notes],
    }
    parts = [f"{a.id}: {a.title} (fix: {a.fix})" for a in hits]
    if maybe:
        parts.append("may apply, " + "; ".join(
            f"{a.advisory.id} ({a.advisory.severity.value}; not known: {', '.join(a.unknown)})" for a in maybe))
    if any(a.severity is Severity.FAIL for a in hits):
        status = Status.FAIL
    elif blocking:
        status = Status.INCONCLUSIVE
    elif hits or maybe:
        status = Status.WARN
    else:
        status = Status.PASS
        parts.append("no known advisory applies")
        parts.extend(a.title for a in notes)
    return Summary(status, f"{subject}: " + "; ".join(parts), evidence)


def _brief(a: Advisory) -> dict[str, Any]:
    return {"id": a.id, "severity": a.severity.value, "title": a.title, "fix": a.fix, "fixed": a.fixed,
            "references": list(a.references)}


def find_advisory(advisories: Sequence[Advisory], advisory_id: str) -> Advisory:
    for advisory in advisories:
        if advisory.id == advisory_id.strip().upper():
            return advisory
    raise CheckDataError(f"no advisory {advisory_id!r}; `kvpreflight advisories list` shows the ids")
