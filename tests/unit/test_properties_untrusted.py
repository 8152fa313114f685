"""Property-based: whatever an engine answers, a start-up log holds, a pull request's manifest or
model config says, or a record file contains, kvpreflight parses it or says in one line why not (its
own error class: EngineError, ReviewError, RecordError), in bounded time; never a traceback, and
never a value of the wrong type passed on to the checks and reports (issue 12).

Inputs are honest bodies (captured from or copied out of the real engines, tests/fixtures) with one
value anywhere replaced by anything, values shaped like the real ones, and plain noise. Profile
`ci` (tests/conftest.py) keeps the whole file under a minute on 2 cores.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, event, example, given
from hypothesis import strategies as st
from record_support import sample_report
from support.engine_routes import FIXTURES, KINDS, info_routes
from support.properties import mutations, yaml_values

from kvpreflight._internal.checkdata import load_thresholds
from kvpreflight._internal.engines import adapter_class
from kvpreflight._internal.engines.http import BodyLimit, HttpClient, HttpReply, StreamReply
from kvpreflight._internal.engines.interface import EngineAdapter, EngineRequest
from kvpreflight._internal.engines.untrusted import parse_metrics
from kvpreflight.errors import KvpreflightError
from kvpreflight.model import Completion, EngineSnapshot
from kvpreflight.record.predicate import FLEET_PREDICATE_TYPE

# Any one input, parsed or refused, in CPU seconds of this process (not wall time, which other
# processes on a shared CI runner stretch): an honest body takes milliseconds, a hang forever.
BOUND_S = 5.0
URL = "http://engine:8000"
MODELS = FIXTURES / "review" / "models"
SCRATCH = Path(tempfile.mkdtemp(prefix="kvpreflight-properties-"))


def bounded(call: Any, *args: Any, **kwargs: Any) -> Any:
    """call(*args), or None when it raised one of kvpreflight's own errors; within BOUND_S either way."""
    start = time.process_time()
    name = getattr(call, "__name__", "call")
    try:
        result = call(*args, **kwargs)
    except KvpreflightError as exc:
        assert len(str(exc)) < 2000, str(exc)[:300]  # a line, not the input (the CLI prints it on one line)
        event(f"{name}: {type(exc).__name__}")  # --hypothesis-show-statistics: how deep the inputs got
        return None
    finally:
        assert time.process_time() - start < BOUND_S
    event(f"{name}: read")
    return result


# Values shaped like what engines send, so mutations reach past the first type check.
ENGINE_KEYS = ["data", "id", "object", "max_model_len", "version", "max_total_num_tokens", "internal_states",
               "memory_usage", "token_capacity", "page_size", "context_length", "max_req_input_len",
               "disaggregation_mode", "default_generation_settings", "n_ctx", "model_id", "max_total_tokens",
               "max_input_tokens", "max_batch_total_tokens", "text", "meta_info", "finish_reason", "type", "message",
               "completion_tokens", "prompt_tokens", "cached_tokens", "choices", "usage", "prompt_tokens_details",
               "truncated", "content", "stop", "stop_type", "tokens_predicted", "tokens_evaluated", "generated_text",
               "details", "generated_tokens", "input_length", "token", "special", "error", "detail", "tokens"]
engine_shaped = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1 << 41) | st.floats() | st.sampled_from(
        ["abort", "length", "stop", "eos", "limit", "vllm", "prefill", "decode", "0.5.23", "kvpreflight-builtin 1",
         "Input length exceeds the maximum", "error"]) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(ENGINE_KEYS), children, max_size=5),
    max_leaves=20,
)


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity included, as Python's json reads them back


def json_bodies(honest: Any) -> st.SearchStrategy[bytes]:
    """An honest JSON body with one value replaced, any JSON, or bytes that may not be JSON."""
    return st.one_of(mutations(honest, engine_shaped).map(json_bytes), st.one_of(yaml_values, engine_shaped).map(json_bytes),
                     st.binary(max_size=200))


# -- Prometheus text ----------------------------------------------------------------------------------

METRIC_NAMES = ["sglang:max_total_num_tokens", "sglang:num_requests_total", "vllm:cache_config_info",
                "vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total", "tgi_batch_max_total_tokens",
                "tgi_request_success", "x"]
