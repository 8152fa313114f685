"""The verdict on one estimate, from the thresholds the runtime `check` uses too."""

from __future__ import annotations

from kvpreflight.checkdata import Thresholds
from kvpreflight.model import CheckResult, Status
from kvpreflight.review.estimate import Estimate

CHECK_ID = "kv-capacity-estimate"
CAVEAT = "Static estimate from the files; `kvpreflight check` on the running engine is the proof."


def judge(est: Estimate, thresholds: Thresholds) -> CheckResult:
    ratio = est.ratio
    fits = int(est.pool_tokens / thresholds.warn_below_ratio)
    if ratio < thresholds.fail_below_ratio:
        status = Status.FAIL
        verdict = (
            f"cannot hold one {est.context_checked:,}-token request ({est.consequence}). "
            f"Serve at most {fits:,} tokens or give the pool more memory"
        )
    elif ratio < thresholds.warn_below_ratio:
        status = Status.WARN
        verdict = f"holds one {est.context_checked:,}-token request with less than {thresholds.warn_below_ratio:g}x headroom"
    else:
        status = Status.PASS
        verdict = f"holds the {est.context_checked:,}-token context"
    unit = "tokens per slot" if est.engine == "llamacpp" else "tokens"
    basis = [f"{est.kv_bytes_per_token:,} B/token"]
    if est.weights_bytes_per_gpu is not None and est.engine != "builtin":
        basis.append(f"weights {est.weights_bytes_per_gpu / 2**30:.1f} GiB/GPU")
    for key in ("mem_fraction_static", "gpu_memory_utilization"):
        if key in est.numbers:
            basis.append(f"{key} {est.numbers[key]}")
    if est.gpu:
        basis.append(est.gpu)
    message = (
        f"{est.engine} {est.role} ({est.where}): estimated KV pool {est.pool_tokens:,} {unit} "
        f"({', '.join(basis)}) = {ratio:.2f}x of context {est.context_checked:,} ({est.context_source}); "
        f"{verdict}. {CAVEAT}"
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


def unreadable(file: str, line: int | None, reason: str) -> CheckResult:
    """A launch review could not estimate (its model or GPU not found): nothing proved, the other
    files still reviewed."""
    where = f"{file}:{line}" if line else file
    return CheckResult(id=CHECK_ID, status=Status.INCONCLUSIVE, message=reason.removeprefix(f"{where}: "), endpoint=where,
                       evidence={"file": file, **({"line": line} if line else {})})


def skipped(file: str, reason: str) -> CheckResult:
    return CheckResult(id=CHECK_ID, status=Status.SKIP, message=f"{file}: {reason}", endpoint=file, evidence={"file": file})
