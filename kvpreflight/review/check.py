"""The verdict on one estimate, from the thresholds the runtime `check` uses too."""

from __future__ import annotations

from kvpreflight.checkdata import Thresholds
from kvpreflight.model import CheckResult, Status
from kvpreflight.review.estimate import Estimate

CHECK_ID = "kv-capacity-estimate"
CAVEAT = "static estimate from the config; `kvpreflight check` on the running engine is the proof"


def judge(est: Estimate, thresholds: Thresholds) -> CheckResult:
    ratio = est.ratio
    if ratio < thresholds.fail_below_ratio:
        status = Status.FAIL
        verdict = f"cannot hold one {est.context_checked:,}-token request: {est.consequence}"
    elif ratio < thresholds.warn_below_ratio:
        status = Status.WARN
        verdict = f"holds one {est.context_checked:,}-token request with less than {thresholds.warn_below_ratio:g}x headroom"
    else:
        status = Status.PASS
        verdict = f"holds the {est.context_checked:,}-token context"
    unit = "tokens per slot" if est.engine == "llamacpp" else "tokens"
    message = (
        f"{est.engine} {est.role} ({est.where}): estimated KV pool {est.pool_tokens:,} {unit} = {ratio:.2f}x "
        f"of context {est.context_checked:,} ({est.context_source}); {verdict}. {CAVEAT}"
    )
    evidence = {
        "file": est.file,
        "line": est.line,
        "where": est.where,
        "engine": est.engine,
        "role": est.role,
        "model": est.model,
        "gpu": est.gpu,
        "estimated_pool_tokens": est.pool_tokens,
        "kv_bytes_per_token": est.kv_bytes_per_token,
        "kv_bytes_per_token_formula": est.kv_bytes_formula,
        "weights_bytes_per_gpu": est.weights_bytes_per_gpu,
        "context_checked": est.context_checked,
        "context_source": est.context_source,
        "ratio": round(ratio, 4),
        "fail_below_ratio": thresholds.fail_below_ratio,
        "warn_below_ratio": thresholds.warn_below_ratio,
        **{k: v for k, v in est.numbers.items()},
        "flag_lines": dict(est.flag_lines),
        "assumptions": list(est.assumptions),
        "estimate": True,
    }
    return CheckResult(id=CHECK_ID, status=status, message=message, endpoint=f"{est.file}:{est.line}", evidence=evidence)


def skipped(file: str, reason: str) -> CheckResult:
    return CheckResult(id=CHECK_ID, status=Status.SKIP, message=f"{file}: {reason}", endpoint=file, evidence={"file": file})