NUMBERS = ["0", "1", "-1", "12.5", "1e400", "-1e400", "NaN", "+Inf", "-Inf", "4096", "0x10", "", "abc", "9" * 5000]
metric_lines = st.builds(
    lambda name, labels, value, tail: f"{name}{labels} {value}{tail}",
    st.sampled_from(METRIC_NAMES),
    st.one_of(st.just(""), st.builds(lambda k, v: f'{{{k}="{v}"}}',
                                     st.sampled_from(["tp_rank", "kv_cache_size_tokens", "num_gpu_blocks", "block_size",
                                                      "engine_type", "enable_prefix_caching", "dp_rank"]),
                                     st.sampled_from(NUMBERS[:-1] + ["True", "None", "prefill", '\\"'])),
              st.text(max_size=15)),
    st.sampled_from(NUMBERS),
    st.sampled_from(["", " 1700000000", "\n", " x"]),
)
metric_texts = st.one_of(
    st.lists(st.one_of(metric_lines, st.sampled_from(["# HELP x y", "# TYPE x counter", "# TYPE x gauge", "# EOF"]),
                       st.text(max_size=40)), max_size=8).map("\n".join),
    st.text(max_size=300),
)


@given(metric_texts)
@example("x " + "9" * 5000)
def test_prometheus_text_parses_or_is_one_engine_error(text: str) -> None:
    metrics = bounded(parse_metrics, URL, text)
    if metrics is not None:
        assert all(isinstance(v, float) for samples in metrics.values() for _, v in samples)


# -- the engines' info endpoints and their logs ------------------------------------------------------

class CannedClient(HttpClient):
    """An HttpClient answering from `routes` ("GET /path" -> (status, body)) without a network."""

    def __init__(self, routes: Mapping[str, tuple[int, bytes]], frames: tuple[str, ...] = ()) -> None:
        super().__init__(timeout_s=5)
        self.routes = routes
        self.frames = frames

    def request(self, method: str, url: str, *, json_body: Any = None, timeout_s: float | None = None,
                max_bytes: int = BodyLimit.COMPLETION, headers: Any = None) -> HttpReply:
        status, body = self.routes.get(f"{method} {url.removeprefix(URL)}", (404, b'{"detail": "Not Found"}'))
        return HttpReply(url, status, body, 0.01, "application/json", {"x-prompt-tokens": "12"})

    def post_stream(self, url: str, body: Any, *, timeout_s: float, max_bytes: int = BodyLimit.EVENT_STREAM,
                    headers: Any = None) -> StreamReply:
        return StreamReply(url, 200, self.frames, "\n".join(self.frames).encode(), 0.01)


HONEST_INFO = {kind: {route: body for route, (_, _, body) in info_routes(kind).items()} for kind in KINDS}
LOG_TEMPLATES = [
    "[TP{rank}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {n}, KV size: 1 GB",
    "max_total_num_tokens={n}, chunked_prefill_size=8192, context_len={n}, available_gpu_mem=1",
    "KV pool holds {n} tokens, fewer than --context-length {n}.",
    "(EngineCore) INFO GPU KV cache size: {n} tokens",
    "estimated maximum model length is {n}",
    "llama_kv_cache: size = 1 MiB ( {n} cells, 2 layers, 1/{n} seqs)",
    "n_slots = {n}, n_ctx_slot = {n}, kv_unified = 'true'",
    "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 1.00 GiB for max tokens in paged KV cache ({n}).",
    "[TRT-LLM] [I] max_seq_len={n}, max_num_requests=64, max_num_tokens={n}, max_batch_size=64",
    "[TRT-LLM] [I] Estimated max memory in KV cache : 1.00 GiB",
    "Setting max batch total tokens to {n}",
    "Not enough memory to handle max_total_tokens={n}",
]
# A tenant's line: a start-up phrase repeated (engines log request text), read in bounded time.
HOSTILE_PHRASES = ["] KV Cache is allocated. ", "max_total_num_tokens=5,", "llama_kv_cache: size = ( 5 cells,",
                   "kv_role = '", "Decode transfer failed for request ", "Setting max batch total tokens to "]
log_texts = st.lists(st.one_of(
    st.builds(lambda phrase, times: phrase * times, st.sampled_from(HOSTILE_PHRASES), st.integers(1, 40_000)),
    st.builds(lambda t, n, rank: t.format(n=n, rank=rank), st.sampled_from(LOG_TEMPLATES),
              st.one_of(st.integers(0, 1 << 45).map(str), st.text("0123456789", min_size=1, max_size=5000)),
              st.integers(0, 9)),
    st.text(max_size=80)), max_size=4).map("\n".join)


