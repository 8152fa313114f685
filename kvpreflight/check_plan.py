"""The one typed description of a check run: what to look at, how to authenticate, how to probe,
what is waived, and where the results go. Built by the CLI, the demo and the fleet from their own
inputs; everything in it is already validated, so running it finds no configuration problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpreflight.model import EntryApi, ProcessListeners, Waiver
from kvpreflight.targets import REQUEST_TIMEOUT_S, Auth, Target

__all__ = ["CheckPlan", "OutputPlan", "RecordPlan"]


@dataclass(frozen=True, kw_only=True)
class CheckPlan:
    """One check: engines, entry, auth, probe settings, waivers. Frozen and validated."""

    targets: tuple[Target, ...]
    entry: str | None = None  # the client-facing URL probes go to (router, gateway)
    entry_api: EntryApi = EntryApi.NATIVE  # the routes the entry serves
    entry_model: str | None = None  # the model name requests to the entry carry (a gateway's alias); None: the engines'
    engine: str = "auto"  # an engine kind from kvpreflight._internal.engines.ENGINES, or auto
    model: str | None = None
    context_length: int | None = None  # the context promised to users
    logs: Mapping[str, Path] = field(default_factory=dict)  # engine URL -> its start-up log
    auth: Auth = field(default_factory=lambda: Auth(headers={}))
    capacity_only: bool = False
    timeout_s: float = REQUEST_TIMEOUT_S
    deadline_s: float | None = None
    max_context_equivalents: float | None = None  # refuse (exit 2) a probe plan that submits more prompt tokens than this many contexts
    concurrency: int | None = None
    timing_samples: int | None = None  # per kind, for the prefix-cache timing audit; None: the probe's default
    accepted_tokens_per_second: float | None = None
    allow_disruptive: bool = False
    scenarios: tuple[str, ...] = ()  # only these isolation scenarios (--scenario); empty: all
    waivers: tuple[Waiver, ...] = ()
    advisory_dirs: tuple[Path, ...] = ()
    known_markers: frozenset[str] = frozenset()  # another tenant's markers planted on purpose (demo)
    gpus: tuple[Mapping[str, Any], ...] = ()
    booted: bool = False  # kvpreflight started the engines itself (boot mode, demo)
    listeners: tuple[ProcessListeners, ...] = ()  # boot mode: each booted process's sockets, read from /proc when ready


@dataclass(frozen=True, kw_only=True)
class RecordPlan:
    """Where the signed record goes, who signs it and what it is about; prepared before any probe."""

    path: Path
    signer: Any  # kvpreflight.record.SigningKey, or None for an unsigned record
    subjects: tuple[Any, ...]  # kvpreflight.record.Subject
    command_line: tuple[str, ...]  # as typed (secrets are redacted when the record is built)
    test_result: Path | None = None  # also write an in-toto Test Result here (same key, same subjects)
    configuration: tuple[tuple[str, Path], ...] = ()  # (name, file) the Test Result lists by digest
    public_key: Path | None = None  # the signing key's public half, when it lies beside the key (for the verify hint)


@dataclass(frozen=True, kw_only=True)
class OutputPlan:
    """How the report is rendered and where it goes."""

    format: str = "table"
    path: Path | None = None  # None: stdout
    record: RecordPlan | None = None
    name: str | None = None  # --name: the deployment's name in the report (Prometheus labels, SARIF paths)
    spec: Path | None = None  # the --boot spec, named in the report
    quiet: bool = False  # the table leaves the passing checks out
