"""Engine settings, faults and the SGLang-style pool sizing. No torch here."""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvpreflight.errors import ConfigError
from kvpreflight.model import ProcessRole

# Faults are read from this environment variable, never from the engine's argv, so that no
# endpoint (launch_command included), metric or log line can reveal them.
FAULTS_ENV = "KVPREFLIGHT_BUILTIN_FAULTS"
# Test only: a racy fault, as it shows in production, fires at some of its chances, not all. With
# this set (a probability in (0, 1]), fault early-free-on-cancel fires at each disconnect with
# that probability; unset, at every one. benchmarks/bench_detection.py uses it.
FAULT_PROBABILITY_ENV = "KVPREFLIGHT_BUILTIN_FAULT_PROBABILITY"
# The faults' parameters, from the environment too (never argv): the model's positions under
# faults positions-overridden*, and the attention window under faults attention-window*. Unset,
# half and a quarter of the served context.
POSITIONS_ENV = "KVPREFLIGHT_BUILTIN_POSITIONS"
ATTENTION_WINDOW_ENV = "KVPREFLIGHT_BUILTIN_ATTENTION_WINDOW"
# Fault pool-in-another-unit: the parallel size P its stated pool is multiplied by (per-rank
# tokens times P, as SGLang's DCP accounting, PR #32730, and Dynamo's per-rank DP capacity, PR
# #14258). From the environment like the faults, so no endpoint reveals it; unset: 2.
PARALLEL_SIZE_ENV = "KVPREFLIGHT_BUILTIN_PARALLEL_SIZE"
DEFAULT_PARALLEL_SIZE = 2


class Fault(str, enum.Enum):
    """A bug the engine can be told to have, so a test can prove a check catches its class."""

    REJECT_CONTINUES = "reject-continues"
    NO_TRANSFER_CHECK = "no-transfer-check"
    EARLY_FREE_ON_CANCEL = "early-free-on-cancel"
    TRANSFER_FAIL_AS_DRAINED = "transfer-fail-as-drained"
    PREFIX_CACHE_NO_SALT = "prefix-cache-no-salt"
    AUTO_TRUNCATE = "auto-truncate"
    MISREPORT_POOL = "misreport-pool"
    DECODE_RECOMPUTE = "decode-recompute"
    LEAK_STREAMED = "leak-streamed"
    LEAK_NOT_STREAMED = "leak-not-streamed"
    SHORTENED_PROMPT = "shortened-prompt"
    TOKENS_THEN_GARBAGE = "tokens-then-garbage"
    TEXT_WITH_BAD_COUNT = "text-with-bad-count"
    DECODE_CACHE_NO_SALT = "decode-cache-no-salt"
    DECODE_CACHE_NO_SALT_PARTIAL = "decode-cache-no-salt-partial"
    POSITIONS_OVERRIDDEN = "positions-overridden"
    POSITIONS_OVERRIDDEN_SILENT = "positions-overridden-silent"
    ATTENTION_WINDOW = "attention-window"
    ATTENTION_WINDOW_SILENT = "attention-window-silent"
    POOL_IN_ANOTHER_UNIT = "pool-in-another-unit"
    WEDGE_AFTER_DISCONNECT = "wedge-after-disconnect"

    @property
    def description(self) -> str:
        return _FAULT_DESCRIPTIONS[self]


