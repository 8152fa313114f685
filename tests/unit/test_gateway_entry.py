"""A gateway in front (the LiteLLM proxy): its length refusal is a hard rejection, and an HTTP 200
answer from another deployment behind it (a context-window fallback) fails overcapacity-rejected.
The bodies are LiteLLM 1.110.2's, recorded from its proxy in front of the builtin engine (the
message shape is litellm/exceptions.py ContextWindowExceededError's)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from support.check_cases import PREFILL, T, check, good_probes, ok, run, snap
from support.cli import invoke

from kvpreflight._internal.checks import CheckContext
from kvpreflight._internal.engines.builtin import BuiltinAdapter
from kvpreflight._internal.engines.http import HttpReply
from kvpreflight._internal.engines.openai_completions import openai_entry
from kvpreflight.model import Completion, CounterDelta, ErrorKind, Status

GATEWAY = "http://gateway:4000"
# No fallback: the upstream's own refusal, wrapped.
LITELLM_CONTEXT_WINDOW = {"error": {
    "message": "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: OpenAIException - "
               "Error code: 400 - The input (3000 tokens) is longer than the model's context length (2048 tokens).\n"
               "model=small. context_window_fallbacks=None. fallbacks=None.\n\nSet 'context_window_fallback' - "
               "https://docs.litellm.ai/docs/routing#fallbacks\n\nLiteLLM: model group 'small' failed with the error above. "
               "No fallback was attempted.", "type": "invalid_request_error", "param": None, "code": "400"}}
# The same class with the upstream's words gone (another upstream, a reworded message).
LITELLM_CONTEXT_WINDOW_BARE = {"error": {"message": "litellm.ContextWindowExceededError: prompt too large for deployment",
                                         "type": None, "param": None, "code": "400"}}
LITELLM_OUT_OF_VOCABULARY = {"error": {
    "message": "litellm.BadRequestError: OpenAIException - Error code: 400 - Token id 260 is out of vocabulary (vocab size 260)."
               "\n\nLiteLLM: model group 'small' failed with the error above. No fallback was attempted.",
    "type": "invalid_request_error", "param": None, "code": "400"}}
# With a fallback: the other deployment's answer, HTTP 200, naming its own model.
LITELLM_FALLBACK_ANSWER = {
    "id": "cmpl-0ea1", "object": "text_completion", "created": 1796191795, "model": "builtin-large",
    "choices": [{"matched_stop": None, "finish_reason": "length", "index": 0, "text": "\u0005", "logprobs": None}],
    "usage": {"completion_tokens": 1, "prompt_tokens": 3000, "total_tokens": 3001, "completion_tokens_details": None,
              "prompt_tokens_details": {"audio_tokens": None, "cached_tokens": 0}}, "system_fingerprint": None}


class OneReply:
    """A connection that answers every POST with one recorded reply."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, json.dumps(body).encode()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def post(self, url: str, body: dict[str, Any], *, timeout_s: float, headers: Any = None) -> HttpReply:
        self.sent.append((url, body))
        return HttpReply(url, self.status, self.body, 0.01, "application/json")


def through_gateway(status: int, body: dict[str, Any]) -> tuple[Completion, OneReply]:
    client = OneReply(status, body)
    entry = openai_entry(BuiltinAdapter)(GATEWAY, client, model="small")  # type: ignore[arg-type]
    return entry.complete(list(range(5, 3005)), max_tokens=1, stream=False, timeout_s=5), client


@pytest.mark.parametrize("body", [LITELLM_CONTEXT_WINDOW, LITELLM_CONTEXT_WINDOW_BARE])
def test_litellm_context_window_error_is_a_length_refusal(body):
    c, client = through_gateway(400, body)
    assert c.status == 400 and c.error_kind is ErrorKind.LENGTH, c
    (url, sent), = client.sent
    assert url == f"{GATEWAY}/v1/completions" and sent["model"] == "small" and sent["prompt"][:2] == [5, 6]
    assert "rid" not in sent  # a gateway may refuse a body field it does not know


def test_litellm_bad_request_for_vocabulary_is_not_a_length_refusal():
    c, _ = through_gateway(400, LITELLM_OUT_OF_VOCABULARY)
    assert c.error_kind is ErrorKind.VOCAB


def test_the_fallback_answer_names_its_model():
    c, _ = through_gateway(200, LITELLM_FALLBACK_ANSWER)
    assert c.served and c.answer_model == "builtin-large" and c.prompt_tokens == 3000


def test_litellm_refusal_passes_overcapacity_rejected():
    c, _ = through_gateway(400, LITELLM_CONTEXT_WINDOW)
    probes = run(*good_probes(**{"over-context": c, "over-context-stream": None}))
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=probes, entry=GATEWAY))
    assert r.status is Status.PASS, r.message


FALLBACK = ok(10001, answer_model="builtin-large")


@pytest.mark.parametrize("answer,deltas,said", [
    (FALLBACK, {}, "names model 'builtin-large'"),  # the answer's model field
    (ok(10001), {PREFILL: CounterDelta(requests=1.0, prompt_tokens=0.0)}, "no checked engine's prompt-token counter moved"),
    (FALLBACK, {PREFILL: CounterDelta(prompt_tokens=0.0)}, "names model 'builtin-large'"),
])
def test_an_over_capacity_request_answered_by_another_deployment_fails(answer, deltas, said):
    probes = run(*[(n, c, deltas) if n == "over-context" else (n, c) for n, c in good_probes(**{"over-context": answer})])
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=probes, entry=GATEWAY))
    assert r.status is Status.FAIL, r.message
    assert "answered by another model or deployment" in r.message and said in r.message


