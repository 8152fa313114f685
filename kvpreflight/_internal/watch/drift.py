"""Drift: what each engine says now against what a signed record verified. The record is read
through `kvpreflight.record`'s verification (signature, statement and predicate types, a passing
verdict), so a record nobody signed, or one that did not pass, is never a baseline."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from kvpreflight._internal.watch.findings import Finding, FindingKind
from kvpreflight.model import EngineSnapshot

# watch compares against the release that was verified, however long ago: the record's age is
# not the question here (verify --max-age is the release gate's).
BASELINE_MAX_AGE = timedelta(days=365 * 100)


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """The engines a signed, passing record verified, by URL."""

    source: str  # the record file
    keyid: str
    time: str
    engines: Mapping[str, EngineSnapshot]


def load_baseline(record: Path, key: Path) -> Baseline:
    """The record's engines, once its signature by `key` and its passing verdict are verified.
    Raises RecordError: exit 2 for a file that cannot be read, 1 for a record verify refuses."""
    from kvpreflight.record import Policy, RecordError, load_public_key, read_record
    from kvpreflight.record.predicate import ReleasePredicate
    from kvpreflight.record.verify import verify_envelope

    public = load_public_key(key)
    verified = verify_envelope(read_record(record), public,
                               Policy(any_subject=True, max_age=BASELINE_MAX_AGE, required=()))
    if not isinstance(verified.predicate, ReleasePredicate):
        raise RecordError(f"--record {record} is a fleet record; give watch the release record of one deployment")
    return Baseline(source=str(record), keyid=verified.keyid, time=verified.time.isoformat(),
                    engines={e.url.rstrip("/"): e for e in verified.predicate.report.engines})


def settings_digest(snapshot: EngineSnapshot) -> str:
    """SHA-256 of the engine's stated settings (canonical JSON), the first 16 hex digits."""
    text = json.dumps(dict(snapshot.settings), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def drift_findings(baseline: Baseline, snapshots: Sequence[EngineSnapshot], *, unreadable: Sequence[str] = ()
                   ) -> list[Finding]:
    """Every way the engines read now differ from the record: a smaller pool, a larger served
    context, another version, settings digest, role or model; an engine the record does not
    name (and its pool, when smaller than any the record verified for its role); an engine it
    names that is gone (not among those read, nor among the `unreadable`,
    which are findings of their own)."""
    out: list[Finding] = []
    now = {s.url.rstrip("/"): s for s in snapshots}
    for url, current in now.items():
        recorded = baseline.engines.get(url)
        if recorded is None:
            out.append(_drift("unrecorded-engine", url, f"{url} ({current.role.value}, {current.engine}) is not an engine "
                              f"the record {baseline.source} verified", None, current.role.value))
            out.extend(_unrecorded_pool(baseline, url, current))
            continue
        out.extend(_engine_drift(url, recorded, current))
    gone = [url for url in baseline.engines if url not in now and url not in unreadable]
    out.extend(_drift("engine-gone", url, f"{url}, verified by the record, is no longer among the engines read",
                      baseline.engines[url].role.value, None) for url in gone)
    return out


def _unrecorded_pool(baseline: Baseline, url: str, current: EngineSnapshot) -> list[Finding]:
    """An engine the record does not name (a worker added behind the router) whose KV pool is
    smaller than every pool the record verified for its role: the served context was proved
    against pools this one does not have."""
    pools = [p for e in baseline.engines.values() if e.role is current.role and (p := e.pool_tokens()) is not None]
    pool = current.pool_tokens()
    if not pools or (pool is not None and pool >= min(pools)):
        return []
    return [_drift("smaller-pool", url, f"{url}: KV pool {_n(pool)} tokens, not recorded, smaller than the "
                   f"{min(pools):,} the record verified for every {current.role.value} engine", min(pools), pool)]


def _engine_drift(url: str, recorded: EngineSnapshot, current: EngineSnapshot) -> list[Finding]:
    out = []
    was, pool = recorded.pool_tokens(), current.pool_tokens()
    if was is not None and (pool is None or pool < was):
        out.append(_drift("smaller-pool", url, f"{url}: KV pool {_n(pool)} tokens, the record verified {_n(was)}", was, pool))
    was_ctx, ctx = recorded.served_context, current.served_context
    if ctx is not None and (was_ctx is None or ctx > was_ctx):
        out.append(_drift("larger-context", url, f"{url}: serves a context of {_n(ctx)} tokens, the record verified "
                          f"{_n(was_ctx)}", was_ctx, ctx))
    for what, before, after in (("version", recorded.version, current.version), ("role", recorded.role.value, current.role.value),
                                ("model", recorded.model, current.model), ("engine", recorded.engine, current.engine)):
        if before != after:
            out.append(_drift(what, url, f"{url}: {what} {after or 'unknown'}, the record verified {before or 'unknown'}",
                              before, after))
    before_digest, after_digest = settings_digest(recorded), settings_digest(current)
    if before_digest != after_digest:
        changed = sorted(k for k in {*recorded.settings, *current.settings}
                         if recorded.settings.get(k) != current.settings.get(k))
        out.append(_drift("settings", url, f"{url}: settings digest {after_digest}, the record verified {before_digest} "
                          f"(changed: {', '.join(changed[:8])})", before_digest, after_digest))
    return out


def _drift(what: str, url: str, message: str, recorded: object, found: object) -> Finding:
    return Finding(kind=FindingKind.DRIFT, what=what, endpoint=url, message=message, recorded=recorded, found=found)


def _n(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"