_FAULT_DESCRIPTIONS = {
    Fault.REJECT_CONTINUES: "over-pool prompt becomes a 1-token placeholder and keeps flowing (pre-0.5.21 abort path)",
    Fault.NO_TRANSFER_CHECK: "decode does not compare transferred with reserved token counts",
    Fault.EARLY_FREE_ON_CANCEL: "decode frees pages at once on client disconnect, while a transfer is in flight",
    Fault.TRANSFER_FAIL_AS_DRAINED: "some transfers fail but are reported complete",
    Fault.PREFIX_CACHE_NO_SALT: "the prefix cache ignores the request's cache_salt",
    Fault.AUTO_TRUNCATE: "over-length prompts silently truncated, server_info does not say so",
    Fault.MISREPORT_POOL: "server_info and metrics report a larger pool than the allocator holds",
    Fault.DECODE_RECOMPUTE: "decode discards the KV the prefill sent and computes the prompt again itself",
    Fault.LEAK_STREAMED: "streamed answers are decoded over the tail of another cache_salt's last prompt (unified, decode)",
    Fault.LEAK_NOT_STREAMED: "answers that are not streamed are decoded over the tail of another cache_salt's last prompt "
                             "(unified, decode)",
    Fault.SHORTENED_PROMPT: "prompts over 256 tokens lose their second half, the answer still reports the full length (unified, prefill)",
    Fault.TOKENS_THEN_GARBAGE: "a streamed prompt over the limits gets 3 tokens, then an error frame cut mid-JSON",
    Fault.TEXT_WITH_BAD_COUNT: "a prompt over the limits, not streamed, gets an answer with text and completion_tokens -1",
    Fault.DECODE_CACHE_NO_SALT: (
        "the decode keeps its own prefix cache (SGLang's --disaggregation-decode-enable-radix-cache) keyed without the "
        "cache_salt: another tenant's cached prefix is reused and only the rest transferred; the decode's hit counters "
        "(lookups, cached tokens, hit rate) move, the answer's cached_tokens stays the prefill's (decode)"),
    Fault.DECODE_CACHE_NO_SALT_PARTIAL: (
        "as decode-cache-no-salt, but a hit reuses only the first half of the cached prefix's pages and is counted in "
        "the cached-tokens counter alone, not in the lookup counter or the hit rate (decode)"),
    Fault.POSITIONS_OVERRIDDEN: (
        f"the model has fewer positions ({POSITIONS_ENV}, else half the context) than the served context, as "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 allows: past them every token is served and counted, the answer "
        "is noise; SGLang's start-up warning is logged (unified, decode)"),
    Fault.POSITIONS_OVERRIDDEN_SILENT: "as positions-overridden, with no warning at start-up (unified, decode)",
    Fault.ATTENTION_WINDOW: (
        f"attention sees only the last {ATTENTION_WINDOW_ENV} tokens (else a quarter of the context), as TensorRT-LLM's "
        "clamped maxAttentionWindow: every token is computed and counted, a longer prompt's answer is copied from its "
        "tail; TensorRT-LLM's clamp warning is logged at start-up (unified, decode)"),
    Fault.ATTENTION_WINDOW_SILENT: "as attention-window, with no warning at start-up (unified, decode)",
    Fault.POOL_IN_ANOTHER_UNIT: ("the pool is stated as per-rank tokens times a parallel size (KVPREFLIGHT_BUILTIN_PARALLEL_SIZE, "
                                 "default 2) in every source; a prompt over the true pool becomes a 1-token placeholder and is "
                                 "answered from stale pages, counted in full (unified, prefill)"),
    Fault.WEDGE_AFTER_DISCONNECT: ("after a client leaves a request in flight the engine schedules nothing more: /health 200, new "
                                   "requests accepted and never answered, the abandoned request's pages held (unified, decode)"),
}

# Name -> description, for callers that hold fault names as text (demo and fleet settings).
FAULTS: Mapping[str, str] = {fault.value: fault.description for fault in Fault}

# The scheduler limits the engine reports as SGLang's defaults (it does not enforce them).
CHUNKED_PREFILL_SIZE = 8192
MAX_PREFILL_TOKENS = 16384
MAX_RUNNING_REQUESTS = 64

DEFAULT_PD_WAIT_S = 60.0

GB = 1 << 30
# Bytes per cached token: K and V, 16 float32 each (see model.py).
KV_DIM = 16
CELL_BYTES = 2 * KV_DIM * 4
# What the "weights" occupy before the pool is sized (the token codebook), as SGLang subtracts them.
WEIGHT_BYTES = 260 * KV_DIM * 4


class ServeConfigError(ConfigError):
    """A builtin-engine setting that cannot work; found before the engine starts."""


def parse_faults(names: Iterable[str], source: str) -> frozenset[Fault]:
    """Fault names as given on the command line or in the environment; `source` names where."""
    wanted = {name.strip() for name in names if name.strip()}
    unknown = sorted(wanted - FAULTS.keys())
    if unknown:
        raise ServeConfigError(
            f"{source} names unknown fault {', '.join(unknown)}; known: {', '.join(sorted(FAULTS))}"
        )
    return frozenset(Fault(name) for name in wanted)


