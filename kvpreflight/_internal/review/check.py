"""The verdict on one estimate, from the thresholds the runtime `check` uses too."""

from __future__ import annotations

from kvpreflight._internal.checkdata import Thresholds
from kvpreflight._internal.review.estimate import Estimate
from kvpreflight.model import CheckResult, Status

CHECK_ID = "kv-capacity-estimate"
CAVEAT = "Static estimate from the files; `kvpreflight check` on the running engine is the proof."


def _status(ratio: float, thresholds: Thresholds) -> Status:
    if ratio < thresholds.fail_below_ratio:
        return Status.FAIL
    if ratio < thresholds.warn_below_ratio:
        return Status.WARN
    return Status.PASS


def judge(est: Estimate, thresholds: Thresholds) -> CheckResult:
    ratio = est.ratio
    fits = int(est.pool_tokens / thresholds.warn_below_ratio)
    status = _status(ratio, thresholds)
    high = est.pool_tokens_high
    high_ratio = high / est.context_checked if high is not None else None
    if status is Status.FAIL and high_ratio is not None and _status(high_ratio, thresholds) is Status.PASS:
        # The low end is judged; when the band's two ends part between fail and pass, the
        # verdict turns on what only the GPU measures: say so, and never pass.
        status = Status.WARN
        verdict = (
            f"the verdict depends on memory {est.engine} measures at start-up: the pool is "
            f"{est.pool_tokens:,}-{high:,} tokens ({ratio:.2f}x-{high_ratio:.2f}x). Serve at most {fits:,} tokens "
            f"to be sure, or run `kvpreflight check` on the started engine"
        )
    elif status is Status.FAIL:
        verdict = (
            f"cannot hold one {est.context_checked:,}-token request ({est.consequence}). "
            f"Serve at most {fits:,} tokens or give the pool more memory"
        )
    elif status is Status.WARN:
        verdict = f"holds one {est.context_checked:,}-token request with less than {thresholds.warn_below_ratio:g}x headroom"
    else:
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
    pool = f"{est.pool_tokens:,}" if high is None else f"{est.pool_tokens:,} (band up to {high:,})"
    message = (
        f"{est.engine} {est.role} ({est.where}): estimated KV pool {pool} {unit} "
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
        "estimated_pool_tokens_high": high,
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


CONTEXT_LIMIT_ID = "model-context-limit"


def judge_context_limit(est: Estimate) -> CheckResult | None:
    """fail when the engine refuses the served context for this model; warn when the override
    lets it start past the model's length; nothing when the context is within it."""
    lim = est.context_limit
    if lim is None or not lim.exceeded:
        return None
    over = (
        f"{lim.engine} {est.role} ({est.where}): {lim.flag} {lim.requested:,} is over the {lim.limit:,} tokens "
        f"{lim.engine} derives for {est.model} ({lim.derivation})"
    )
    if lim.override_set:
        status = Status.WARN
        message = (f"{over}; {lim.override} is set, so it starts, but positions past {lim.limit:,} are outside what the "
                   f"model was trained for and outputs may degrade")
    else:
        status = Status.FAIL
        message = (f"{over}; it refuses to start. Lower {lim.flag} to {lim.limit:,}, or set {lim.override}=1 to "
                   "start anyway (the model may degrade past its length)")
    evidence = {
        "file": est.file, "line": lim.line, "where": est.where, "engine": lim.engine, "role": est.role,
        "model": est.model, "requested_context": lim.requested, "model_context_limit": lim.limit,
        "derivation": lim.derivation, "override": lim.override, "override_set": lim.override_set, "estimate": True,
    }
    return CheckResult(id=CONTEXT_LIMIT_ID, status=status, message=message, endpoint=f"{est.file}:{lim.line}",
                       evidence=evidence)
