"""Where the late-decode scenario (probes/scenarios.py) sends its two legs: the prefill and
decode whose legs kvpreflight can send itself (the adapter's SplitLegs), and the prefill's KV
lease it outwaits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpreflight._internal.engines.interface import EngineAdapter, SplitLegs
from kvpreflight._internal.probes.scenarios import LATE_DECODE_MARGIN_S
from kvpreflight.model import EngineSnapshot, Role


@dataclass(frozen=True)
class HeldLegs:
    """Where late-decode sends its legs, and the prefill's lease it outwaits."""

    prefill: str
    decode: str
    lease_s: float
    lease_said: str  # the setting and where it was read, as the evidence quotes it

    @property
    def wait_s(self) -> float:
        return self.lease_s + LATE_DECODE_MARGIN_S


def held_legs(snapshots: Sequence[EngineSnapshot], engines: Mapping[str, EngineAdapter]) -> HeldLegs | str:
    """The prefill and decode whose legs late-decode sends, or why it does not apply."""
    prefills = [(s, a) for s in snapshots if s.role is Role.PREFILL
                and isinstance(a := engines.get(s.url), SplitLegs) and a.held_kv_lease(s) is not None]
    decodes = [s.url for s in snapshots if s.role is Role.DECODE and isinstance(engines.get(s.url), SplitLegs)]
    if not prefills or not decodes:
        return ("not applicable: it needs a prefill/decode pair whose legs kvpreflight can send itself, with the "
                "prefill's KV lease known (vLLM NIXL, the prefill and decode URLs named by --endpoint roles or the "
                "router)")
    snap, adapter = prefills[0]
    assert isinstance(adapter, SplitLegs)
    lease = adapter.held_kv_lease(snap)
    assert lease is not None
    how = "stated in " + lease.stated_in if lease.stated else "the engine's default; not in its start-up log"
    return HeldLegs(prefill=snap.url, decode=decodes[0], lease_s=lease.seconds,
                    lease_said=f"{lease.setting} {lease.seconds:g} s at {snap.url} ({how})")
