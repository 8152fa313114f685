"""Live SGLang 0.5.23 (the incident's engine) on CPU, from the shipped specs, with the echo model:

- the CPU stand-ins (scripts/sglang_cpu) are what makes SGLang import here, and keep it off the AMX
  branch on any host (AMD or an Intel Xeon with AMX);
- examples/specs/sglang-single-cpu.yaml (unified): exact echo answers on /generate and
  /v1/completions, then `kvpreflight check` passes every check it can decide, reading the pool the
  engine logged;
- examples/specs/sglang-pd-mooncake-cpu.yaml (prefill/decode over Mooncake TCP behind
  sglang-router): exact echoes through the router, the KV seen to move (the prefill's
  kv_transfer_total_mb is 512 bytes a prompt token), and `check` passes everything but
  prefix-cache-isolation: sglang-router 0.3.2 drops the per-tenant cache_salt (test_sglang_router.py,
  docs/FINDINGS.md), and the same engines behind smg pass it (below); network-exposure warns, naming
  Mooncake's handshake listener on 0.0.0.0 of each engine, from the logs and from /proc;
- examples/specs/sglang-pd-nixl-cpu.yaml (prefill/decode over NIXL behind smg): exact echoes, and
  `check` passes every check it can decide;
- examples/specs/sglang-pd-incident-cpu.yaml (the incident's configuration: the prefill's pool, 2,560
  tokens, below the 4,096-token context every engine serves): the prefill refuses a prompt between
  the two at once (HTTP 400, its body checked), the client behind sglang-router gets no answer (the
  router waits on the decode's KV timeout), and `check` fails the deployment (exit 1), naming
  kv-capacity and overcapacity-rejected.

Each deployment is booted ONCE by kvpreflight's boot library (as `check --boot` does), everything
about it is measured while it is up, and it is stopped (by PID) before the next one boots: one
engine pair on 2 cores at a time. SGLang that cannot start FAILS these tests (never a skip).
Needs ``scripts/setup_engines.sh`` (the SGLang venv; smg and sglang-router; the vLLM venv builds
the echo model)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import realengines
import requests
from support.fixture_drift import json_drift, lines_drift, metrics_drift
from support.sglang_live import ECHO_PROMPTS, SPECS, Answer, Live, booted, echo_probes, generate
from support.vllm_pair import CheckRun, run_check

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks.interface import CheckContext
from kvpreflight._internal.checks.network_exposure import evaluate
from kvpreflight._internal.engines import HttpClient, sglang
from kvpreflight._internal.review import review
from kvpreflight._internal.review.estimate import ReviewInputs
from kvpreflight.model import ErrorKind, Status

pytestmark = pytest.mark.alone  # a live SGLang engine or pair, one core each

# SGLang's PD timeouts (SGLANG_DISAGGREGATION_*_TIMEOUT, 300 s) bound how long a pair holds a request
# whose other side never comes; the check's own per-request wait stays below them.
CHECK_TIMEOUT_S = "60"


@dataclass
class Run:
    """One deployment's measurements, taken while it was up (it is stopped by the time tests read them)."""

    live: Live
    answers: list[Answer]
    check: CheckRun
    logs: dict[str, str]  # engine name -> its log, read before the stop
    extra: dict[str, Any]


def _bins(*folders: str) -> list[str]:
    return list(dict.fromkeys(folders))


def _check(live: Live, *args: str) -> CheckRun:
    routed = any(e.role == "router" for e in live.deployment.engines)  # a router names its workers; an engine is the endpoint
    run = run_check("--entry" if routed else "--endpoint", live.entry, "--timeout", CHECK_TIMEOUT_S, *live.log_args(), *args)
    name = live.deployment.spec.deployment
    print(f"{name} check: exit {run.exit_code} in {run.wall_s:.0f} s: "
          + "; ".join(f"{k} {s}" for k, (s, _) in run.summary().items()), file=sys.stderr)
    logs_dir = Path(live.deployment.engines[0].log_path).parent
    (logs_dir / "check.json").write_text(json.dumps(run.report, indent=1))
    (logs_dir / "check.stderr").write_text(run.stderr)
    return run


def _stopped(live: Live) -> None:
    """Every process of every engine is gone once the boot library has stopped the deployment."""
    left = [(e.name, pid) for e in live.deployment.engines for pid in e.process_ids()]
    assert not left, f"processes survived the stop: {left}"