@st.composite
def engine_info(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, bytes]], str | None]:
    """An engine kind, its info routes with one of them broken, and maybe a start-up log."""
    kind = draw(st.sampled_from(KINDS))
    routes = {route: (200, body) for route, body in HONEST_INFO[kind].items()}
    route = draw(st.sampled_from(sorted(r for r in routes if r != "GET /health")))
    if route.endswith("/metrics"):
        body = draw(metric_texts).encode()
    else:
        body = draw(json_bodies(json.loads(routes[route][1])))
    routes[route] = (draw(st.sampled_from([200, 200, 200, 404, 500])), body)
    return kind, routes, draw(st.none() | log_texts)


def _typed(snapshot: EngineSnapshot) -> None:
    """What the checks will do arithmetic and comparisons on has the type they expect."""
    for value in (snapshot.served_context, snapshot.page_size, snapshot.max_request_tokens):
        assert value is None or (isinstance(value, int) and value > 0)
    assert all(isinstance(r.tokens, int) and r.tokens >= 0 for r in snapshot.pool_readings)
    assert snapshot.model is None or isinstance(snapshot.model, str)
    assert snapshot.version is None or isinstance(snapshot.version, str)
    json.dumps(snapshot.settings)  # reported as JSON


def _honest(kind: str) -> dict[str, tuple[int, bytes]]:
    return {route: (200, body) for route, body in HONEST_INFO[kind].items()}


@given(engine_info())
@example(("sglang", _honest("sglang"), "[TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: " + "9" * 5000))
@example(("vllm", _honest("vllm"), "(EngineCore) INFO GPU KV cache size: ,,, tokens"))
@example(("tgi", _honest("tgi"), "Setting max batch total tokens to 99999999999999999999"))
@example(("sglang", _honest("sglang"), "[TP0] KV Cache is allocated. " * 400_000))  # 12 MB, one line
@example(("llamacpp", _honest("llamacpp"), "llama_kv_cache: size = ( 5 cells," * 300_000))
def test_engine_info_and_logs_read_or_are_one_engine_error(case: tuple[str, dict[str, tuple[int, bytes]], str | None]) -> None:
    kind, routes, log_text = case
    adapter = adapter_class(kind)(URL, CannedClient(routes))
    snapshot = bounded(adapter.snapshot, log_text=log_text)
    if snapshot is not None:
        _typed(snapshot)
        limit = bounded(adapter.max_accepted_prompt, snapshot)
        assert limit is None or isinstance(limit, int)
    counters = bounded(adapter.counters)
    if counters is not None:
        assert all(v is None or isinstance(v, float | int) for v in (counters.requests, counters.prompt_tokens))


# -- replies and event streams -------------------------------------------------------------------------

HONEST_REPLY: dict[str, Any] = {
    "sglang": {"text": " the", "meta_info": {"id": "a", "finish_reason": {"type": "length", "length": 4},
                                            "prompt_tokens": 100, "completion_tokens": 4, "cached_tokens": 0}},
    "vllm": json.loads((FIXTURES / "vllm" / "ok_200.json").read_text()),
    "llamacpp": {"content": " the", "tokens_predicted": 4, "tokens_evaluated": 100, "stop": True, "stop_type": "limit",
                 "truncated": False},
    "tgi": json.loads((FIXTURES / "tgi" / "generate.json").read_text()),
    "trtllm": json.loads((FIXTURES / "trtllm" / "completion.json").read_text().replace("PROMPT_TOKENS", "100")
                         .replace("TOTAL_TOKENS", "101")),
}
HONEST_FRAMES: dict[str, list[Any]] = {
    "sglang": [{"text": " the", "meta_info": {"finish_reason": None, "prompt_tokens": 100, "completion_tokens": 1}},
               HONEST_REPLY["sglang"]],
    "vllm": [{"choices": [{"text": " the", "finish_reason": None}]}, {"choices": [{"text": "", "finish_reason": "length"}]},
             {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 4}}],
    "llamacpp": [{"content": " the", "stop": False}, {**HONEST_REPLY["llamacpp"], "content": ""}],
    "tgi": [json.loads(line[5:].replace("INPUT_LENGTH", "100"))
            for line in (FIXTURES / "tgi" / "generate_stream.txt").read_text().splitlines() if line.startswith("data:")],
    # serve/openai_protocol.py CompletionStreamResponse: the usage in a last frame of its own
    "trtllm": [{"model": "m", "choices": [{"index": 0, "text": " the", "finish_reason": None}]},
               {"model": "m", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
               {"model": "m", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104}}],
}
ERROR_FRAMES = [{"error": {"message": "Input length exceeds the maximum allowed length", "code": 400}},
                {"object": "error", "message": "This model's maximum context length is 4096 tokens"}, {"error": None}]


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, bool, int, bytes, tuple[str, ...]]:
    """An engine kind, streamed or not, and its answer: a status and body, or the stream's frames."""
    kind = draw(st.sampled_from(KINDS))
    stream = draw(st.booleans())
    status = draw(st.sampled_from([200, 200, 200, 400, 422, 500]))
    body = draw(json_bodies(HONEST_REPLY[kind]))
    frame = st.one_of(mutations(HONEST_FRAMES[kind], engine_shaped).map(lambda frames: [json.dumps(f) for f in frames]),
                      st.lists(st.one_of(st.sampled_from(HONEST_FRAMES[kind] + ERROR_FRAMES), engine_shaped).map(json.dumps),
                               max_size=4),
                      st.lists(st.one_of(st.text(max_size=30), st.just("[DONE]")), max_size=3))
    return kind, stream, status, body, tuple(draw(frame))