def test_a_shortened_prompt_is_truncation_not_another_deployment():
    deltas = {PREFILL: CounterDelta(prompt_tokens=1.0)}
    placeholder = Completion(sent_tokens=10001, max_tokens=16, streamed=False, status=200, elapsed_s=0.1, completion_tokens=16)
    probes = run(*[(n, c, deltas) if n == "over-context" else (n, c) for n, c in good_probes(**{"over-context": placeholder})])
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=probes, entry=GATEWAY))
    assert r.status is Status.FAIL and "another model" not in r.message and "1 token(s)" in r.message


def test_a_twin_answered_by_another_deployment_proves_no_acceptance():
    probes = run(*good_probes(**{"boundary-accept": ok(9992, answer_model="builtin-large")}))
    (r,) = check("overcapacity-rejected", CheckContext((snap(),), T, probes=probes, entry=GATEWAY))
    assert r.status is Status.INCONCLUSIVE and "twin" in r.message and "another model or deployment" in r.message
    assert r.evidence["twin_accepted"] is False


ELSEWHERE = "answered by another model or deployment"


@pytest.mark.parametrize("check_id,probes", [
    ("prompt-integrity", [("boundary-accept", ok(9992, answer_model="builtin-large"))]),
    ("concurrent-capacity", [("concurrent-1", ok(9992, answer_model="builtin-large")), ("concurrent-2", ok(9992))]),
    ("max-tokens-clamp", [("clamp", ok(9985, generated=8, max_tokens=8, answer_model="builtin-large"))]),
])
def test_no_check_passes_on_an_answer_the_checked_engine_never_produced(check_id, probes):
    (r,) = check(check_id, CheckContext((snap(),), T, probes=run(*probes), entry=GATEWAY))
    assert r.status is Status.INCONCLUSIVE and ELSEWHERE in r.message, r.message
    honest = [(n, replace(c, answer_model="m")) for n, c in probes]  # the engine's own model name: as before
    (r,) = check(check_id, CheckContext((snap(),), T, probes=run(*honest), entry=GATEWAY))
    assert r.status is Status.PASS and ELSEWHERE not in r.message, r.message


def test_a_clamp_answered_elsewhere_past_the_context_still_fails_and_says_who():
    clamp = ok(9985, generated=23, max_tokens=23, answer_model="builtin-large")
    (r,) = check("max-tokens-clamp", CheckContext((snap(),), T, probes=run(("clamp", clamp)), entry=GATEWAY))
    assert r.status is Status.FAIL and "past the served context" in r.message and ELSEWHERE in r.message


@pytest.mark.parametrize("args,said", [
    (("--entry-api", "grpc", "--entry", GATEWAY, "--endpoint", PREFILL), "--entry-api 'grpc': choose one of native, openai"),
    (("--entry-api", "openai", "--endpoint", PREFILL), "add --entry URL"),
])
def test_entry_api_mistakes_are_usage_errors(args, said):
    r = invoke("check", *args)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr


def test_a_counter_deficit_still_fails_prompt_integrity_when_another_model_answered():
    deltas = {PREFILL: CounterDelta(prompt_tokens=0.0, prefilled_tokens=0.0, cached_prompt_tokens=0.0, requests=1.0)}
    probes = run(("boundary-accept", ok(9992, answer_model="builtin-large"), deltas))
    (r,) = check("prompt-integrity", CheckContext((snap(),), T, probes=probes, entry=GATEWAY))
    assert r.status is Status.FAIL and "shortened silently" in r.message and ELSEWHERE in r.message, r.message


# --entry-model: a gateway knows the engines' model by another name (a LiteLLM model group, an alias).
def test_entry_model_is_the_name_the_requests_carry_to_the_gateway():
    from kvpreflight._internal.engines.http import HttpClient
    from kvpreflight._internal.session import entry_adapter
    from kvpreflight.check_options import CheckOptions, build_plan

    plan = build_plan(CheckOptions(endpoints=(PREFILL,), entry=GATEWAY, entry_api="openai", entry_model="chat-prod"))
    client = HttpClient()
    try:
        entry = entry_adapter(plan, GATEWAY, [snap()], client)
        plain = entry_adapter(replace(plan, entry_model=None), GATEWAY, [snap()], client)
    finally:
        client.close()
    assert entry is not None and entry.model == "chat-prod"
    assert plain is not None and plain.model == snap().model  # without it: the model the engines serve


@pytest.mark.parametrize("check_id,probes", [
    ("prompt-integrity", [("boundary-accept", ok(9992, answer_model="chat-prod"))]),
    ("concurrent-capacity", [("concurrent-1", ok(9992, answer_model="chat-prod")), ("concurrent-2", ok(9992))]),
])
def test_an_answer_naming_the_entry_model_came_from_the_checked_engines(check_id, probes):
    """A gateway that reports the alias it was asked for has not answered from elsewhere; another
    name still has (the fallback case stands with an alias in use)."""
    (r,) = check(check_id, CheckContext((snap(),), T, probes=run(*probes), entry=GATEWAY, entry_model="chat-prod"))
    assert r.status is Status.PASS and ELSEWHERE not in r.message, r.message
    (r,) = check(check_id, CheckContext((snap(),), T, probes=run(*probes), entry=GATEWAY, entry_model="chat-canary"))
    assert r.status is Status.INCONCLUSIVE and "names model 'chat-prod'" in r.message, r.message


def test_entry_model_without_an_entry_is_a_usage_error():
    r = invoke("check", "--endpoint", PREFILL, "--entry-model", "chat-prod")
    assert r.returncode == 2 and r.stderr.strip() == (
        "kvpreflight: error: --entry-model names the model at the --entry URL; add --entry URL"), r.stderr