# ---------------------------------------------------------------- the stand-ins


def test_the_stand_ins_make_sglang_import_and_keep_it_off_the_amx_branch(sglang_python: str) -> None:
    """Without KVPF_SGLANG_CPU=1 SGLang's CPU scheduler cannot import (no sgl_kernel); with it,
    cpu_has_amx_support() answers False whatever the host (SGLang's AMX branch needs the real
    sgl-kernel CPU build), and torchvision imports. The host's own AMX answer is printed: the
    project's machines differ (AMD without AMX, Xeon with)."""
    code = ("import torch, torchvision; from sglang.srt.utils import cpu_has_amx_support; "
            "import sglang.srt.mem_cache.allocation, sglang.kernels.ops.kvcache.cache_move; "
            "print(torch.cpu._is_amx_tile_supported(), cpu_has_amx_support())")
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    bare = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**env, "KVPF_SGLANG_CPU": "0"})
    shimmed = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=300,
                             env={**env, "KVPF_SGLANG_CPU": "1"})
    assert bare.returncode != 0 and ("sgl_kernel" in bare.stderr or "torchvision::nms" in bare.stderr), bare.stderr[-2000:]
    assert shimmed.returncode == 0, shimmed.stderr[-2000:]
    host_amx, sglang_amx = shimmed.stdout.split()[-2:]
    print(f"host AMX: {host_amx}; SGLang's AMX branch: {sglang_amx}", file=sys.stderr)
    assert sglang_amx == "False"


# ---------------------------------------------------------------- unified


@pytest.fixture(scope="module")
def unified(tmp_path_factory: pytest.TempPathFactory, sglang_python: str, echo_hf_model: Path) -> Run:
    workdir = tmp_path_factory.mktemp("sglang-single")
    with booted("sglang-single-cpu.yaml", workdir, echo_hf_model, _bins(str(Path(sglang_python).parent))) as live:
        answers = echo_probes(live.entry)
        # what the unit tier's recorded fixtures stand for (test_the_recorded_fixtures_...)
        models = requests.get(f"{live.entry}/v1/models", timeout=10).json()
        over = requests.post(f"{live.entry}/v1/completions", timeout=60, json={
            "model": "tiny-llama", "prompt": "ab" * 2100, "max_tokens": 1, "temperature": 0})
        check = _check(live, "--allow-disruptive")
        logs = {e.name: live.log(e.name) for e in live.deployment.engines}
    _stopped(live)
    return Run(live, answers, check, logs, {"models": models, "over_context": (over.status_code, over.json())})


def test_unified_sglang_echoes_exactly(unified: Run) -> None:
    wrong = [a for a, prompt in zip(unified.answers, [p for p in ECHO_PROMPTS for _ in (0, 1)], strict=True)
             if not a.echoed(prompt, 48)]
    assert not wrong, wrong
    assert {str(a.finish_reason) for a in unified.answers} <= {"length", "{'type': 'length', 'length': 48}"}, unified.answers


def _undecided_or_failed(run: CheckRun) -> dict[str, tuple[str, str]]:
    """check id -> (status, message) of every check that failed or could not decide (per engine: the last)."""
    return {c["id"]: (c["status"], c["message"]) for c in run.report["checks"] if c["status"] in ("fail", "inconclusive")}


def test_unified_sglang_passes_every_check_it_can_decide(unified: Run) -> None:
    run = unified.check
    assert not _undecided_or_failed(run), _undecided_or_failed(run)
    assert run.exit_code == 0, (run.exit_code, run.summary())
    engine, = run.report["engines"]
    assert engine["engine"] == "sglang" and engine["role"] == "unified"
    assert engine["kv_pool_tokens"] == 9216 and engine["context_length"] == 4096, engine
    assert run.check("kv-capacity")["status"] == "pass"
    assert run.check("overcapacity-rejected")["status"] == "pass", run.check("overcapacity-rejected")["message"]


