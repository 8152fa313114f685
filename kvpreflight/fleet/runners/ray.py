"""Run each batch as one Ray task on the node that serves it, at most N in flight.

Placement: `node: NAME` asks for a custom resource NAME (start the Ray node with
`--resources '{"NAME": 1}'`), `node_ip: IP` for Ray's built-in `node:IP` resource. Tasks never
retry (`max_retries=0`); a task whose node dies, that fails, or that runs past its deadline
(then cancelled with force) makes its deployments `inconclusive` with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from kvpreflight._internal.redact import cut
from kvpreflight.fleet.errors import FleetError
from kvpreflight.fleet.job import JobSettings, Outcome, run_batch
from kvpreflight.fleet.runners.interface import Batch, Events, Runner, batch_deadline_s, batch_failed, describe

INSTALL_HINT = "install it with: pip install 'kvpreflight[fleet]' (or pip install 'ray>=2.9')"
RESOURCE_SHARE = 0.001
CONNECT_TIMEOUT_S = 5.0  # a placement marker, not a capacity claim


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise FleetError(f"--ray needs Ray, which is not installed; {INSTALL_HINT}") from None
    return ray


def _task(batch: Batch, settings: JobSettings) -> tuple[Outcome, ...]:
    from dataclasses import replace

    import ray

    node = ray.get_runtime_context().get_node_id()
    return tuple(replace(o, node=node) for o in run_batch(batch, settings))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    end = text.find(" This can happen")  # Ray's NodeDiedError explains at length; keep the facts
    return cut(text[:end] if end > 0 else text, 400)


class RayRunner(Runner):
    name = "ray"

    def __init__(self, address: str, parallel: int | None = None) -> None:
        self.address = address
        self.parallel = parallel

    def resources(self, batch: Batch) -> dict[str, float]:
        placement = batch[0].placement
        if placement.node:
            return {placement.node: RESOURCE_SHARE}
        if placement.node_ip:
            return {f"node:{placement.node_ip}": RESOURCE_SHARE}
        return {}

    def reachable(self) -> None:
        """A plain HOST:PORT that nothing answers: say so now (ray.init would retry for minutes)."""
        import socket

        host, sep, port = self.address.rpartition(":")
        if self.address == "auto" or "://" in self.address or not sep or not port.isdigit():
            return
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise FleetError(f"--ray {self.address}: nothing answers there ({exc.strerror or exc}); give the Ray head's "
                             "GCS address (HOST:6379), ray://HOST:10001, or auto on a machine of the cluster") from None

    def run(self, batches: Sequence[Batch], settings: JobSettings, events: Events) -> list[Outcome]:
        ray = import_ray()
        self.reachable()
        try:
            ray.init(address=self.address, log_to_driver=False, logging_level="ERROR", configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise FleetError(f"--ray {self.address}: cannot connect to a Ray cluster ({_one_line(exc)}); "
                             "give the head's address (host:6379 or ray://host:10001) or start one with `ray start --head`") from None
        try:
            return self._run(ray, batches, settings, events)
        finally:
            ray.shutdown()

    def _run(self, ray: Any, batches: Sequence[Batch], settings: JobSettings, events: Events) -> list[Outcome]:
        available = set(ray.cluster_resources())
        remote = ray.remote(_task)
        parallel = self.parallel or len(batches)
        waiting = list(enumerate(batches))
        running: dict[Any, tuple[int, float]] = {}  # ref -> (batch index, deadline)
        results: dict[int, list[Outcome]] = {}

        def finish(index: int, outcomes: list[Outcome]) -> None:
            results[index] = outcomes
            for outcome in outcomes:
                events.finished(outcome)

        while waiting or running:
            while waiting and len(running) < parallel:
                index, batch = waiting.pop(0)
                need = self.resources(batch)
                missing = [r for r in need if r not in available]
                if missing:
                    finish(index, batch_failed(batch, f"no Ray node offers resource {missing[0]!r} "
                                                      f"(node selector {batch[0].placement.describe()}); nothing ran"))
                    continue
                kind = any(d.kind != "attach" for d in batch)
                ref = remote.options(max_retries=0, retry_exceptions=False, num_cpus=1 if kind else 0.1,
                                     resources=need, name=f"kvpreflight-fleet:{describe(batch)}"[:100]).remote(batch, settings)
                running[ref] = (index, time.monotonic() + batch_deadline_s(batch))
                events.started(batch, batch[0].placement.describe())
            if not running:
                continue
            timeout = max(0.0, min(d for _, d in running.values()) - time.monotonic())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=timeout)
            for ref in ready:
                index, _deadline = running.pop(ref)
                try:
                    finish(index, list(ray.get(ref)))
                except Exception as exc:  # node died, worker crashed, task failed: the reason, never a pass
                    finish(index, batch_failed(batches[index], f"the Ray task failed: {type(exc).__name__}: {_one_line(exc)}",
                                               node=None))
            now = time.monotonic()
            for ref in [r for r, (_, deadline) in running.items() if deadline <= now]:
                index, _deadline = running.pop(ref)
                ray.cancel(ref, force=True)
                batch = batches[index]
                finish(index, batch_failed(batch, f"did not finish within its deadline of {batch_deadline_s(batch):g}s "
                                                  "(timeout_s); the Ray task was cancelled"))
        return [o for i in range(len(batches)) for o in results[i]]
