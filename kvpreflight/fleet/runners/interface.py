"""The runner interface, and what every runner shares: batches and deadlines.

A batch is the deployments that share an engine URL (or a fixed port on one node): they run one
after another in one unit of work, so kvpreflight never runs twice against one engine at a time,
whatever the parallelism. Every batch has a deadline; a runner turns a batch that fails, dies or
runs past it into `inconclusive` outcomes with the reason, never into a missing row.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.inventory import Deployment
from kvpreflight.fleet.job import JobSettings, Outcome, not_measured

Batch = tuple[Deployment, ...]

ATTACH_GRACE_S = 5.0
BOOT_GRACE_S = 45.0  # the worker's own deadline fires first; this covers stopping the engines


class Events:
    """What a runner reports while it works (the command prints progress from these)."""

    def started(self, batch: Batch, where: str) -> None:  # pragma: no cover - default: silent
        pass

    def finished(self, outcome: Outcome) -> None:  # pragma: no cover - default: silent
        pass


class Runner(abc.ABC):
    name: str

    @abc.abstractmethod
    def run(self, batches: Sequence[Batch], settings: JobSettings, events: Events) -> list[Outcome]:
        """One outcome per deployment of every batch, whatever happens to the batch."""


def plan_batches(deployments: Sequence[Deployment]) -> list[Batch]:
    """Group deployments that share an engine (connected through shared URLs), in inventory order."""
    groups: list[list[Deployment]] = []
    keys: list[set[str]] = []
    for d in deployments:
        mine = set(d.exclusive_keys())
        hits = [i for i, k in enumerate(keys) if k & mine]
        merged = [d]
        for i in reversed(hits):
            merged = groups.pop(i) + merged
            mine |= keys.pop(i)
        merged.sort(key=lambda x: deployments.index(x))
        groups.append(merged)
        keys.append(mine)
    groups.sort(key=lambda g: deployments.index(g[0]))
    for group in groups:
        places = {d.placement for d in group}
        if len(places) > 1:
            names = ", ".join(d.name for d in group)
            raise FleetError(f"deployments {names} share an engine but are placed on different nodes "
                             f"({', '.join(sorted(p.describe() for p in places))}); give them the same node")
    return [tuple(g) for g in groups]


def batch_deadline_s(batch: Batch) -> float:
    grace = BOOT_GRACE_S if any(d.kind != "attach" for d in batch) else ATTACH_GRACE_S
    return sum(d.timeout_s for d in batch) + grace


def batch_failed(batch: Batch, reason: str, **extra: Any) -> list[Outcome]:
    return [not_measured(d.name, reason, **extra) for d in batch]


def describe(batch: Batch) -> str:
    return ", ".join(d.name for d in batch)