# ---------------------------------------------------------------- P/D over Mooncake behind sglang-router


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory, sglang_python: str, echo_hf_model: Path) -> Run:
    workdir = tmp_path_factory.mktemp("sglang-pd-mooncake")
    bins = _bins(str(Path(sglang_python).parent), realengines.sglang_router_bin())
    with booted("sglang-pd-mooncake-cpu.yaml", workdir, echo_hf_model, bins) as live:
        answers = echo_probes(live.entry)
        prefill_metrics = requests.get(f"{live.engine('prefill').url}/metrics", timeout=10).text
        prefill_info = requests.get(f"{live.engine('prefill').url}/get_server_info", timeout=10).json()
        check = _check(live, "--allow-disruptive")
        logs = {e.name: live.log(e.name) for e in live.deployment.engines}
        listeners = live.deployment.listeners()  # as `check --boot` reads them, from /proc
    _stopped(live)
    return Run(live, answers, check, logs, {"prefill_metrics": prefill_metrics, "prefill_info": prefill_info,
                                            "listeners": listeners})


def test_the_mooncake_pair_echoes_exactly_through_sglang_router(mooncake: Run) -> None:
    wrong = [a for a, prompt in zip(mooncake.answers, [p for p in ECHO_PROMPTS for _ in (0, 1)], strict=True)
             if not a.echoed(prompt, 48)]
    assert not wrong, wrong
    # the KV crossed: the prefill's kv_transfer_total_mb, 512 bytes a prompt token with the echo
    # model (1 layer, 2 KV heads of 64, K and V in bf16), for every probe and SGLang's own warm-up
    sent_mb = _metric(mooncake.extra["prefill_metrics"], "sglang:kv_transfer_total_mb_sum")
    tokens = sum(a.prompt_tokens or 0 for a in mooncake.answers)
    assert tokens and sent_mb * 2**20 >= tokens * 512, (sent_mb, tokens)


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def _pd_engines_read(run: CheckRun) -> None:
    engines = {e["role"]: e for e in run.report["engines"]}
    assert set(engines) == {"prefill", "decode"}, run.report["engines"]
    for engine in engines.values():
        assert engine["engine"] == "sglang" and engine["kv_pool_tokens"] == 9216 and engine["context_length"] == 4096, engine
    transfer = run.check("pd-transfer")
    assert transfer["status"] == "pass" and "computed 0 tokens itself" in transfer["message"], transfer["message"]


def test_the_mooncake_pair_passes_the_check_but_for_sglang_routers_shared_prefix_cache(mooncake: Run) -> None:
    run = mooncake.check
    _pd_engines_read(run)
    unsettled = _undecided_or_failed(run)
    assert set(unsettled) == {"prefix-cache-isolation"}, unsettled
    assert "tenant B reused tenant A's cached prefix" in unsettled["prefix-cache-isolation"][1]
    assert run.exit_code == 1, (run.exit_code, run.summary())


def test_mooncakes_handshake_on_every_address_is_named_from_proc_and_from_the_logs(mooncake: Run) -> None:
    """SGLang's bootstrap server binds --host (127.0.0.1 here: not a finding); Mooncake's P2P
    handshake listener logs 127.0.0.1 and binds every address, on both engines."""
    ports = {}
    for name in ("prefill", "decode"):
        m = re.search(r"P2P handshake, listening on 127\.0\.0\.1:(\d+)", mooncake.logs[name])
        assert m, f"{name}: no handshake line"
        ports[name] = int(m[1])
    attached = mooncake.check.check("network-exposure")
    assert attached["status"] == "warn", attached["message"]
    found = mooncake.extra["listeners"]
    (booted,) = evaluate(CheckContext((), load_thresholds(), listeners=found))
    print(f"sglang-pd-mooncake network-exposure from /proc: {booted.status.value}: {booted.message}", file=sys.stderr)
    assert booted.status is Status.WARN and {p.source for p in found} == {"/proc"}
    for name, port in ports.items():
        assert f"0.0.0.0:{port}: Mooncake transfer engine's P2P handshake listener" in attached["message"]
        assert re.search(rf"{name} \(pid \d+ [^)]+\) [^;]*0\.0\.0\.0:{port}: Mooncake transfer engine's P2P handshake",
                         booted.message), booted.message
    bootstrap = [e for e in booted.evidence["listeners"] if e["port"] == 28998]
    assert bootstrap and all(e["address"] == "127.0.0.1" and e["verdict"] == "pass" for e in bootstrap), bootstrap
    assert "28998" not in attached["message"]
    # Each scheduler also holds a socket on [::] that nothing names: torch's TCPStore, which binds
    # every address when it is the master whatever host it is given (docs/FINDINGS.md); said, not hidden.
    unnamed = [e for e in booted.evidence["listeners"] if e["carries"] == "not identified" and e["verdict"] != "pass"]
    for e in unnamed:
        where = f"[{e['address']}]" if ":" in e["address"] else e["address"]
        assert f"{where}:{e['port']}" in booted.message and "not identified" in booted.message, booted.message


