"""What a builtin prefill/decode/router trio is, as `kvpreflight demo` and a fleet inventory's
`builtin:` entry describe it: a description only (booting it is kvpreflight._internal.demo's), so that the
fleet and watch read it without standing above the demo."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpreflight._internal.builtin_engine.config import FAULTS, Fault
from kvpreflight.errors import ConfigError
from kvpreflight.model import RouterKind

INCIDENT_POOL_RATIO = 0.65  # 681,280 / 1,048,576
INCIDENT_FAULTS = (Fault.REJECT_CONTINUES.value, Fault.NO_TRANSFER_CHECK.value)


@dataclass(frozen=True, kw_only=True)
class BuiltinDeployment:
    """A builtin prefill/decode/router trio as the demo and fleet inventories describe it."""

    pool_ratio: float = 2.0  # prefill pool = ratio x context
    decode_pool_ratio: float = 2.0
    context_length: int = 8192
    faults: tuple[str, ...] = ()
    incident: bool = False  # the 2026 incident: ratio 0.65, its faults, another tenant's data planted
    router: RouterKind = RouterKind.BUILTIN  # which PD router fronts the pair

    def validate(self, name_of: Callable[[str], str] = str) -> None:
        """Raises ConfigError naming the field as `name_of(field)` says (a CLI flag, a YAML path)."""
        if not isinstance(self.router, RouterKind):
            raise ConfigError(f"must be one of {', '.join(RouterKind)} (got {self.router!r})").under(name_of("router"))
        for name, value in (("pool_ratio", self.pool_ratio), ("decode_pool_ratio", self.decode_pool_ratio)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 64:
                raise ConfigError(f"must be a ratio between 0 and 64 (got {value})").under(name_of(name))
        if isinstance(self.context_length, bool) or not isinstance(self.context_length, int) \
                or not 256 <= self.context_length <= 262144:
            raise ConfigError(f"must be an integer between 256 and 262144 for the builtin engine "
                              f"(got {self.context_length})").under(name_of("context_length"))
        for i, fault in enumerate(self.faults):
            if fault not in FAULTS:
                raise ConfigError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}").under(name_of(f"faults[{i}]"))

    @property
    def prefill_pool_ratio(self) -> float:
        return INCIDENT_POOL_RATIO if self.incident else self.pool_ratio

    @property
    def engine_faults(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.faults) | (set(INCIDENT_FAULTS) if self.incident else set())))