def parse_role(text: str) -> ProcessRole:
    try:
        return ProcessRole(text)
    except ValueError:
        known = ", ".join(role.value for role in ProcessRole)
        raise ServeConfigError(f"--role {text!r} is not one of {known}") from None


KV_CANARY_MODES = ("none", "log", "raise")  # SGLang's CanaryMode (srt/kv_canary/config.py, 0.5.13+)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    role: ProcessRole
    host: str
    port: int
    context_length: int | None = None
    pool_tokens: int | None = None
    mem_budget_bytes: int | None = None
    mem_fraction_static: float | None = None
    page_size: int = 16
    model_name: str = "kvpreflight-builtin-copy"
    faults: frozenset[Fault] = frozenset()
    fault_probability: float = 1.0  # racy faults fire at each chance with this probability
    parallel_size: int = DEFAULT_PARALLEL_SIZE  # fault pool-in-another-unit: stated pool = real x this
    transfer_delay_ms: int = 0
    transfer_fail_every: int = 0
    page_log: str | None = None
    decode_url: str | None = None
    prefill_urls: tuple[str, ...] = ()
    enable_metrics: bool = False
    device: str = "auto"
    launch_command: str = ""
    bootstrap_port: int = 0  # prefill: its bootstrap server, where decodes take pages; 0 picks a free port
    disable_radix_cache: bool = False
    prefill_tokens_per_second: float = 0.0  # test: prefill no faster than this (0: as fast as it runs)
    pd_wait_s: float = DEFAULT_PD_WAIT_S  # PD: how long one side waits for its peer (pd_wait_from_env)
    kv_canary: str = "none"  # SGLang's --kv-canary: none | log | raise (builtin_engine/core.py verify_canary)
    positions: int | None = None  # faults positions-overridden*: the model's positions (POSITIONS_ENV; None: half the context)
    attention_window: int | None = None  # faults attention-window*: tokens attended (ATTENTION_WINDOW_ENV; None: a quarter)

    def validate(self) -> None:
        if not (0 <= self.port <= 65535):
            raise ServeConfigError(f"--port {self.port} is not a TCP port (0-65535)")
        if not (0 <= self.bootstrap_port <= 65535):
            raise ServeConfigError(f"--disaggregation-bootstrap-port {self.bootstrap_port} is not a TCP port (0-65535)")
        if self.kv_canary not in KV_CANARY_MODES:
            raise ServeConfigError(f"--kv-canary {self.kv_canary!r} is not one of {', '.join(KV_CANARY_MODES)}")
        # Every missing required flag at once, not one failed start at a time.
        missing = []
        if self.role is ProcessRole.ROUTER:
            missing += ["--decode-url URL"] if not self.decode_url else []
            missing += ["--prefill-url URL (at least one)"] if not self.prefill_urls else []
        else:
            if self.context_length is None or self.context_length < 2:
                missing.append("--context-length N (at least 2)")
            if self.pool_tokens is None and self.mem_fraction_static is None:
                missing.append("--pool-tokens N (or --mem-budget-bytes B with --mem-fraction-static F)")
        if missing:
            raise ServeConfigError(f"--role {self.role.value} needs {', '.join(missing)}; e.g. kvpreflight engine serve "
                                    + ("--role router --decode-url URL --prefill-url URL" if self.role is ProcessRole.ROUTER
                                       else f"--role {self.role.value} --context-length 8192 --pool-tokens 16384"))
        if self.role is ProcessRole.ROUTER:
            return
        if self.page_size < 1:
            raise ServeConfigError(f"--page-size {self.page_size} must be at least 1")
        if self.pool_tokens is not None and (self.mem_budget_bytes is not None or self.mem_fraction_static is not None):
            raise ServeConfigError("give either --pool-tokens or --mem-budget-bytes with --mem-fraction-static, not both")
        if self.mem_fraction_static is not None and not (0.0 < self.mem_fraction_static <= 1.0):
            raise ServeConfigError(f"--mem-fraction-static {self.mem_fraction_static} must be in (0, 1]")
        if self.pool_tokens is not None and self.pool_tokens < self.page_size:
            raise ServeConfigError(f"--pool-tokens {self.pool_tokens} is smaller than one page ({self.page_size} tokens)")
        if self.device not in ("cpu", "cuda", "auto"):
            raise ServeConfigError(f"--device {self.device!r} is not one of cpu, cuda, auto")
        if self.transfer_delay_ms < 0 or self.transfer_fail_every < 0:
            raise ServeConfigError("--transfer-delay-ms and --transfer-fail-every must not be negative")
        for env, value in ((POSITIONS_ENV, self.positions), (ATTENTION_WINDOW_ENV, self.attention_window)):
            if value is not None and value < 1:
                raise ServeConfigError(f"{env}={value} must be a number of tokens, at least 1")
        if not (self.prefill_tokens_per_second >= 0 and math.isfinite(self.prefill_tokens_per_second)):
            raise ServeConfigError(f"--prefill-tokens-per-second {self.prefill_tokens_per_second} must be a finite number, 0 or more")


