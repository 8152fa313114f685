"""kv-capacity: every engine's runtime KV pool (smallest rank counts) against the checked context."""

from __future__ import annotations

from typing import Any

from kvpreflight._internal.check_ids import CheckId, Scope
from kvpreflight._internal.checks.engine_warnings import KV_CAPACITY_HAZARDS, warning_result
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight.model import CheckResult, Origin, Status

ID = CheckId.KV_CAPACITY
SCOPE = Scope.GROUP


def evaluate(ctx: CheckContext) -> list[CheckResult]:
    results = []
    for snap in ctx.snapshots:
        pool = snap.pool_tokens()
        checked = ctx.checked_context(snap)
        evidence: dict[str, Any] = {
            "role": snap.role.value,
            "kv_pool_tokens": pool,
            "served_context": snap.served_context,
            "promised_context": ctx.promised_context,
            "checked_context": checked,
            "sources": {r.label: r.tokens
                        for r in snap.pool_readings if r.origin is not Origin.BEHAVIOUR},
        }
        # The engine's own warning that it cut its longest sequence outweighs any pool figure.
        if (warned := warning_result(ID, (snap,), KV_CAPACITY_HAZARDS, snap.url)) is not None:
            results.append(CheckResult(id=ID, status=Status.FAIL, message=warned.message, endpoint=snap.url,
                                       evidence={**evidence, **warned.evidence}))
            continue
        if pool is None:
            results.append(CheckResult(id=ID, status=Status.INCONCLUSIVE,
                                       message=f"{snap.role.value} engine: KV pool size unknown "
                                       "(no source reported it; pass --log URL=PATH for the start-up log)",
                                       endpoint=snap.url, evidence=evidence))
            continue
        if checked is None:
            results.append(CheckResult(id=ID, status=Status.INCONCLUSIVE,
                                       message=f"{snap.role.value} engine: context length unknown; pass --context-length N",
                                       endpoint=snap.url, evidence=evidence))
            continue
        ratio = pool / checked
        evidence["ratio"] = round(ratio, 4)
        evidence["thresholds"] = {"fail_below": ctx.thresholds.fail_below_ratio, "warn_below": ctx.thresholds.warn_below_ratio}
        what = f"{snap.role.value} engine: KV pool {pool:,} tokens vs context {checked:,} ({ratio:.2f}x)"
        if ratio < ctx.thresholds.fail_below_ratio:
            status, message = Status.FAIL, f"{what}: one full-context request does not fit; lower the context or enlarge the pool"
        elif snap.kv_per_slot:
            # llama.cpp without --kv-unified: each slot owns n_ctx cells that no other request can take.
            status, message = Status.PASS, f"{what}: each slot owns its cells, so one full request always fits"
        elif ratio < ctx.thresholds.warn_below_ratio:
            status, message = Status.WARN, (f"{what}: fits one full-context request with little headroom "
                                            f"(< {ctx.thresholds.warn_below_ratio}x)")
        else:
            status, message = Status.PASS, what
        results.append(CheckResult(id=ID, status=status, message=message, endpoint=snap.url, evidence=evidence))
    return results
