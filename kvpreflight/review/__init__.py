"""`kvpreflight review`: a pre-merge estimate of every engine's KV pool from deployment files.

read files (sources/, one module per input kind) -> find launch commands (commandline) ->
estimate each engine's pool the way it sizes it (engines/, one module per engine) -> judge with
the shared thresholds (check) -> a Report the shared formats render. Nothing here imports an
engine, torch, or kvpreflight's builtin engine: it is arithmetic on the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kvpreflight.checkdata import CheckDataError, Thresholds, load_thresholds
from kvpreflight.clock import utc_now
from kvpreflight.model import CheckResult, Report
from kvpreflight.review.check import judge, skipped
from kvpreflight.review.commandline import find_launches
from kvpreflight.review.engines import estimator
from kvpreflight.review.estimate import Estimate, ReviewInputs
from kvpreflight.review.interface import ReviewError
from kvpreflight.review.sources import read_sites

ENGINE_WORDS = "python -m sglang.launch_server, sglang serve, vllm serve, python -m vllm.entrypoints.openai.api_server, llama-server"


def estimate_files(files: Sequence[Path], inputs: ReviewInputs) -> list[Estimate | tuple[str, str]]:
    """One Estimate per launch found; for a file without any launch, (file, reason)."""
    out: list[Estimate | tuple[str, str]] = []
    models: dict = {}
    for path in files:
        launches = [l for site in read_sites(path) for l in find_launches(site)]
        if not launches:
            out.append((str(path), f"no engine launch command found (looked for {ENGINE_WORDS})"))
            continue
        for launch in launches:
            out.append(estimator(launch.engine).estimate(launch, inputs, models))
    return out


def review(files: Sequence[Path], inputs: ReviewInputs, thresholds: Thresholds | None = None, version: str = "") -> Report:
    started = utc_now()
    if not files:
        raise ReviewError("no files to review; pass the deployment files (manifests, compose files, scripts, boot specs)")
    try:
        thresholds = thresholds or load_thresholds()
    except CheckDataError as exc:
        raise ReviewError(str(exc)) from None
    results = estimate_files(files, inputs)
    if all(isinstance(r, tuple) for r in results):
        raise ReviewError(f"no engine launch command in {', '.join(map(str, files))}; looked for {ENGINE_WORDS}")
    checks: list[CheckResult] = [
        skipped(*r) if isinstance(r, tuple) else judge(r, thresholds) for r in results
    ]
    return Report(
        tool_version=version,
        engines=(),
        checks=tuple(checks),
        context_length_promised=inputs.context_length,
        entry=None,
        started_at=started,
        finished_at=utc_now(),
    )