# SGLang's names for the two PD waits (srt/environ.py, both 300 s there; 60 s here): the prefill
# waits BOOTSTRAP_TIMEOUT for the decode to register a room, the decode WAITING_TIMEOUT for the
# prefill's KV. Read from the environment, as SGLang does.
PD_WAIT_ENVS = ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT")


def pd_wait_from_env(role: ProcessRole, environ: Mapping[str, str] | None = None) -> float:
    """Seconds this role waits for its PD peer: the SGLang variable for the role, else 60."""
    name = PD_WAIT_ENVS[0] if role is ProcessRole.PREFILL else PD_WAIT_ENVS[1]
    raw = (environ if environ is not None else os.environ).get(name, "").strip()
    if not raw:
        return DEFAULT_PD_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= 86_400):
        raise ServeConfigError(f"{name}={raw!r} is not a number of seconds in (0, 86400]; unset it for the default {DEFAULT_PD_WAIT_S:.0f}")
    return value


def faults_from_env(environ: Mapping[str, str] | None = None) -> frozenset[Fault]:
    raw = (environ if environ is not None else os.environ).get(FAULTS_ENV, "")
    return parse_faults(raw.split(","), FAULTS_ENV)


def fault_probability_from_env(environ: Mapping[str, str] | None = None) -> float:
    raw = (environ if environ is not None else os.environ).get(FAULT_PROBABILITY_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ServeConfigError(f"{FAULT_PROBABILITY_ENV}={raw} must be a probability in (0, 1]; unset it for always")
    return value


def tokens_from_env(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """A fault's token parameter (POSITIONS_ENV, ATTENTION_WINDOW_ENV); None when unset."""
    raw = (environ if environ is not None else os.environ).get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ServeConfigError(f"{name}={raw!r} must be a whole number of tokens, at least 1; unset it for the default")
    return value


def parallel_size_from_env(environ: Mapping[str, str] | None = None) -> int:
    raw = (environ if environ is not None else os.environ).get(PARALLEL_SIZE_ENV, "").strip()
    if not raw:
        return DEFAULT_PARALLEL_SIZE
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 2 <= value <= 1024:
        raise ServeConfigError(f"{PARALLEL_SIZE_ENV}={raw} must be a whole number in [2, 1024]; unset it for {DEFAULT_PARALLEL_SIZE}")
    return value


def derive_pool_tokens(total_bytes: int, available_bytes: int, mem_fraction_static: float, page_size: int) -> int:
    """SGLang's sizing: what is left of the memory after weights, minus the share the static
    fraction leaves to activations, divided by the bytes one token's KV needs, down to whole pages.

    rest = available_after_weights - total * (1 - mem_fraction_static); tokens = rest // cell.
    """
    rest = (available_bytes - WEIGHT_BYTES) - total_bytes * (1.0 - mem_fraction_static)
    tokens = int(rest // CELL_BYTES) // page_size * page_size
    if tokens <= 0:
        raise ServeConfigError("Not enough memory. Please try to increase --mem-fraction-static.")
    return tokens


def max_req_input_len(context_length: int, pool_tokens: int) -> int:
    """SGLang tp_worker.get_worker_info: min(context_len - 1, pool - 1) - 5. A prompt is refused
    when its length is >= this (scheduler validate_input_length)."""
    return min(context_length - 1, pool_tokens - 1) - 5