def _with_request(adapter: EngineAdapter, stream: bool) -> EngineAdapter:
    """The adapter with its request-building skipped (TGI's needs its tokenizer): the reply is the point."""
    path = "/generate_stream" if stream and adapter.kind == "tgi" else "/generate"

    def build_request(ids: list[int], *, max_tokens: int, stream: bool, extra: Mapping[str, Any] | None = None) -> EngineRequest:
        return EngineRequest(path=path, body={}, sent_tokens=len(ids), max_tokens=max_tokens, stream=stream)

    adapter.build_request = build_request  # type: ignore[method-assign]  # a test seam: only the parsing is tested
    return adapter


@given(answers())
@example(("vllm", False, 200, b"[" * 100_000, ()))
@example(("sglang", True, 200, b"", ("[" * 100_000,)))
def test_replies_and_event_streams_parse_or_are_one_engine_error(case: tuple[str, bool, int, bytes, tuple[str, ...]]) -> None:
    kind, stream, status, body, frames = case
    client = CannedClient({"POST /generate": (status, body), "POST /generate_stream": (status, body)}, frames)
    adapter = _with_request(adapter_class(kind)(URL, client), stream)
    completion = bounded(adapter.complete, [1] * 100, max_tokens=4, stream=stream, timeout_s=5)
    if completion is None:
        return
    assert isinstance(completion, Completion)
    for count in (completion.completion_tokens, completion.prompt_tokens, completion.cached_tokens):
        assert count is None or (isinstance(count, int) and not isinstance(count, bool) and count >= 0), count
    assert completion.finish_reason is None or isinstance(completion.finish_reason, str)
    assert completion.error_message is None or isinstance(completion.error_message, str)
    assert completion.truncated in (None, True, False)
    json.dumps(completion.evidence(), allow_nan=False)  # it goes into the report and the record


# -- model configs and manifests read by review --------------------------------------------------------

LLAMA = json.loads((MODELS / "Llama-3.1-8B-Instruct" / "config.json").read_text())
DEEPSEEK = json.loads((MODELS / "DeepSeek-V3" / "config.json").read_text())
CONFIG_KEYS = sorted({*LLAMA, *DEEPSEEK})
config_shaped = st.one_of(st.integers(-2, 1 << 70), st.floats(), st.sampled_from(["bfloat16", "fp8", "auto", "sliding_attention"]),
                          st.dictionaries(st.sampled_from(CONFIG_KEYS), st.integers(-2, 200_000), max_size=4))
LAUNCHES = (
    "python3 -m sglang.launch_server --model-path m --tp-size 2 --context-length 32768 --mem-fraction-static 0.85\n"
    "vllm serve m --tensor-parallel-size 2 --max-model-len 32768 --gpu-memory-utilization 0.9\n"
    "llama-server -m m/model.gguf -c 32768 -np 4\n"
)


def _review(manifest: Path, model_dir: Path | None) -> list[Any] | None:
    from kvpreflight._internal.review import estimate_files
    from kvpreflight._internal.review.check import judge
    from kvpreflight._internal.review.estimate import Estimate, ReviewInputs

    results = bounded(estimate_files, [manifest], ReviewInputs(model_dir=model_dir, gpu="H100 80GB"))
    for result in results or []:
        if isinstance(result, Estimate):
            assert isinstance(result.pool_tokens, int) and isinstance(result.kv_bytes_per_token, int)
            assert result.kv_bytes_per_token > 0 and result.context_checked > 0, result
            json.dumps(judge(result, THRESHOLDS).evidence, allow_nan=False)
    return results