# ---------------------------------------------------------------- P/D over NIXL behind smg


@pytest.fixture(scope="module")
def nixl(tmp_path_factory: pytest.TempPathFactory, sglang_python: str, echo_hf_model: Path) -> Run:
    workdir = tmp_path_factory.mktemp("sglang-pd-nixl")
    bins = _bins(str(Path(sglang_python).parent), realengines.smg_bin())
    with booted("sglang-pd-nixl-cpu.yaml", workdir, echo_hf_model, bins) as live:
        answers = echo_probes(live.entry)
        listeners = live.deployment.listeners()  # as `check --boot` reads them
        check = _check(live, "--allow-disruptive")
        logs = {e.name: live.log(e.name) for e in live.deployment.engines}
    _stopped(live)
    return Run(live, answers, check, logs, {"listeners": listeners})


def test_the_nixl_pair_behind_smg_echoes_exactly_and_passes_every_check_it_can_decide(nixl: Run) -> None:
    wrong = [a for a, prompt in zip(nixl.answers, [p for p in ECHO_PROMPTS for _ in (0, 1)], strict=True)
             if not a.echoed(prompt, 48)]
    assert not wrong, wrong
    run = nixl.check
    _pd_engines_read(run)
    assert not _undecided_or_failed(run), _undecided_or_failed(run)
    # UCX_NET_DEVICES=lo in the spec: nothing of the pair listens beyond loopback but torch's store
    # (SGLang's scheduler; [::], no log line names it)
    found = nixl.extra["listeners"]
    assert {p.source for p in found} == {"/proc"}, found
    wide = [(p.process, s.address, s.port) for p in found for s in p.listeners if s.address not in ("127.0.0.1", "::1")]
    print(f"sglang-pd-nixl sockets beyond loopback: {wide}", file=sys.stderr)
    assert len(wide) <= 2 and all(address == "::" for _, address, _ in wide), wide
    assert run.exit_code == 0, (run.exit_code, run.summary())


# ---------------------------------------------------------------- the incident's configuration


# Between the prefill's pool (2,560: max_req_input_len 2,554) and the served context (4,096).
INCIDENT_PROMPT_TOKENS = 3000
# How long the client waits through the router: far below the decode's 300-s KV timeout
# (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, which sglang-router waits out and then retries).
ROUTER_WAIT_S = 40.0
PREFILL_REFUSAL = (f"Input length ({INCIDENT_PROMPT_TOKENS} tokens) exceeds the maximum allowed length (2554 tokens). "
                   "Use a shorter input or enable --allow-auto-truncate.")


