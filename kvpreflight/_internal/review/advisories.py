"""The advisories that apply to each launch in the deployment files: the engine version from the
container image tag (``lmsysorg/sglang:v0.5.20``, ``vllm/vllm-openai:v0.8.5``,
``ghcr.io/ggml-org/llama.cpp:server-b10241``) and the settings from the launch flags, read the
argparse way (``--disaggregation-transfer-backend nixl`` is setting
``disaggregation_transfer_backend``, the key the engine reports at run time). Which settings
matter, and their defaults, are in the advisory data.
"""

from __future__ import annotations

import importlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpreflight._internal.checks.advisory_data import Advisory, EngineFacts, Match, summarise
from kvpreflight._internal.engine_kinds import ENGINES
from kvpreflight._internal.review.interface import Launch
from kvpreflight.model import CheckResult, Status

CHECK_ID = "engine-advisories"
# How a launch says it is one side of a prefill/decode pair (each engine's own flag).
PD_SETTINGS = {"disaggregation_mode": ("prefill", "decode"), "role": ("prefill", "decode"),
               "server_role": ("context", "generation")}
PD_CONNECTOR_ROLES = ("kv_producer", "kv_consumer", "kv_both")
_BOOLEAN_WORDS = frozenset({"true", "false", "none"})


@dataclass(frozen=True)
class LaunchSettings:
    values: Mapping[str, str]
    lines: Mapping[str, int]


def image_version(engine: str, image: str | None) -> str | None:
    """The version an engine image's tag names, or None (no tag, `latest`, a private image)."""
    if not image:
        return None
    name, _, tag = posixpath.basename(image.split("@", 1)[0]).partition(":")
    registration = ENGINES.get(engine)  # its image_names say which images hold it
    if not tag or registration is None or not any(word in name.lower() for word in registration.image_names):
        return None
    if engine == "llamacpp":
        m = re.search(r"(?:^|[-_])b(\d+)(?:$|[-_])", tag)
    else:
        m = re.search(r"^v?(\d+\.\d+(?:\.\d+)*)", tag)
    return m.group(1) if m else None


def launch_settings(launch: Launch, switches: frozenset[str]) -> LaunchSettings:
    """Every ``--flag`` of the launch as setting name -> value (last one wins). A flag in
    `switches` takes no value (``true``, or ``false`` for ``--no-flag``)."""
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    args = launch.args
    for i, tok in enumerate(args):
        if not tok.text.startswith("--") or tok.text == "--":
            continue
        flag, eq, inline = tok.text[2:].partition("=")
        key = flag.replace("-", "_")
        negated = key.startswith("no_") and key[3:] in switches
        if negated:
            key = key[3:]
        if key in switches:
            value = inline if eq else ("false" if negated else "true")
        elif eq:
            value = inline
        elif i + 1 < len(args) and not args[i + 1].text.startswith("--"):
            value = args[i + 1].text
        else:
            value = "true"
        values[key], lines[key] = value, tok.line
    return LaunchSettings(values, lines)


def with_config_file(launch: Launch, settings: LaunchSettings) -> LaunchSettings:
    """The launch's settings, with those of the options file it names where its engine's review
    module reads one (`config_settings`; TensorRT-LLM's --config YAML), which override the flags.
    Their line is the line of the flag that names the file."""
    registration = ENGINES.get(launch.engine)
    if registration is None or registration.review is None:
        return settings
    read = getattr(importlib.import_module(registration.review), "config_settings", None)
    extra, line = read(launch) if read is not None else ({}, launch.line)
    if not extra:
        return settings
    return LaunchSettings({**settings.values, **extra}, {**settings.lines, **{k: line for k in extra}})


def is_pd(launch: Launch, settings: LaunchSettings) -> bool:
    if (launch.site.role or "") in ("prefill", "decode"):
        return True
    if any(settings.values.get(k, "").lower() in roles for k, roles in PD_SETTINGS.items()):
        return True
    connector = settings.values.get("kv_transfer_config", "").lower()
    return any(role in connector for role in PD_CONNECTOR_ROLES)


def review_advisories(launches: Sequence[Launch], advisories: Sequence[Advisory]) -> list[CheckResult]:
    """One result per launch that an advisory applies to, or may apply to; nothing for the rest."""
    seen = [a for a in advisories if a.detect_review]
    switches = frozenset(
        c.name for a in seen for c in a.settings if c.values and set(c.values) <= _BOOLEAN_WORDS)
    parsed = [(launch, with_config_file(launch, launch_settings(launch, switches))) for launch in launches]
    # like `check`: one prefill or decode engine makes the whole deployment a PD deployment
    pd = any(is_pd(launch, settings) for launch, settings in parsed)
    results = []
    for launch, settings in parsed:
        if launch.engine == "builtin":
            version = None
        else:
            version = image_version(launch.engine, launch.site.image)
        facts = EngineFacts(engine=launch.engine, version=version, pd=pd, settings=settings.values,
                            unset_means_default=True)
        # Without an engine image tag only the advisories that hold for every version can be
        # told; "may apply to some version" on every untagged launch would drown the findings.
        assessments = [a for a in (x.assess(facts) for x in seen) if a.unknown != ("version",)]
        fired = [a for a in assessments if a.match is not Match.NO]
        image = launch.site.image
        known = version or (f"(version unknown: image {image})" if image else "(version unknown: no engine image tag)")
        subject = f"{launch.engine} {known} ({launch.site.where})"
        summary = summarise(subject, assessments, static=True)
        if summary.status is Status.PASS:
            continue
        line = _finding_line(launch, settings, [a.advisory for a in fired])
        where = f"{launch.site.file}:{line}"
        evidence = {
            "file": launch.site.file, "line": line, "where": launch.site.where, "engine": launch.engine,
            "version": version, "image": image, "image_line": launch.site.image_line, "pd": pd,
            **summary.evidence, "estimate": True,
        }
        results.append(CheckResult(id=CHECK_ID, status=summary.status, message=summary.message, endpoint=where, evidence=evidence))
    return results


def _finding_line(launch: Launch, settings: LaunchSettings, fired: Sequence[Advisory]) -> int:
    """The line to annotate: the first flag an advisory names, else the image, else the launch."""
    for advisory in fired:
        for cond in advisory.settings:
            if cond.name in settings.lines:
                return settings.lines[cond.name]
    return launch.site.image_line or launch.line