THRESHOLDS = load_thresholds()


@given(st.one_of(mutations(LLAMA, config_shaped), mutations(DEEPSEEK, config_shaped), engine_shaped),
       st.none() | st.one_of(st.integers(), st.floats(), st.text(max_size=5)))
@example({**LLAMA, "num_key_value_heads": -8}, None)
@example(LLAMA, float("inf"))
def test_model_configs_read_by_review_estimate_or_are_one_review_error(config: Any, total_size: Any) -> None:
    folder = SCRATCH / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    index = folder / "model.safetensors.index.json"
    index.unlink(missing_ok=True)
    if total_size is not None:
        index.write_text(json.dumps({"metadata": {"total_size": total_size}}))
    manifest = SCRATCH / "launch.sh"
    manifest.write_text(LAUNCHES)
    _review(manifest, folder)


MANIFEST_FIXTURES = {name: list(yaml.safe_load_all((FIXTURES / "review" / name).read_text()))
                     for name in ("k8s-llama8b-vllm.yaml", "compose-llama70b.yml", "bootspec-pd.yaml")}
WORDS = ["python3 -m sglang.launch_server", "vllm serve", "llama-server", "sglang serve", "--model-path", "--model",
         "meta-llama/Llama-3.1-8B-Instruct", "--tp-size", "--tp", "--context-length", "--max-model-len", "-c", "-np",
         "--max-total-tokens", "--mem-fraction-static", "$TP", "${TP:-2}", "TP=8", "exec", "\\\n", "'", '"', "#", ";",
         "&&", "0", "-1", "131072", "1e9", "0.85", "nan", "=", "$(", "`", "trtllm-serve", "--max_seq_len", "--config",
         "llm_api.yaml", "--kv_cache_free_gpu_memory_fraction", "--server_role", "disaggregated"]
shell_scripts = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), max_size=25).map(" ".join)


@st.composite
def manifests(draw: st.DrawFn) -> tuple[str, str]:
    """(suffix, text): a fixture manifest with one value replaced, any YAML, or a shell script."""
    choice = draw(st.sampled_from([*MANIFEST_FIXTURES, "yaml", "shell"]))
    if choice == "shell":
        return ".sh", draw(shell_scripts)
    if choice == "yaml":
        return ".yaml", draw(st.one_of(yaml_values.map(yaml.safe_dump), st.text(max_size=200)))
    documents = draw(mutations(MANIFEST_FIXTURES[choice], st.sampled_from(WORDS), shell_scripts))
    return Path(choice).suffix, yaml.safe_dump_all(documents)


@given(manifests())
@example((".yaml", "context_length: '-1'\ndeployment: d\nengines:\n- name: p\n  role: unified\n"
                   "  command: vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 4096\n"))
@example((".sh", "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len -1 --gpu-memory-utilization nan"))
@example((".sh", "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len -1"))
@example((".yaml", "[" * 3000 + "]" * 3000))
@example((".yaml", "a: &a [1, 2]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                   "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                   "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n"))
def test_manifests_read_by_review_estimate_or_are_one_review_error(case: tuple[str, str]) -> None:
    suffix, text = case
    manifest = SCRATCH / f"manifest{suffix}"
    manifest.write_text(text)
    _review(manifest, MODELS)


TRTLLM_OPTIONS = {"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "max_tokens": 65536, "dtype": "auto"},
                  "max_seq_len": 131072, "max_num_tokens": 8192, "max_batch_size": 64, "tensor_parallel_size": 1,
                  "fail_fast_on_attention_window_too_large": True}


@given(st.one_of(mutations(TRTLLM_OPTIONS, yaml_values), yaml_values, st.text(max_size=200)))
@example({"kv_cache_config": {"free_gpu_memory_fraction": float("nan")}})
@example({"kv_cache_config": {"max_tokens": True}, "max_seq_len": 1.5})
@example({"tensor_parallel_size": 0})
def test_trtllm_options_yaml_read_by_review_estimate_or_are_one_review_error(options: Any) -> None:
    """Whatever the --config YAML beside a trtllm-serve launch holds."""
    folder = SCRATCH / "trtllm"
    folder.mkdir(exist_ok=True)
    (folder / "llm_api.yaml").write_text(options if isinstance(options, str) else yaml.safe_dump(options))
    script = folder / "serve.sh"
    script.write_text("trtllm-serve Llama-3.1-8B-Instruct --max_seq_len 32768 --config llm_api.yaml\n")
    _review(script, MODELS)


