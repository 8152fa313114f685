"""Engine settings, fault names and the SGLang-style pool sizing. No torch here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvpreflight.errors import ConfigError

ROLES = ("unified", "prefill", "decode", "router")

# Faults are read from this environment variable, never from the engine's argv, so that no
# endpoint (launch_command included), metric or log line can reveal them.
FAULTS_ENV = "KVPREFLIGHT_BUILTIN_FAULTS"

FAULTS = {
    "reject-continues": "over-pool prompt becomes a 1-token placeholder and keeps flowing (pre-0.5.21 abort path)",
    "no-transfer-check": "decode does not compare transferred with reserved token counts",
    "early-free-on-cancel": "decode frees pages at once on client disconnect, while a transfer is in flight",
    "transfer-fail-as-drained": "some transfers fail but are reported complete",
    "prefix-cache-no-salt": "the prefix cache ignores the request's cache_salt",
    "auto-truncate": "over-length prompts silently truncated, server_info does not say so",
    "misreport-pool": "server_info and metrics report a larger pool than the allocator holds",
}

# Bytes per cached token: K and V, 16 float32 each (see model.py).
KV_DIM = 16
CELL_BYTES = 2 * KV_DIM * 4
# What the "weights" occupy before the pool is sized (the token codebook), as SGLang subtracts them.
WEIGHT_BYTES = 260 * KV_DIM * 4


class EngineConfigError(ConfigError):
    """A builtin-engine setting that cannot work; found before the engine starts."""


@dataclass(frozen=True)
class EngineConfig:
    role: str
    host: str
    port: int
    context_length: int | None = None
    pool_tokens: int | None = None
    mem_budget_bytes: int | None = None
    mem_fraction_static: float | None = None
    page_size: int = 16
    model_name: str = "kvpreflight-builtin-copy"
    faults: frozenset[str] = frozenset()
    transfer_delay_ms: int = 0
    transfer_fail_every: int = 0
    page_log: str | None = None
    decode_url: str | None = None
    prefill_urls: tuple[str, ...] = ()
    enable_metrics: bool = False
    device: str = "auto"
    launch_command: str = ""
    bootstrap_port: int = 0  # decode: where prefills send pages; 0 picks a free port
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.role not in ROLES:
            raise EngineConfigError(f"--role {self.role!r} is not one of {', '.join(ROLES)}")
        if not (0 <= self.port <= 65535):
            raise EngineConfigError(f"--port {self.port} is not a TCP port (0-65535)")
        unknown = sorted(self.faults - FAULTS.keys())
        if unknown:
            raise EngineConfigError(
                f"unknown fault {', '.join(unknown)}; known faults: {', '.join(sorted(FAULTS))}"
            )
        if self.role == "router":
            if not self.decode_url or not self.prefill_urls:
                raise EngineConfigError("--role router needs --decode-url URL and at least one --prefill-url URL")
            return
        if self.context_length is None or self.context_length < 2:
            raise EngineConfigError("--context-length N (at least 2) is required for an engine role")
        if self.page_size < 1:
            raise EngineConfigError(f"--page-size {self.page_size} must be at least 1")
        if self.pool_tokens is not None and (self.mem_budget_bytes is not None or self.mem_fraction_static is not None):
            raise EngineConfigError("give either --pool-tokens or --mem-budget-bytes with --mem-fraction-static, not both")
        if self.pool_tokens is None and self.mem_fraction_static is None:
            raise EngineConfigError("give --pool-tokens N, or --mem-budget-bytes B with --mem-fraction-static F")
        if self.mem_fraction_static is not None and not (0.0 < self.mem_fraction_static <= 1.0):
            raise EngineConfigError(f"--mem-fraction-static {self.mem_fraction_static} must be in (0, 1]")
        if self.pool_tokens is not None and self.pool_tokens < self.page_size:
            raise EngineConfigError(f"--pool-tokens {self.pool_tokens} is smaller than one page ({self.page_size} tokens)")
        if self.device not in ("cpu", "cuda", "auto"):
            raise EngineConfigError(f"--device {self.device!r} is not one of cpu, cuda, auto")
        if self.transfer_delay_ms < 0 or self.transfer_fail_every < 0:
            raise EngineConfigError("--transfer-delay-ms and --transfer-fail-every must not be negative")


def faults_from_env(environ: dict | None = None) -> frozenset[str]:
    raw = (environ if environ is not None else os.environ).get(FAULTS_ENV, "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - FAULTS.keys())
    if unknown:
        raise EngineConfigError(
            f"{FAULTS_ENV} names unknown fault {', '.join(unknown)}; known: {', '.join(sorted(FAULTS))}"
        )
    return names


def derive_pool_tokens(total_bytes: int, available_bytes: int, mem_fraction_static: float, page_size: int) -> int:
    """SGLang's sizing: what is left of the memory after weights, minus the share the static
    fraction leaves to activations, divided by the bytes one token's KV needs, down to whole pages.

    rest = available_after_weights - total * (1 - mem_fraction_static); tokens = rest // cell.
    """
    rest = (available_bytes - WEIGHT_BYTES) - total_bytes * (1.0 - mem_fraction_static)
    tokens = int(rest // CELL_BYTES) // page_size * page_size
    if tokens <= 0:
        raise EngineConfigError("Not enough memory. Please try to increase --mem-fraction-static.")
    return tokens


def max_req_input_len(context_length: int, pool_tokens: int) -> int:
    """SGLang tp_worker.get_worker_info: min(context_len - 1, pool - 1) - 5. A prompt is refused
    when its length is >= this (scheduler validate_input_length)."""
    return min(context_length - 1, pool_tokens - 1) - 5
