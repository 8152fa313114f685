"""`kvpreflight review`: a pre-merge estimate of every engine's KV pool from deployment files.

read files (sources/, one module per input kind) -> find launch commands (commandline) ->
estimate each engine's pool the way it sizes it (engines/, one module per engine) -> judge with
the shared thresholds (check), and match each launch's image tag and flags against the advisory
data (advisories) -> a Report the shared formats render. Nothing here imports an
engine, torch, or kvpreflight's builtin engine: it is arithmetic on the files.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from kvpreflight._internal.checkdata import Thresholds, load_thresholds
from kvpreflight._internal.checks.advisory_data import load_advisories
from kvpreflight._internal.clock import utc_now
from kvpreflight._internal.review.advisories import review_advisories
from kvpreflight._internal.review.check import judge, judge_context_limit, skipped, unreadable
from kvpreflight._internal.review.commandline import find_launches
from kvpreflight._internal.review.engines import estimator, estimators
from kvpreflight._internal.review.estimate import Estimate, ReviewInputs
from kvpreflight._internal.review.interface import Launch, ReviewError
from kvpreflight._internal.review.sources import read_sites
from kvpreflight.model import CheckResult, Report

ENGINE_WORDS = ("python -m sglang.launch_server, sglang serve, vllm serve, python -m vllm.entrypoints.openai.api_server, llama-server, "
                "trtllm-serve")


def find_all_launches(files: Sequence[Path]) -> list[list[Launch]]:
    """The engine launches of each file, in order (a launch word that starts a router of the
    engine's own, e.g. `trtllm-serve disaggregated`, is not one: its module's `serves_model` says so)."""
    return [[l for site in read_sites(path) for l in find_launches(site) if serves_model(l)] for path in files]


def serves_model(launch: Launch) -> bool:
    module = estimators().get(launch.engine)
    check = getattr(importlib.import_module(module), "serves_model", None) if module else None
    return check is None or bool(check(launch))


def estimate_files(files: Sequence[Path], inputs: ReviewInputs,
                   launches: Sequence[Sequence[Launch]] | None = None) -> list[Estimate | CheckResult | tuple[str, str]]:
    """One Estimate per launch found (an inconclusive CheckResult for one that cannot be estimated,
    when several files are reviewed); for a file without any launch, (file, reason)."""
    out: list[Estimate | CheckResult | tuple[str, str]] = []
    models: dict = {}
    for path, found in zip(files, launches if launches is not None else find_all_launches(files), strict=True):
        if not found:
            out.append((str(path), f"no engine launch command found (looked for {ENGINE_WORDS})"))
            continue
        for launch in found:
            try:
                out.append(estimator(launch.engine).estimate(launch, inputs, models))
            except ReviewError as exc:
                if len(files) == 1:
                    raise  # one file: its problem is the answer (exit 2)
                # several files: this one is inconclusive, the others are still reviewed
                out.append(unreadable(str(launch.site.file), launch.line, str(exc)))
    return out


def review(files: Sequence[Path], inputs: ReviewInputs, thresholds: Thresholds | None = None, version: str = "",
           advisory_dirs: Sequence[Path] = ()) -> Report:
    """advisory_dirs: folders of the user's own advisory files, read after kvpreflight's."""
    started = utc_now()
    if not files:
        raise ReviewError("no files to review; pass the deployment files (manifests, compose files, scripts, boot specs)")
    thresholds = thresholds or load_thresholds()
    advisories = load_advisories(advisory_dirs)
    launches = find_all_launches(files)
    results = estimate_files(files, inputs, launches)
    if all(isinstance(r, tuple) for r in results):
        raise ReviewError(f"no engine launch command in {', '.join(map(str, files))}; looked for {ENGINE_WORDS}")
    checks: list[CheckResult] = []
    for r in results:
        if isinstance(r, tuple):
            checks.append(skipped(*r))
        elif isinstance(r, CheckResult):
            checks.append(r)
        else:
            checks.append(judge(r, thresholds))
            if (limit := judge_context_limit(r)) is not None:
                checks.append(limit)
    checks.extend(review_advisories([l for found in launches for l in found], advisories))
    return Report(
        tool_version=version,
        engines=(),
        checks=tuple(checks),
        context_length_promised=inputs.context_length,
        entry=None,
        started_at=started,
        finished_at=utc_now(),
    )