# -- DSSE envelopes read by verify -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def record_dir() -> Iterator[Path]:
    yield SCRATCH


KEY: Any = None


def _key() -> Any:
    global KEY
    if KEY is None:
        from kvpreflight.record.keys import generate

        KEY = generate()
    return KEY


def _statement() -> dict[str, Any]:
    from kvpreflight.record.statement import Subject, build_statement

    return build_statement(sample_report(failing=True), command_line=["kvpreflight", "check"],
                           subjects=[Subject("image", "a" * 64)])


STATEMENT = _statement()
FLEET_STATEMENT: dict[str, Any] = {
    **STATEMENT, "predicateType": FLEET_PREDICATE_TYPE,
    "subject": [{"name": "record:a.dsse.json", "digest": {"sha256": "b" * 64}}, {"name": "image", "digest": {"sha256": "a" * 64}}],
    "predicate": {"schema_version": 1, "tool": {"name": "kvpreflight", "version": "1"}, "time": STATEMENT["predicate"]["time"],
                  "host": "h", "fleet": "f", "runner": "local", "verdict": "fail", "counts": {"fail": 1},
                  "deployments": [{"name": "a", "verdict": "fail", "exit_code": 1, "record": "a.dsse.json", "engines": []}]},
}
STATEMENT_KEYS = ["_type", "predicateType", "predicate", "subject", "time", "verdict", "checks", "engines", "deployments",
                  "tool", "version", "name", "digest", "sha256", "status", "id", "record", "host"]
statement_shaped = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(
        ["pass", "fail", "inconclusive", "2026-01-01T00:00:00Z", "https://in-toto.io/Statement/v1", "a" * 64, "record:x.json"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(STATEMENT_KEYS), children, max_size=4),
    max_leaves=15,
)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    """A record file: a signed statement with one value replaced, a signed anything, an envelope
    with any values, or bytes."""
    from kvpreflight.record.sign import sign_statement

    choice = draw(st.sampled_from(["predicate", "statement", "signed", "envelope", "bytes", "duplicate key"]))
    base = draw(st.sampled_from([STATEMENT, FLEET_STATEMENT]))
    if choice == "bytes":
        return draw(st.binary(max_size=300))
    if choice == "duplicate key":  # a key of the envelope or of a signature given twice, any value first
        text = json.dumps(sign_statement(base, _key()))
        key = draw(st.sampled_from(['"payload"', '"payloadType"', '"signatures"', '"keyid"', '"sig"']))
        return text.replace(f"{key}:", f"{key}: {json.dumps(draw(statement_shaped))}, {key}:", 1).encode()
    if choice == "envelope":
        envelope = sign_statement(base, _key())
        return json_bytes(draw(mutations(envelope, statement_shaped)))
    if choice == "predicate":  # the predicate's own fields, which verify reads once the signature holds
        key = draw(st.sampled_from(sorted(base["predicate"])))
        statement = {**base, "predicate": {**base["predicate"], key: draw(statement_shaped)}}
    else:
        statement = draw(mutations(base, statement_shaped)) if choice == "statement" else draw(statement_shaped)
    try:
        return json_bytes(sign_statement(statement, _key()))
    except (TypeError, ValueError):  # not JSON (a non-string key): the signer never writes it
        assume(False)
        raise


@given(records(), st.booleans())
@example(b"[" * 100_000, False)
@example(b'{"payloadType": "text/plain", "payloadType": "application/vnd.in-toto+json", "payload": "", "signatures": []}', False)
def test_dsse_envelopes_read_by_verify_verify_or_are_one_record_error(raw: bytes, deep: bool) -> None:
    from kvpreflight.record.dsse import envelope_from_bytes
    from kvpreflight.record.statement import Subject
    from kvpreflight.record.verify import Policy, summary, verify_deep, verify_envelope

    envelope = bounded(envelope_from_bytes, raw, "record.json")
    if envelope is None:
        return
    public = _key().public
    for policy in (Policy(any_subject=True, allow_fail=True), Policy(subjects=(Subject("image", "a" * 64),))):
        record = bounded(verify_envelope, envelope, public, policy)
        if record is not None:
            assert isinstance(bounded(summary, record, path="record.json"), str)
            if deep:
                bounded(verify_deep, record, SCRATCH, public, policy)