def _through_the_router(url: str, prompt: str) -> dict[str, Any]:
    started = time.monotonic()
    try:
        answer = generate(url, prompt, 16, timeout_s=ROUTER_WAIT_S)
    except requests.Timeout:
        return {"answered": False, "elapsed_s": time.monotonic() - started}
    return {"answered": True, "elapsed_s": answer.elapsed_s, "status": answer.status, "body": answer.body}


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory, sglang_python: str, echo_hf_model: Path) -> Run:
    workdir = tmp_path_factory.mktemp("sglang-pd-incident")
    bins = _bins(str(Path(sglang_python).parent), realengines.sglang_router_bin())
    prompt = "".join(f"{i:03d}|" for i in range(INCIDENT_PROMPT_TOKENS // 4))
    with booted("sglang-pd-incident-cpu.yaml", workdir, echo_hf_model, bins) as live:
        # the prefill's own answer, as the router's prefill leg gets it (bootstrap fields and all)
        started = time.monotonic()
        direct = requests.post(f"{live.engine('prefill').url}/generate", timeout=60, json={
            "text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": 28994, "bootstrap_room": 12345})
        direct_s = time.monotonic() - started
        routed = _through_the_router(live.entry, prompt)
        after = generate(live.entry, ECHO_PROMPTS[0], 48)  # a prompt the prefill holds is still served
        print(f"incident: {INCIDENT_PROMPT_TOKENS}-token prompt: the prefill answers HTTP {direct.status_code} in "
              f"{direct_s:.3f} s: {direct.text}; through sglang-router: {routed}; then a short prompt: HTTP {after.status}",
              file=sys.stderr)
        check = _check(live)
        logs = {e.name: live.log(e.name) for e in live.deployment.engines}
    _stopped(live)
    return Run(live, [after], check, logs, {"direct": (direct.status_code, direct.json(), direct_s), "routed": routed})


def test_the_incident_prefill_refuses_at_once_and_the_client_behind_sglang_router_gets_nothing(incident: Run) -> None:
    status, body, seconds = incident.extra["direct"]
    assert (status, body) == (400, {"error": {"message": PREFILL_REFUSAL}}) and seconds < 5, incident.extra["direct"]
    assert "KV pool holds 2560 tokens, fewer than --context-length 4096" in incident.logs["prefill"]
    # sglang-router sent the decode its leg too and waits for it, not passing the prefill's 400 on
    assert not incident.extra["routed"]["answered"], incident.extra["routed"]
    assert incident.answers[0].echoed(ECHO_PROMPTS[0], 48), incident.answers[0]


def test_the_incident_configuration_fails_the_check_naming_the_pool_and_the_hang(incident: Run) -> None:
    run = incident.check
    assert run.exit_code == 1, (run.exit_code, run.summary())
    failed = [(c["id"], c["message"]) for c in run.report["checks"] if c["status"] == "fail"]
    assert ("kv-capacity", "prefill engine: KV pool 2,560 tokens vs context 4,096 (0.62x): one full-context request "
            "does not fit; lower the context or enlarge the pool") in failed, failed
    over = [m for k, m in failed if k == "overcapacity-rejected"]
    assert over and "over-pool" in over[0] and "a hang, not a rejection" in over[0], failed
    engines = {e["role"]: e for e in run.report["engines"]}
    assert engines["prefill"]["kv_pool_tokens"] == 2560 and engines["decode"]["kv_pool_tokens"] == 9216, engines


# ---------------------------------------------------------------- a handoff timeout shorter than the prefill


# The decode gives up on a request's KV after this many seconds (SGLANG_DISAGGREGATION_WAITING_TIMEOUT,
# whole seconds; 0 fails every request at once, smg then opens its circuit and nothing more is
# probed); the prefill computes in chunks this small, so a 4,000-token prompt takes several times
# as long (6.2 s where the default chunk takes 1.0 s on this project's 2-core machines).
SHORT_WAIT_S = "1"
SLOW_CHUNK = "32"


@pytest.fixture(scope="module")
def short_wait(tmp_path_factory: pytest.TempPathFactory, sglang_python: str, echo_hf_model: Path) -> Run:
    workdir = tmp_path_factory.mktemp("sglang-pd-short-wait")
    bins = _bins(str(Path(sglang_python).parent), realengines.smg_bin())
    with booted("sglang-pd-nixl-cpu.yaml", workdir, echo_hf_model, bins,
                extra_env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": SHORT_WAIT_S},
                engine_args={"prefill": ["--chunked-prefill-size", SLOW_CHUNK]}) as live:
        check = _check(live, "--scenario", "normal")
        logs = {e.name: live.log(e.name) for e in live.deployment.engines}
    _stopped(live)
    return Run(live, [], check, logs, {})


def test_a_decode_waiting_timeout_below_the_prefill_time_fails_pd_transfer_naming_the_setting(short_wait: Run) -> None:
    """SGLang's decode gives up on the KV of a near-context prompt after 1 s (and the client gets
    HTTP 500 or an error inside its 200 stream); kvpreflight reads the engine's own line and fails
    pd-transfer, naming the setting to raise."""
    run = short_wait.check
    assert run.exit_code == 1, (run.exit_code, run.summary())
    transfer = run.check("pd-transfer")
    assert transfer["status"] == "fail", transfer["message"]
    assert "a prefill/decode handoff timed out during the check" in transfer["message"]
    assert "raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT above" in transfer["message"]
    assert "timed out after 1.0s in KVPoll.WaitingForInput" in short_wait.logs["decode"]
    # what the unit tier's handoff_timeout.log stands for, as this engine logged it
    drift = lines_drift({s.what: s.pattern for s in sglang.SglangAdapter.log_signals
                         if s.setting == "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"},
                        (FIXTURES / "handoff_timeout.log").read_text(), short_wait.logs["decode"])
    assert not drift, drift


# ---------------------------------------------------------------- the unit tier's fixtures and review, against live


FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang"
SPEC_OF = {"unified": "sglang-single-cpu.yaml", "mooncake": "sglang-pd-mooncake-cpu.yaml",
           "nixl": "sglang-pd-nixl-cpu.yaml", "incident": "sglang-pd-incident-cpu.yaml"}


def test_the_recorded_sglang_fixtures_match_what_the_live_engines_send(unified: Run, mooncake: Run, incident: Run) -> None:
    """Every field, series and log line of tests/fixtures/sglang/ that the unit tier reads SGLang by,
    as the live 0.5.23 engines send it (the fixtures were written from SGLang's source before SGLang
    ran here): a drift names the file and the field, series or line."""
    recorded = {name: (FIXTURES / name).read_text() for name in (
        "server_info_prefill.json", "v1_models.json", "error_over_context.json", "error_over_pool.json",
        "metrics_prefill.txt", "prefill.log")}
    status, over_context = unified.extra["over_context"]
    drift = {
        "server_info_prefill.json": json_drift(json.loads(recorded["server_info_prefill.json"]), mooncake.extra["prefill_info"]),
        "v1_models.json": json_drift(json.loads(recorded["v1_models.json"]), unified.extra["models"]),
        "error_over_context.json": json_drift(json.loads(recorded["error_over_context.json"]), over_context),
        "error_over_pool.json": json_drift(json.loads(recorded["error_over_pool.json"]), incident.extra["direct"][1]),
        # SGLang sends a transfer-failure counter only once it first counts (none failed here)
        "metrics_prefill.txt": metrics_drift(recorded["metrics_prefill.txt"], mooncake.extra["prefill_metrics"],
                                             absent_until_counted=["sglang:num_transfer_failed_reqs_total"]),
        "prefill.log": lines_drift({"allocator line": sglang.ALLOCATOR_LINE, "scheduler line": sglang.SCHEDULER_LINE},
                                   recorded["prefill.log"], mooncake.logs["prefill"])
                       + lines_drift({"small-pool warning": sglang.SMALL_POOL_WARNING}, recorded["prefill.log"], incident.logs["prefill"]),
    }
    drifted = {k: v for k, v in drift.items() if v}
    print(json.dumps(drifted, indent=1), file=sys.stderr)  # whole: an assertion message is cut
    assert not drifted, drifted
    # the messages the adapter classifies a refusal by, as the live engine words them
    adapter = sglang.SglangAdapter("http://127.0.0.1:1", HttpClient())  # classifies only: sends nothing
    assert status == 400 and adapter.classify_error(over_context["message"]) is ErrorKind.LENGTH, over_context
    assert adapter.classify_error(incident.extra["direct"][1]["error"]["message"]) is ErrorKind.LENGTH


@pytest.mark.parametrize("name", list(SPEC_OF))
def test_review_of_the_live_spec_states_the_pool_each_engine_logged(name: str, request: pytest.FixtureRequest,
                                                                   echo_hf_model: Path) -> None:
    """`kvpreflight review` of the shipped spec (no GPU asked for: --device cpu) estimates the pool
    each live engine logged ("KV Cache is allocated ... #tokens: N"), and fails where check fails."""
    run: Run = request.getfixturevalue(name)
    report = review([SPECS / SPEC_OF[name]], ReviewInputs(model_dir=echo_hf_model))
    estimated = {c.evidence["role"]: c.evidence["estimated_pool_tokens"] for c in report.checks if c.id == "kv-capacity-estimate"}
    logged = {}
    for engine in run.live.deployment.engines:
        if engine.role != "router":
            m = sglang.ALLOCATOR_LINE.search(run.logs[engine.name])
            assert m, f"{engine.name}: no allocator line in its log"
            logged[str(engine.role)] = int(m["tokens"])
    assert estimated == logged, (estimated, logged)
    capacity = {c["status"] for c in run.check.report["checks"] if c["id"] == "kv-capacity"}
    assert (report.exit_code == 1) == ("fail" in capacity), (report.exit_code, capacity)
